"""Lazy adapters for the sections other modules own (index_scale, s3_rebuild): import them only when
the section runs, pass the keyword arguments their `run` accepts, and report "not available" (not a
failure) when the module is not in this checkout, so the harness always runs end to end."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from .common import log


def call_run(module: str, **offer: Any) -> dict[str, Any]:
    """`module.run(**the offered kwargs its signature names)`; {"status": "not available"} if absent."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):
            return {"status": "not available", "reason": f"{module} is not in this checkout"}
        raise
    fn = getattr(mod, "run", None)
    if fn is None:
        return {"status": "not available", "reason": f"{module} has no run()"}
    params = inspect.signature(fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kw = {k: v for k, v in offer.items() if takes_any or k in params}
    log.info("%s.run(%s)", module, ", ".join(kw))
    out = fn(**kw)
    if out is None:
        return {"status": "ok"}
    if not isinstance(out, dict):
        out = {"result": out}
    return {"status": "ok", **out}
