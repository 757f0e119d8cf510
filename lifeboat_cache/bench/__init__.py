"""`lifeboat bench`: every performance figure of LifeboatCache, measured in one run on this machine.

One module per section (ceilings, sglang_vs_file, sealing, index_scale via adapters, compression,
retention: hit rate in a full store against SGLang `file` and offline LRU / Belady (traces in retention_traces),
interference: what a backend's threads cost a Python thread in their process (the scheduler's place), s3, mlx,
server: a real SGLang CPU server restarted on each store; serving: SGLang's own load generator on
our multi-turn trace (serving_trace), four servers restarted mid-run (serving_load, report_serving));
`runner` runs them in order and `report` prints the table, writes results.json / results.md and draws the
PNG plots. Every figure is a ratio against something measured in the same run, or an absolute labelled
with the machine. This package is imported only by the `bench` subcommand (torch, SGLang, MLX, moto and
matplotlib load lazily, section by section).
"""

from __future__ import annotations

from .command import add_parser
from .sizes import SECTIONS

__all__ = [
    "SECTIONS", "add_parser",
]
