"""The command line a results file records, so that `make figures` can run it again.

Every benchmark under bench/ writes the command that produced its results file beside the
numbers. Joining argv with spaces loses quoting (`'curriculum.env_weights={a: [1, 2]}'` comes
back as five arguments), so the command is shell-quoted here, once, for every script.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The checkout: script paths are recorded relative to it (`bench/x.py`)."""
CLI = "horizonrl"
"""How the CLI is recorded, whether it ran as the console script or `-m horizonrl.cluster.cli`."""


def command_line(argv: list[str] | None = None, *, python: str = "python") -> str:
    """`python bench/x.py ARGS...` for this process (or `argv`), shell-quoted so that
    `shlex.split` gives back exactly the arguments the script was run with; `horizonrl ARGS...`
    for the CLI."""
    script, *args = sys.argv if argv is None else argv
    path = Path(script).resolve()
    if Path(script).name == CLI or path == ROOT / "cluster" / "cli.py":
        return shlex.join([CLI, *args])
    try:
        shown = str(path.relative_to(ROOT))
    except ValueError:  # a script outside the checkout: keep the path it was run by
        shown = script
    return shlex.join([python, shown, *args])
