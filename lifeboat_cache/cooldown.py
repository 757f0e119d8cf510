"""Failure cooldown and quiet logging: the one place for "back off" and "do not flood the log".

Storage trouble must never flood SGLang's log nor make every call wait on a dead tier. Three small
tools, shared by the store, its tiers, the io workers and the SGLang / MLX shims:

* `Cooldown`: skip a failing tier for base, 2*base, 4*base ... up to max_s seconds; reset on success;
  *held* (skipped until released) while a background probe waits for a hung tier;
* `LogOnce`: one line per key, until the key is reset (a new outage logs again);
* `RateLimitedLog`: at most one line per topic per interval.

Core layer: imports nothing of the package. Each takes an injectable clock so tests need no sleeps.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Hashable

log = logging.getLogger(__name__)

Clock = Callable[[], float]


class Cooldown:
    """Skip a failing tier for base, 2*base, 4*base ... up to max_s seconds; reset on success.

    A tier that missed a call's deadline is also *held*: skipped until a background probe gets an
    answer from it, however long it hangs, so no later call blocks on it again.
    """

    def __init__(self, name: str, base_s: float, max_s: float, *, logger: logging.Logger | None = None,
                 clock: Clock = time.monotonic) -> None:
        self.name, self.base_s, self.max_s = name, base_s, max_s
        self._log = logger or log
        self._clock = clock
        self._lock = threading.Lock()
        self._until = 0.0
        self._streak = 0
        self._held = False

    def active(self) -> bool:
        return self._held or self._clock() < self._until

    def hold(self) -> None:
        self._held = True

    def release(self) -> None:
        """The tier answered a probe: end the hold and the cooldown."""
        with self._lock:
            self._held = False
            self._until = 0.0
            self._streak = 0

    def fail(self, what: str, err: BaseException) -> None:
        """A call failed: start the next (doubled) cooldown, logged once; no-op while one runs."""
        with self._lock:
            if self.active():
                return  # already cooling down: one log line per cooldown
            delay = min(self.max_s, self.base_s * (2 ** self._streak))
            self._streak += 1
            self._until = self._clock() + delay
        self._log.warning("lifeboat: %s failed on tier %s (%s); skipping the tier for %.1f s",
                          what, self.name, err, delay)

    def ok(self) -> None:
        """A call succeeded: the next failure starts again from base_s (once the cooldown is over)."""
        if self._streak and not self.active():
            with self._lock:
                self._streak = 0


class LogOnce:
    """One log line per key until `reset(key)`: a repeated failure is logged when it first happens.

    Thread-safe; `key in gate` says whether the key has been logged (and not reset) since.
    """

    def __init__(self, logger: logging.Logger | None = None, level: int = logging.WARNING) -> None:
        self._log = logger or log
        self.level = level
        self._lock = threading.Lock()
        self._seen: set[Hashable] = set()

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._seen

    def first(self, key: Hashable) -> bool:
        """True the first time `key` is seen (and marks it): for callers that do more than log."""
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
            return True

    def log(self, key: Hashable, msg: str, *args: Any, exc_info: Any = False) -> bool:
        """Log `msg % args` at the gate's level if `key` has not been logged yet; True if it was logged."""
        if not self.first(key):
            return False
        self._log.log(self.level, msg, *args, exc_info=exc_info)
        return True

    def reset(self, key: Hashable) -> bool:
        """Forget `key` (the trouble is over: the next occurrence logs again); True if it was logged."""
        with self._lock:
            if key in self._seen:
                self._seen.discard(key)
                return True
            return False


class RateLimitedLog:
    """At most one log line per topic per `interval_s` seconds (the first one always goes out).

    Thread-safe; the clock is injectable (tests), `time.monotonic` by default.
    """

    def __init__(self, interval_s: float, logger: logging.Logger | None = None, level: int = logging.WARNING, *,
                 clock: Clock = time.monotonic) -> None:
        self.interval_s = interval_s
        self._log = logger or log
        self.level = level
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[Hashable, float] = {}

    def ready(self, topic: Hashable = "") -> bool:
        """True (and the interval restarts) when `topic` may log now: for messages costly to build."""
        now = self._clock()
        with self._lock:
            last = self._last.get(topic)
            if last is not None and now - last < self.interval_s:
                return False
            self._last[topic] = now
            return True

    def log(self, topic: Hashable, msg: str, *args: Any, exc_info: Any = False) -> bool:
        """Log `msg % args` unless `topic` logged within the interval; True if it was logged."""
        if not self.ready(topic):
            return False
        self._log.log(self.level, msg, *args, exc_info=exc_info)
        return True
