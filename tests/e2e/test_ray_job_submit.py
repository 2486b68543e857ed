"""`ray job submit` against a real Ray head on 127.0.0.1, as a cluster user runs horizonrl."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from conftest import SUITE_MODEL

from horizonrl.cluster.ops.runtime import LOCAL_RAY_ENV

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent



@pytest.fixture()
def ray_head(free_port):
    """A head on loopback only, with the venv first on PATH so jobs find `horizonrl`.

    `ray start --block` in its own session, stopped by killing that session: `ray stop` would
    stop every Ray instance on the machine, other runs' included.
    """
    gcs, dash, agent, metrics, client = (free_port() for _ in range(5))
    env = {**os.environ, **LOCAL_RAY_ENV, "PATH": f"{BIN}:{os.environ['PATH']}"}
    env.pop("RAY_ADDRESS", None)
    temp = Path("/tmp") / f"ray-{gcs}"  # Ray's socket paths must stay short
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
         f"--port={gcs}", "--num-cpus=4", "--dashboard-host=127.0.0.1",
         f"--dashboard-port={dash}", f"--temp-dir={temp}", "--disable-usage-stats",
         # Fixed defaults (agent 52365, client 10001) clash with any other Ray on the machine.
         f"--dashboard-agent-listen-port={agent}", f"--metrics-export-port={metrics}",
         f"--ray-client-server-port={client}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # until the job API answers
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{dash}/api/jobs/", timeout=5)
                break
            except OSError:
                assert head.poll() is None, "ray start exited"
                time.sleep(1)
        else:
            pytest.fail("the Ray head's job API did not come up within 180 s")
        yield f"http://127.0.0.1:{dash}", env
    finally:
        procs = [psutil.Process(head.pid), *psutil.Process(head.pid).children(recursive=True)]
        os.killpg(head.pid, signal.SIGTERM)
        # A few seconds for a clean exit (the GCS and raylet take one); what ignores SIGTERM
        # (it cost 30 s here) is killed.
        _, alive = psutil.wait_procs(procs, timeout=5)
        for p in alive:
            p.kill()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow  # a Ray head of its own, its job agent and a whole run (~40-50 s)
def test_job_submit_trains_and_writes_metrics(ray_head, tmp_path):
    address, env = ray_head
    cmd = [str(BIN / "ray"), "job", "submit", "--address", address, "--working-dir", ".",
           "--runtime-env", "deploy/runtime_env.yaml", "--",
           "horizonrl", "train", "--config", "configs/babyai-local.yaml", *SUITE_MODEL, "name=job",
           "iterations=2", f"run_root={tmp_path}", "metrics.port=0", "checkpoint_every=0",
           f"model.cache_dir={ROOT / '.cache/models'}", "generator.tasks_per_step=2",
           "generator.group_size=4", "env.replicas_per_actor=8"]
    # The head's job agent can lag its HTTP API by several seconds, and on a loaded machine the
    # client's version check can time out before anything is submitted: both are retried
    # (neither submitted a job, so a retry cannot start a second one).
    transient = ("No available agent", "Failed to connect to Ray at address")
    for _ in range(12):
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=900)
        if not any(t in out.stdout + out.stderr for t in transient):
            break
        time.sleep(5)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "succeeded" in out.stdout
    (run_dir,) = tmp_path.iterdir()
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1]
