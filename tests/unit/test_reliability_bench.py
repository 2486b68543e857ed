"""bench/reliability.py keeps what each test printed beside its outcome, from pytest's own
JUnit XML (a real pytest run on a small test file)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench import reliability


def test_outcomes_keep_each_tests_printed_lines(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "def test_ok():\n    print('ledger: {\"generated\": 48}')\n"
        "def test_bad():\n    print('before the fault')\n    assert False\n"
        "@pytest.mark.skip(reason='no device')\ndef test_skipped():\n    pass\n")
    junit = tmp_path / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "test_x.py", f"--junitxml={junit}", "-o", "junit_logging=system-out",
                    "-o", "pythonpath=", "-o", "testpaths="], cwd=tmp_path,
                   capture_output=True, timeout=120)
    got = reliability.outcomes(junit)
    assert {n.split("::")[1]: t["outcome"] for n, t in got.items()} == \
        {"test_ok": "passed", "test_bad": "failed", "test_skipped": "skipped"}
    ok = next(t for n, t in got.items() if n.endswith("::test_ok"))
    assert ok["output"] == ['ledger: {"generated": 48}'] and ok["seconds"] >= 0
    bad = next(t for n, t in got.items() if n.endswith("::test_bad"))
    assert bad["output"] == ["before the fault"]
