"""`lifeboat`: inspect and maintain a store (stats, ls, verify, gc, purge, keygen, bench).

  parser.py     the parser (a description and an example per subcommand) and `main` (exit codes by kind)
  commands.py   stats / verify / gc / keygen
  checked.py    open the store for a command, or fail naming the tier that cannot be reached and why
  errors.py     the kinds of failure and their exit codes (usage, configuration, storage, data)
  activity.py   stats files of serving processes, `ls`
  purge.py      the `purge` subcommand
  env_table.py  every LIFEBOAT_* variable, assembled from each layer's list (docs/operating.md)
"""

from __future__ import annotations

from .parser import main

__all__ = [
    "main",
]
