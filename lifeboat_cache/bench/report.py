"""Turn the results dict into a Markdown table (printed and saved), results.json and PNG plots.

The tables are `report_tables` (and `report_retention`), the plots `report_plots`; this module writes
the three files.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .report_plots import plots
from .report_retention import retention_table
from .report_serving import busy_tier_table, interference_table, serving_tables
from .report_tables import tables

__all__ = ["json_default", "write"]


def write(res: dict[str, Any], out: Path) -> tuple[str, list[Path]]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=json_default))
    sec = res["sections"]
    md = (tables(res).rstrip("\n") + "\n\n" + "\n".join(retention_table(sec.get("retention")))
          + "\n".join(interference_table(sec.get("interference"))) + "\n".join(busy_tier_table(sec.get("busy_tier")))
          + "\n".join(serving_tables(sec.get("serving"))))
    (out / "results.md").write_text(md)
    return md, plots(res, out)


def json_default(o: Any) -> Any:
    """`json.dumps` default for results: paths as text, numpy scalars as numbers, NaN as null."""
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)
