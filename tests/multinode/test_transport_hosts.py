"""bench/transport_hosts.py runs end to end: both methods across the veth and on one host, and
every row moved every trajectory (each measurement asserts its receiver got them all)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.twohosts import can_run

pytestmark = [pytest.mark.slow, pytest.mark.multinode,
              pytest.mark.skipif(can_run() is not None, reason=str(can_run()))]
ROOT = Path(__file__).resolve().parents[2]


def test_cross_host_rows_beside_same_host_rows(tmp_path):
    out = subprocess.run([sys.executable, "bench/transport_hosts.py", "--trajectories", "24",
                          "--tokens", "2000", "--batch", "8", "--repeats", "1", "--out",
                          str(tmp_path / "t.json")], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = json.loads((tmp_path / "t.json").read_text())["rows"]
    assert [(r["method"], r["path"].split()[0]) for r in rows] == [
        ("raw TCP", "host"), ("raw TCP", "host"), ("gRPC Push stream", "host"),
        ("gRPC Push stream", "host")]
    assert {r["path"] for r in rows} == {"host A (loopback)", "host B -> host A (veth)"}
    assert all(r["trajectories_per_s"] > 0 for r in rows)
    assert [r["vs_same_host"] for r in rows][::2] == [1.0, 1.0]
