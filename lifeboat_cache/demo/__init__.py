"""Demo helpers: a real small model prepared offline, and the returning-user demo built on it."""
