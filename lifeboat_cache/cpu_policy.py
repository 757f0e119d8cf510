"""The Linux scheduling policy of the store's own threads (`engine.io_scheduling`).

Why: SGLang's scheduler shares its process, and on a small host its cores, with our io and copy
threads. Under Linux's default policy a thread that wakes may preempt the one running, so a put's io
tasks waking together take the scheduler's core in the middle of a step. Under `SCHED_BATCH` they
keep their share of the CPU but never preempt on wakeup; under `SCHED_IDLE` they run only on CPU time
nothing else wants (backups may then wait long on a saturated host, and an io thread holding the GIL
waits behind every other thread). Measured in docs/perf/serving.md; RocksDB lowers its compaction
pool's CPU priority for the same reason (`Env::LowerThreadPoolCPUPriority`).

A thread sets its own policy when it starts (Linux keeps the policy per thread; a new thread takes
its creator's). `normal` leaves a thread as it was created. Elsewhere (macOS) every policy is
`normal`. A thread may always move to `SCHED_BATCH` or `SCHED_IDLE` without privileges; a kernel or
sandbox that refuses it leaves the thread as it was, logged once per pool.
"""

from __future__ import annotations

import os

from .cooldown import LogOnce

POLICIES = ("batch", "normal", "idle")
DEFAULT_POLICY = "batch"
_LINUX = {"batch": getattr(os, "SCHED_BATCH", None), "idle": getattr(os, "SCHED_IDLE", None)}  # None: leave as is


def apply_to_this_thread(policy: str, refusals: LogOnce) -> None:
    """Put the calling thread under `policy` (one of POLICIES); a refusal is logged once through `refusals`
    (the caller's gate, so one line per pool, not per thread)."""
    if policy not in POLICIES:
        raise ValueError(f"io scheduling policy {policy!r}: use one of {', '.join(POLICIES)}")
    linux = _LINUX.get(policy)
    if linux is None or not hasattr(os, "sched_setscheduler"):
        return
    try:
        os.sched_setscheduler(0, linux, os.sched_param(0))  # pid 0: the calling thread
    except OSError as e:
        refusals.log("cpu_policy", "lifeboat: cannot move io threads to SCHED_%s (%s); they run under the "
                     "default policy", policy.upper(), e)
