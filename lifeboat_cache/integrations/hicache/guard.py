"""The never-raise guard of the SGLang HiCache backend: an unexpected error or bad call does nothing.

SGLang calls the backend on its own threads, and an exception there can stop the scheduler. So every
public method of `LifeboatHiCacheStorage` is wrapped by `guarded(fallback)`: on any exception the
backend counts and logs it (its `_failed`, with a cooldown) and returns the fallback's answer, which is
"nothing done" in the shape SGLang expects (no pages, no transfers, False, None). A closed backend
(`_closed`) answers the same without calling the method. The wrapped object provides `_closed` and
`_failed(what, err)`. Used by `sglang_backend`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from sglang.srt.mem_cache.hicache_storage import PoolTransfer

from .checks import count


def guarded(fallback: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Never raise into SGLang: bad arguments or an unexpected error return `fallback(*args)`
    ("nothing done"). A fallback is written not to raise; if the arguments are so broken that it
    does, `fallback()` (no arguments: the empty answer) is returned instead."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        def nothing_done(args: tuple, kwargs: dict) -> Any:
            for a, k in ((args, kwargs), (args[:1], {})):  # e.g. keyword arguments SGLang's signature lacks
                try:
                    return fallback(*a, **k)
                except Exception:
                    continue
            return fallback()

        @functools.wraps(fn)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                if self._closed:
                    return nothing_done(args, kwargs)
                return fn(self, *args, **kwargs)
            except Exception as e:
                self._failed(fn.__name__, e)
                return nothing_done(args, kwargs)
        return wrapper
    return deco


def no_pages(keys: Any = None, *_: Any, **__: Any) -> list[bool]:
    return [False] * count(keys)


def no_transfers(transfers: Any = None, *_: Any, **__: Any) -> dict[str, list[bool]]:
    out: dict[str, list[bool]] = {}
    for t in transfers if isinstance(transfers, (list, tuple)) else ():
        if isinstance(t, PoolTransfer):
            try:
                out[t.name] = [False] * count(t.keys)
            except TypeError:  # an unhashable name
                continue
    return out
