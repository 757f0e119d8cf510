"""Namespace names kept in the store itself, so `lifeboat ls` and `purge --model` find pages written
through the Python API.

A namespace fingerprint is a hash: only what made it says whose pages it holds. A serving shim names
its namespaces in its stats file; a plain Python process writes none. So the first time this process
writes under a `records.Namespace` (what `namespace_fingerprint` returns: the 16 bytes plus the parts
it was made of), its labels go into every tier that keeps marks (`nsname-<hex>`: a file per directory,
an object under the S3 prefix). The write runs on its own thread, never in the caller's `put`, and a
failure is logged, never raised: a name is for operators, not for serving.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Sequence

from ..metrics import Counters
from ..records import Namespace
from ..tiers import Marking, Tier

log = logging.getLogger(__name__)

PREFIX = "nsname-"
MAX_BYTES = 4096  # a mark longer than this is not one of ours


class NamespaceNames:
    """Names each Namespace this store writes under once: in the counters (stats) and as tier marks."""

    def __init__(self, tiers: Sequence[Tier], counters: Counters) -> None:
        self.tiers, self.counters = tiers, counters
        self._done: set[bytes] = set()
        self._lock = threading.Lock()
        self._writers: list[threading.Thread] = []

    def note(self, ns: bytes) -> None:
        """Called by put: a Namespace not named yet gets its labels written (in the background)."""
        if not isinstance(ns, Namespace) or ns in self._done or not ns.labels:
            return
        with self._lock:
            if ns in self._done:
                return
            self._done.add(bytes(ns))
            self._writers = [t for t in self._writers if t.is_alive()]
        self.counters.name_namespace(ns, keep_existing=True, **ns.labels)
        data = json.dumps(ns.labels, sort_keys=True).encode()[:MAX_BYTES]
        t = threading.Thread(target=self._write, args=(f"{PREFIX}{ns.hex()}", data), daemon=True,
                             name="lifeboat-nsname")
        self._writers.append(t)
        t.start()

    def _write(self, name: str, data: bytes) -> None:
        for tier in self.tiers:
            if not isinstance(tier, Marking):
                continue
            try:
                tier.write_mark(name, data)
            except Exception as e:  # noqa: BLE001  (a thread of its own: nothing above it to raise to)
                log.warning("lifeboat: %s: cannot write the namespace name %s (%s); `lifeboat ls` will show "
                            "model '?' for it", tier.name, name, e)

    def join(self, timeout: float) -> None:
        """At close: the names still being written get `timeout` seconds in all."""
        for t in list(self._writers):
            t.join(timeout)


def read_names(tiers: Sequence[Tier]) -> dict[str, dict[str, str]]:
    """hex namespace -> labels, from every tier's `nsname-` marks (a tier that cannot be listed is
    skipped with a warning; a mark that is not a JSON object of strings is ignored)."""
    out: dict[str, dict[str, str]] = {}
    for tier in tiers:
        if not isinstance(tier, Marking):
            continue
        try:
            marks = tier.read_marks(PREFIX, MAX_BYTES)
        except OSError as e:
            log.warning("lifeboat: %s: cannot list its namespace names (%s)", tier.name, e)
            continue
        for name, data in marks.items():
            ns = name[len(PREFIX):]
            try:
                labels = json.loads(data)
            except ValueError:
                continue
            if len(ns) == 32 and isinstance(labels, dict) and all(isinstance(v, str) for v in labels.values()):
                out.setdefault(ns, labels)
    return out
