"""`horizonrl sft | rs | dpo` from the CLI on the trajectories a short training run saved:
each trains on the real DeepSpeed group and its loss falls."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ONE_RANK, SUITE_MODEL

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "horizonrl.cluster.cli"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    out = subprocess.run(
        [*CLI, "train", "--config", "configs/babyai-local.yaml", *SUITE_MODEL, ONE_RANK,
         "name=aux", "iterations=3", "metrics.port=0", f"run_root={root}", "checkpoint_every=0",
         "save_trajectories=true",
         "generator.tasks_per_step=6", "generator.group_size=6", "env.replicas_per_actor=36"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (run,) = root.iterdir()
    assert len(list((run / "trajectories").glob("step_*.jsonl"))) == 3
    return run


def _aux(kind: str, run_dir: Path, out: Path, *extra: str) -> list[dict]:
    proc = subprocess.run(
        [*CLI, kind, "--data", str(run_dir), "--out", str(out), "--config",
         "configs/babyai-local.yaml", "--steps", "12", "--batch-size", "8",
         # A fixed small set, revisited: the loss must fall as the model fits it (on fresh
         # samples of its own policy the NLL is already near its entropy).
         "--max-examples", "12", *SUITE_MODEL, ONE_RANK, "learner.lr=1e-3",
         "learner.warmup_steps=0", *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "model" / "config.json").exists() and (out / "model" / "tokenizer.json").exists()
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


@pytest.mark.parametrize("kind", ["sft", "rs"])
def test_sft_and_rejection_sampling_loss_falls(run_dir, tmp_path, kind):
    losses = [m["loss"] for m in _aux(kind, run_dir, tmp_path / kind)]
    print(f"\n{kind} losses: {[round(x, 3) for x in losses]}")
    assert _mean(losses[-3:]) < 0.8 * _mean(losses[:3])


def test_dpo_loss_falls_and_margin_rises(run_dir, tmp_path):
    lines = _aux("dpo", run_dir, tmp_path / "dpo", "learner.dpo_beta=0.5")
    losses = [m["loss"] for m in lines]
    print(f"\ndpo losses: {[round(x, 3) for x in losses]}")
    assert math.isclose(losses[0], math.log(2), abs_tol=1e-3)  # the policy starts at the reference
    assert _mean(losses[-3:]) < losses[0] - 0.05
    assert lines[-1]["reward_margin"] > 0


def test_bad_data_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"trajectoryId": 5\n')
    proc = subprocess.run([*CLI, "sft", "--data", str(bad), "--out", str(tmp_path / "o")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "bad.jsonl:1" in proc.stderr, proc.stderr[-2000:]
