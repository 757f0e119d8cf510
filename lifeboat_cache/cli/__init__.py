"""`lifeboat`: inspect and maintain a store (stats, ls, verify, gc, purge, keygen, bench).

  commands.py   the parser and stats / verify / gc / keygen; `main`
  activity.py   stats files of serving processes, `ls`
  purge.py      the `purge` subcommand
  env_table.py  every LIFEBOAT_* variable, assembled from each layer's list (docs/operating.md)
"""

from __future__ import annotations

from .commands import main

__all__ = [
    "main",
]
