"""`ray job submit` against a real Ray head on 127.0.0.1, as a cluster user runs horizonrl."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.runtime import LOCAL_RAY_ENV

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def ray_head(tmp_path):
    """A head on loopback only, with the venv first on PATH so jobs find `horizonrl`."""
    gcs, dash = _free_port(), _free_port()
    env = {**os.environ, **LOCAL_RAY_ENV, "PATH": f"{BIN}:{os.environ['PATH']}"}
    env.pop("RAY_ADDRESS", None)
    temp = Path("/tmp") / f"ray-{gcs}"  # Ray's socket paths must stay short
    subprocess.run([str(BIN / "ray"), "start", "--head", "--node-ip-address=127.0.0.1",
                    f"--port={gcs}", "--num-cpus=4", "--dashboard-host=127.0.0.1",
                    f"--dashboard-port={dash}", f"--temp-dir={temp}", "--disable-usage-stats"],
                   env=env, check=True, capture_output=True, timeout=180)
    try:
        yield f"http://127.0.0.1:{dash}", env
    finally:
        subprocess.run([str(BIN / "ray"), "stop", "--force"], env=env, capture_output=True,
                       timeout=120)


def test_job_submit_trains_and_writes_metrics(ray_head, tmp_path):
    address, env = ray_head
    cmd = [str(BIN / "ray"), "job", "submit", "--address", address, "--working-dir", ".",
           "--runtime-env", "deploy/runtime_env.yaml", "--",
           "horizonrl", "train", "--config", "configs/babyai-local.yaml", "name=job",
           "iterations=2", f"run_root={tmp_path}", "metrics.port=0", "checkpoint_every=0",
           f"model.cache_dir={ROOT / '.cache/models'}", "generator.tasks_per_step=2",
           "generator.group_size=4", "env.replicas_per_actor=8"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "succeeded" in out.stdout
    (run_dir,) = tmp_path.iterdir()
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1]
