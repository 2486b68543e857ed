"""Kill the whole training process tree after a horizon change; `--resume auto` continues
the step count, policy_version and curriculum exactly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _cmd(run_root: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "cluster.cli", "train", "--config", "configs/babyai-local.yaml",
            "name=resume", "iterations=6", f"run_root={run_root}", "checkpoint_every=2",
            "generator.tasks_per_step=2", "generator.group_size=2", "env.replicas_per_actor=4",
            "curriculum.horizons=[2, 3]", "curriculum.boundaries=[2]", *extra]


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the driver and everything it started (local Ray included), like a lost node."""
    parent = psutil.Process(proc.pid)
    procs = [parent, *parent.children(recursive=True)]
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)


def test_sigkill_after_stage_change_then_resume(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen(_cmd(tmp_path), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:  # wait for the checkpoint after the stage change
            if list(tmp_path.glob("resume__0__*/checkpoints/step_000004")):
                break
            assert first.poll() is None, "training exited before it could be killed"
            time.sleep(0.5)
        else:
            pytest.fail("no checkpoint at step 4 within 600 s")
    finally:
        _kill_tree(first)
    (run_dir,) = tmp_path.iterdir()

    second = subprocess.run([*_cmd(tmp_path), "--resume", "auto"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resuming" in second.stdout and "step_000004" in second.stdout

    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2, 3, 4, 5]  # each step logged exactly once
    assert [x["horizon"] for x in lines] == [2, 2, 3, 3, 3, 3]
    assert [x["policy_version"] for x in lines] == [1, 2, 3, 4, 5, 6]
    final = json.loads((run_dir / "checkpoints/step_000006/trainer_state.json").read_text())
    assert final["step"] == 6 and final["policy_version"] == 6
    assert final["curriculum"]["step"] == 6 and final["curriculum"]["horizon"] == 3
