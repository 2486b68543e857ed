"""What `pip install` adds to the import namespace: `horizonrl` and nothing else of ours.

The folders stay at the top of the repository (cluster/, actors/, ...) and install as
`horizonrl.cluster`, `horizonrl.actors`, ... (pyproject's package-dir), so no generic name such
as `cluster` or `envpool` (a well-known PyPI package) is taken. Checked from a directory outside
the checkout, where the checkout's folders are not on sys.path.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("cluster", "actors", "learner", "protos", "envpool")

PROBE = """
import importlib.util, json
import horizonrl.cluster.cli, horizonrl.envpool.deepsearch, horizonrl.protos.trajectory_pb2_grpc
print(json.dumps({
    "old": {n: importlib.util.find_spec(n) is not None for n in %r},
    "cli": horizonrl.cluster.cli.__file__,
}))
"""


def test_only_horizonrl_is_importable_outside_the_checkout(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE % (FOLDERS,)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin"})  # no PYTHONPATH from the caller
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["old"] == dict.fromkeys(FOLDERS, False), got["old"]
    assert Path(got["cli"]) == ROOT / "cluster" / "cli.py"  # the folders are the package


def test_console_script_loads_from_the_package() -> None:
    from importlib.metadata import entry_points

    (script,) = entry_points(group="console_scripts", name="horizonrl")
    assert script.module == "horizonrl.cluster.cli"
    from horizonrl.cluster.cli import main

    assert script.load() is main


def test_every_package_folder_is_listed_for_a_wheel() -> None:
    """pyproject lists packages by name (package-dir maps them): a sub-package left out works in
    an editable install and is missing from a built wheel."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {"horizonrl." + ".".join(p.parent.relative_to(ROOT).parts)
             for folder in FOLDERS for p in (ROOT / folder).rglob("__init__.py")}
    assert found == listed, {"not listed": found - listed, "listed, no folder": listed - found}
