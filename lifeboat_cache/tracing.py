"""Call tracing as a wrapper: one log line per call, installed on an object instead of a flag it checks.

`engine.trace: true` (lifeboat.yaml or SGLang's extra-config) turns it on. The store and the SGLang
backend never test a trace flag on their I/O paths: when tracing is on, the object's methods are
replaced *on that instance* by timed wrappers that log, after each call, what went in (keys, bytes)
and what came out. Off, nothing is installed and nothing is paid.

* `trace_store(store)`: `put` / `get_into` / `count_leading_hits` of a ChunkStore (or anything with
  the same signatures);
* `trace_calls(obj, table)`: any methods, each with a function that turns (args, kwargs, result) into
  the line's parts (the SGLang backend's `_TRACE_LINES`).

Core layer: imports nothing of the package. A trace line never raises: a describer that fails is
logged at debug level and the call's result is returned untouched.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

log = logging.getLogger(__name__)

PREFIX = "lifeboat trace:"
TRACE_LEVEL = logging.INFO  # `engine.trace: true` shows at the usual INFO level (as it always did)

#: (args, kwargs, result) -> the lines of one call: (what, keys, outcome), e.g. ("batch_get_v1", 128, "128")
Describer = Callable[[tuple, dict, Any], Iterable[tuple[str, int, str]]]


def nbytes(buf: object) -> int:
    """Bytes of one page: a buffer-protocol object, or a list/tuple of them (scatter-gather); -1 if unknown."""
    try:
        if isinstance(buf, (list, tuple)):
            return sum(nbytes(b) for b in buf)
        n = getattr(buf, "nbytes", None)
        return int(n) if n is not None else memoryview(buf).nbytes  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - a trace never raises
        return -1


def _arg(args: tuple, kwargs: dict, i: int, name: str, default: Any = None) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def _wrap(fn: Callable[..., Any], describe: Describer, logger: logging.Logger, level: int) -> Callable[..., Any]:
    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        result = fn(*args, **kwargs)
        ms = (time.perf_counter() - t0) * 1e3
        try:
            for what, n, outcome in describe(args, kwargs, result):
                logger.log(level, "%s %s %d keys -> %s in %.2f ms", PREFIX, what, n, outcome, ms)
        except Exception:  # noqa: BLE001 - a trace never raises into the caller
            logger.debug("lifeboat: cannot trace %s", getattr(fn, "__name__", fn), exc_info=True)
        return result

    traced.__lifeboat_traced__ = True  # type: ignore[attr-defined]
    return traced


def trace_calls(obj: Any, table: Mapping[str, Describer], logger: logging.Logger | None = None,
                level: int = TRACE_LEVEL) -> Any:
    """Replace each method named in `table` on the instance `obj` by a timed, logging wrapper; returns obj.

    Idempotent (a method already traced is left alone). Raises AttributeError for a name `obj` lacks,
    so a table cannot silently drift from the class it traces.
    """
    for name, describe in table.items():
        fn = getattr(obj, name)
        if getattr(fn, "__lifeboat_traced__", False):
            continue
        setattr(obj, name, _wrap(fn, describe, logger or log, level))
    return obj


def _ns(args: tuple, kwargs: dict) -> str:
    ns = _arg(args, kwargs, 0, "ns", b"")
    return bytes(ns[:4]).hex() if isinstance(ns, (bytes, bytearray, memoryview)) else "?"


def _pages(what: str) -> Describer:
    def describe(args: tuple, kwargs: dict, result: Sequence[bool]) -> Iterable[tuple[str, int, str]]:
        keys = _arg(args, kwargs, 1, "keys", ())
        size = sum(nbytes(b) for b in _arg(args, kwargs, 2, "buffers", ()))
        yield f"{what} ns={_ns(args, kwargs)} ({size} bytes)", len(keys), f"{sum(map(bool, result))} ok"
    return describe


def _leading(args: tuple, kwargs: dict, result: int) -> Iterable[tuple[str, int, str]]:
    keys = _arg(args, kwargs, 1, "keys", ())
    yield f"exists ns={_ns(args, kwargs)}", len(keys), f"{result} leading hits"


#: What `trace_store` wraps: ChunkStore's data-path methods.
STORE_TRACE_LINES: dict[str, Describer] = {
    "put": _pages("put"),
    "get_into": _pages("get"),
    "count_leading_hits": _leading,
}


def trace_store(store: Any, logger: logging.Logger | None = None, level: int = TRACE_LEVEL) -> Any:
    """Trace a store's put / get_into / count_leading_hits (one line per call: namespace, keys, bytes,
    outcome, time); results are returned unchanged. Returns the same store object."""
    return trace_calls(store, STORE_TRACE_LINES, logger, level)
