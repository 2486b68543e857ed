"""The figures of docs/reliability.md's fault and fuzzing tables, from the tests that inject the
faults and fuzz the surfaces: run them (pytest on the real local stack) and keep what each one
printed (its ledger, status counts, JVM memory) beside its outcome.

    .venv/bin/python bench/reliability.py --out docs/reliability/results.json

The tests: all of tests/chaos and tests/fuzz (slow ones included) and the SciWorld recycling
test. pytest writes a JUnit XML with each test's captured output (`junit_logging=system-out`);
this script keeps, per test, the outcome, the seconds and the printed lines, and records its
command.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from horizonrl.cluster.ops.provenance import command_line

ROOT = Path(__file__).resolve().parents[1]
TESTS = ["tests/chaos", "tests/fuzz", "tests/integration/test_sciworld_recycling.py"]
"""Every test in these, slow ones included (no marker filter)."""
SECTION = re.compile(r"^-{3,} .+ -{3,}$")
"""pytest's own header lines in the captured output ("---- Captured Out ----")."""


def outcomes(junit: Path) -> dict[str, dict]:
    """`nodeid: {outcome, seconds, output}` from a JUnit XML pytest wrote."""
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        node = f"{module}.py::{case.get('name')}"
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
        out = case.findtext("system-out") or ""
        found[node] = {"outcome": outcome, "seconds": round(float(case.get("time", 0)), 1),
                       "output": [line for line in out.splitlines()
                                  if line.strip() and not SECTION.match(line)]}
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="results JSON")
    args = p.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="horizonrl-reliability-") as tmp:
        junit = Path(tmp) / "junit.xml"
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                *TESTS, f"--junitxml={junit}",
                "-o", "junit_logging=system-out"]
        rc = subprocess.run(argv, cwd=ROOT).returncode
        tests = outcomes(junit) if junit.exists() else {}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(
        {"command": command_line(), "pytest_exit_code": rc,
         "wall_seconds": round(time.perf_counter() - t0, 1), "tests": tests}, indent=1))
    failed = [n for n, t in tests.items() if t["outcome"] in ("failed", "error")]
    print(f"[reliability] {len(tests)} tests, {len(failed)} failed -> {args.out}")
    raise SystemExit(1 if rc or not tests else 0)


if __name__ == "__main__":
    main()
