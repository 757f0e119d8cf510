"""The MLX runtime's environment variables (index wait of a launch, OpenBLAS preload) and their parsers.

`LIFEBOAT_MLX_REBUILD_WAIT_S` is read by the MLX launch (`integrations/radix_cache/factory.py`),
`LIFEBOAT_BLAS_PRELOAD` by the MLX child processes' environment (`demo/mlx_serving.child_env`, used by
the demo, bench and tests); both re-export these names. They live with the MLX runtime, not in the
core's `config/env.py`, which only supplies `Variable` and ConfigError's wording: every error starts with
the variable's name and says what to set instead.

Runtimes layer: imports only core modules (`config`); nothing here imports MLX.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from ...config import ConfigError, Env, Variable

ENV_REBUILD_WAIT = "LIFEBOAT_MLX_REBUILD_WAIT_S"
ENV_BLAS_PRELOAD = "LIFEBOAT_BLAS_PRELOAD"

DEFAULT_REBUILD_WAIT_S = 10.0
DEFAULT_BLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"


def parse_rebuild_wait(env: Any) -> float:
    """`LIFEBOAT_MLX_REBUILD_WAIT_S`: seconds the launch waits for the store's index (0 .. 3600).

    Raises ConfigError naming the variable and the allowed values when it is not such a number.
    """
    raw = (env.get(ENV_REBUILD_WAIT) or "").strip()
    if not raw:
        return DEFAULT_REBUILD_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 3600.0:
        raise ConfigError(f"{ENV_REBUILD_WAIT}={raw!r} is invalid: allowed values are seconds from 0 to 3600 "
                          f"(default {DEFAULT_REBUILD_WAIT_S:.0f}), e.g. {ENV_REBUILD_WAIT}=30")
    return value


def parse_blas_preload(env: Env) -> Optional[str]:
    """`LIFEBOAT_BLAS_PRELOAD`: the OpenBLAS library MLX child processes preload on Linux; None when unset.

    Raises ConfigError when it names a file that does not exist."""
    given = env.get(ENV_BLAS_PRELOAD)
    if given and not os.path.isfile(given):
        raise ConfigError(f"{ENV_BLAS_PRELOAD}={given!r}: no such file; point it at an OpenBLAS "
                          f"libblas.so.3 (e.g. {DEFAULT_BLAS}) or unset it")
    return given or None


#: The MLX runtime's variables (the full table, every layer's, is `cli.env_table.VARIABLES`).
MLX_VARIABLES: tuple[Variable, ...] = (
    Variable(ENV_REBUILD_WAIT, f"{DEFAULT_REBUILD_WAIT_S:.0f}",
             "seconds an MLX launch waits for the store's index (0 to 3600)", parse_rebuild_wait),
    Variable(ENV_BLAS_PRELOAD, DEFAULT_BLAS + " when present",
             "OpenBLAS preloaded into MLX child processes (demo, bench, tests) on Linux", parse_blas_preload),
)
