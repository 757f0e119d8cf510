"""Fault suite plumbing: prints the suite's figures at the end of the run (see harness.Figures)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from harness import FIGURES, STRESS  # noqa: E402


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    if not FIGURES.trials and not FIGURES.faults:
        return
    terminalreporter.write_sep("=", f"lifeboat fault suite ({'long' if STRESS else 'fast'} variant)")
    terminalreporter.write_line(FIGURES.line())
    for n in FIGURES.notes:
        terminalreporter.write_line(f"  {n}")
    out = os.environ.get("LIFEBOAT_FIGURES_OUT")
    if out:
        Path(out).write_text(json.dumps({k: v for k, v in FIGURES.__dict__.items()}, indent=2) + "\n")
