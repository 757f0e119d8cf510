"""cooldown.py (Cooldown, LogOnce, RateLimitedLog) with an injected clock."""

from __future__ import annotations

import logging
import threading

import pytest

from lifeboat_cache.cooldown import Cooldown, LogOnce, RateLimitedLog

LOGGER = "lifeboat_cache.test_cooldown"


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


# ------------------------------------------------------------------ Cooldown


def test_cooldown_doubles_up_to_the_cap_and_logs_once_per_cooldown(caplog) -> None:
    clock = Clock()
    cd = Cooldown("t (read)", 1.0, 4.0, logger=logging.getLogger(LOGGER), clock=clock)
    assert not cd.active()
    delays = []
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(5):
            start = clock.t
            cd.fail("get", OSError("EIO"))
            cd.fail("get", OSError("EIO again"))  # while cooling down: no new cooldown, no line
            assert cd.active()
            while cd.active():
                clock.t += 0.25
            delays.append(clock.t - start)
    assert delays == [1.0, 2.0, 4.0, 4.0, 4.0]
    lines = _lines(caplog)
    assert len(lines) == 5, lines
    assert "get failed on tier t (read) (EIO); skipping the tier for 1.0 s" in lines[0]
    assert lines[-1].endswith("for 4.0 s")


def test_cooldown_ok_resets_the_streak_only_once_it_is_over() -> None:
    clock = Clock()
    cd = Cooldown("t", 1.0, 60.0, clock=clock)
    cd.fail("put", OSError())
    clock.t += 0.5
    cd.ok()  # still cooling down: the streak stays
    clock.t += 0.5
    cd.fail("put", OSError())
    clock.t += 1.99
    assert cd.active()  # the streak survived the early ok(): this cooldown is 2 s
    clock.t += 0.01
    assert not cd.active()
    cd.ok()  # over: the next failure starts from base again
    cd.fail("put", OSError())
    clock.t += 1.0
    assert not cd.active()


def test_cooldown_hold_and_release() -> None:
    clock = Clock()
    cd = Cooldown("t", 1.0, 8.0, clock=clock)
    cd.hold()
    clock.t += 1e6
    assert cd.active()  # held: skipped however long, until a probe answers
    cd.fail("get", OSError())  # no cooldown started on top of the hold
    cd.release()
    assert not cd.active()
    cd.fail("get", OSError())
    clock.t += 1.0
    assert not cd.active()  # release reset the streak: base again


# ------------------------------------------------------------------ LogOnce
def test_log_once_per_key_until_reset(caplog) -> None:
    gate = LogOnce(logging.getLogger(LOGGER))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert gate.log("a", "first %s", 1) is True
        assert gate.log("a", "first %s", 2) is False
        assert gate.log("b", "other") is True
        assert "a" in gate and "c" not in gate
        assert gate.reset("a") is True and gate.reset("a") is False and gate.reset("never") is False
        assert gate.log("a", "again") is True
    assert _lines(caplog) == ["first 1", "other", "again"]
    assert {r.levelno for r in caplog.records if r.name == LOGGER} == {logging.WARNING}


def test_log_once_level_and_first() -> None:
    gate = LogOnce(logging.getLogger(LOGGER), level=logging.DEBUG)
    assert gate.first("k") and not gate.first("k")
    assert gate.log("k", "not logged") is False


def test_log_once_from_many_threads_logs_once(caplog) -> None:
    gate = LogOnce(logging.getLogger(LOGGER))
    start = threading.Barrier(8)

    def run() -> None:
        start.wait()
        for _ in range(200):
            gate.log("same", "once")

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        threads = [threading.Thread(target=run) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert _lines(caplog) == ["once"]


# ------------------------------------------------------------------ RateLimitedLog
def test_rate_limited_log_one_line_per_interval_per_topic(caplog) -> None:
    clock = Clock()
    gate = RateLimitedLog(30.0, logging.getLogger(LOGGER), clock=clock)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert gate.log("extend", "e%d", 1)  # the first line always goes out
        clock.t += 29.9
        assert not gate.log("extend", "e%d", 2)
        assert gate.log("capture", "c%d", 1)  # topics are independent
        clock.t += 0.1
        assert gate.log("extend", "e%d", 3)  # 30 s after the last line
        clock.t += 10
        assert not gate.log("extend", "e%d", 4)
        assert not gate.ready("capture")
        clock.t += 20
        assert gate.ready("capture") and not gate.ready("capture")  # ready() restarts the interval
    assert _lines(caplog) == ["e1", "c1", "e3"]


def test_rate_limited_log_passes_exc_info(caplog) -> None:
    gate = RateLimitedLog(1.0, logging.getLogger(LOGGER), clock=Clock())
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        try:
            raise ValueError("boom")
        except ValueError:
            gate.log("", "failed", exc_info=True)
    (rec,) = [r for r in caplog.records if r.name == LOGGER]
    assert rec.exc_info and rec.exc_info[0] is ValueError
