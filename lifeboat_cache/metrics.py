"""Counters with one lock, and their Prometheus text exposition."""

from __future__ import annotations

import threading
from typing import Mapping


class Counters:
    """Named monotonically increasing counters (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, int] = {}

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._values[name] = self._values.get(name, 0) + n

    def get(self, name: str) -> int:
        with self._lock:
            return self._values.get(name, 0)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)


def prometheus_text(values: Mapping[str, float], prefix: str = "lifeboat_") -> str:
    """Render flat numeric values as Prometheus text format (counters end in _total)."""
    lines = []
    for name in sorted(values):
        v = values[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        metric = prefix + name.replace(".", "_").replace("-", "_")
        lines.append(f"{metric} {v}")
    return "\n".join(lines) + "\n"
