"""What a bench run with `--out OUT` leaves: OUT/results.json (its command, its wall time and its
figures) and OUT/results.md (its command and its table), for the benches that write both."""

from __future__ import annotations

import json
import time
from pathlib import Path

from horizonrl.cluster.ops.provenance import command_line


def run_folders(root: Path, name: str, out: str | None) -> tuple[Path, Path]:
    """(runs, out): a fresh root/runs/<name>__<time>/ for the bench's runs, and the folder its
    results go to (`out`, default the runs' folder), both created."""
    runs = root / "runs" / f"{name}__{time.strftime('%Y%m%d-%H%M%S')}"
    runs.mkdir(parents=True)
    dest = Path(out) if out else runs
    dest.mkdir(parents=True, exist_ok=True)
    return runs, dest


def write_results(out: Path, fields: dict, table: str, *, started: float) -> None:
    """OUT/results.json (the command, the wall time since `started`, `fields`) and
    OUT/results.md (the command and `table`)."""
    command = command_line()
    (out / "results.json").write_text(json.dumps(
        {"command": command, "wall_seconds": round(time.perf_counter() - started, 1), **fields},
        indent=1))
    (out / "results.md").write_text(f"`{command}`\n\n{table}\n")
