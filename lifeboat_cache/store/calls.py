"""The store's io calls under a deadline: tasks on the io pool, late pages counted, hung tiers held.

Every put and get_into runs its io tasks through `IoCalls.until`: the one place that waits for them
until the call's deadline (`engine.deadline_s`), counts what was not done by then (a dropped write or
a miss, per page), cools down the tier it waited on and, when that tier hangs, holds it until a
background probe gets an answer from it (`hold`). Storage trouble is caught inside the tasks; an
exception that reaches here is a bug and is raised.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import numpy as np

from ..cooldown import Cooldown
from ..metrics import Counters
from ..tiers import Probing, Tier
from .gc_pauses import process_pauses
from .io_workers import Gate, IoWorkers, TaskArena

log = logging.getLogger(__name__)

IO_THREADS_PER_WORKER = 4  # the io pool grows to io_workers * this while tiers hang, no further
DEADLINE_GRACE_S = 1.0  # after the deadline, wait at most this long for pages mid-copy into buffers
PROBE_INTERVAL_S = 0.25  # a held (hung) tier is probed this often, from one background thread


def chunks(items: list[int], n: int) -> list[list[int]]:
    """items in at most n contiguous runs of near-equal length (none empty)."""
    k = min(n, len(items))
    if k <= 0:
        return []
    q, r = divmod(len(items), k)
    bounds = [c * q + min(c, r) for c in range(k + 1)]
    return [items[bounds[c]:bounds[c + 1]] for c in range(k)]


class IoCalls:
    """The io pool and task arena of one store, the deadline of its calls, and the hold / probe of
    tiers that missed it. `tiers` and the cooldowns are the store's (held and released here)."""

    def __init__(self, tiers: list[Tier], read_cooldowns: list[Cooldown],
                 write_cooldowns: list[Cooldown], counters: Counters, *, io_workers: int,
                 deadline_s: float, policy: str = "normal") -> None:
        self.tiers = tiers  # the store's own list, not a copy: a tier swapped in there is used here too
        self.read_cooldowns = read_cooldowns
        self.write_cooldowns = write_cooldowns
        self.counters = counters
        self.deadline_s = deadline_s
        self.gc_pauses = process_pauses()  # a call's deadline does not run on through a GC pause
        self.pool = IoWorkers(io_workers, max_workers=io_workers * IO_THREADS_PER_WORKER, counters=counters,
                              stuck_s=deadline_s, policy=policy, clock=self.gc_pauses.clock)
        self.arena = TaskArena()  # per io task: sealed records being written, records read privately
        self.closed = False
        self._probes: dict[int, int | None] = {}  # held tier level -> a key to probe it with
        self._prober: threading.Thread | None = None
        self._probe_lock = threading.Lock()

    def t_end(self) -> float:
        """The deadline of a call that starts now, on a clock that stands still during GC pauses."""
        return self.gc_pauses.clock() + self.deadline_s

    def until(self, fn: Callable[[int], Any], items: list[int], t_end: float, gate: Gate,
              cd: Cooldown | None, what: str, where: list[int] | None = None,
              pages: Callable[[int], int] | None = None, ikeys: np.ndarray | None = None) -> list[Any]:
        """fn over items on the io pool, returning by t_end (the call's deadline): fn's results, False
        for an item not done by then (a miss / dropped write: counted, and its tier cools down).
        `pages(item)`: how many pages an item stands for (a run), for the counts. `where[item]`: the
        tier level a late read waits on (-1: none yet); `ikeys[item]`: a key to probe that tier with."""
        if not items:
            return []
        if self.closed:
            return [fn(i) for i in items]
        futs, late = self.pool.run_until(fn, items, t_end, gate, min(DEADLINE_GRACE_S, self.deadline_s))
        out: list[Any] = []
        for f in futs:
            if not f.done() or f.cancelled():
                out.append(False)
                continue
            err = f.exception()
            if err is not None:
                raise err  # a bug, not storage trouble (that is caught inside fn)
            out.append(f.result())
        if late:
            self._overdue(what, [items[k] for k in late], cd, where, pages, ikeys)
        return out

    def _overdue(self, what: str, late: list[int], cd: Cooldown | None, where: list[int] | None,
                 pages: Callable[[int], int] | None = None, ikeys: np.ndarray | None = None) -> None:
        """Pages not done by the deadline: count them and cool down the tier they wait on."""
        err = TimeoutError(f"no answer within the {self.deadline_s:g} s deadline (engine.deadline_s)")
        if what == "write":
            self.counters.add("writes_dropped_deadline", sum(map(pages, late)) if pages else len(late))
            if cd is not None:
                cd.fail("write", err)
            self.hold(0, None)
            return
        self.counters.add("read_deadline_misses", sum(map(pages, late)) if pages else len(late))
        levels: dict[int, int] = {}
        for i in late:
            if where is not None and where[i] >= 0:
                levels.setdefault(where[i], i)
        for level, i in levels.items():
            self.read_cooldowns[level].fail("read", err)
            self.hold(level, int(ikeys[i]) if ikeys is not None else None)

    def hold(self, level: int, ikey: int | None) -> None:
        """Skip a tier that missed a deadline until a background probe gets an answer from it."""
        tier = self.tiers[level]
        if not isinstance(tier, Probing) and ikey is None:
            return  # nothing to probe it with: the plain cooldown decides
        with self._probe_lock:
            if self.closed:
                return
            self._probes.setdefault(level, ikey)
            self.read_cooldowns[level].hold()
            self.write_cooldowns[level].hold()
            if self._prober is None or not self._prober.is_alive():
                self._prober = threading.Thread(target=self._probe_loop, name="lifeboat-probe", daemon=True)
                self._prober.start()

    def _probe_loop(self) -> None:
        while not self.closed:
            with self._probe_lock:
                todo = list(self._probes.items())
            if not todo:
                with self._probe_lock:
                    if not self._probes:
                        self._prober = None
                        return
            for level, ikey in todo:
                if self._probe(level, ikey):
                    with self._probe_lock:
                        self._probes.pop(level, None)
                    self.read_cooldowns[level].release()
                    self.write_cooldowns[level].release()
                    self.counters.add("tier_recovered")
                    log.warning("lifeboat: tier %s answers again", self.tiers[level].name)
            time.sleep(PROBE_INTERVAL_S)

    def _probe(self, level: int, ikey: int | None) -> bool:
        """One request to a held tier (it may block: this thread only). True when it answered."""
        tier = self.tiers[level]
        try:
            if isinstance(tier, Probing):
                tier.probe()
                return True
            ref = tier.locate(ikey) if ikey is not None else None
            if ref is not None:
                tier.read_into(ref, [memoryview(bytearray(ref.length))])
            return True
        except OSError:
            return False
        except Exception:  # a bug must not keep the tier held for good
            log.exception("lifeboat: probing %s failed", tier.name)
            return True

    def close(self) -> None:
        """No new probes; the io threads stop (those not stuck are joined, up to the deadline + grace)."""
        self.closed = True
        self.pool.shutdown(wait=True, timeout=self.deadline_s + DEADLINE_GRACE_S)
