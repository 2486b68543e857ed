"""Window-context episodes in async mode, through the CLI, stopped and resumed from a checkpoint:
per-turn rows train on both sides of the resume and the ledger counts episodes exactly once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SUITE_MODEL

from horizonrl.protos.codec import from_json_line

# About a minute of async training, twice: in the slow set, which CI runs after the default.
pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def _train(run_root: Path, iterations: int, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "horizonrl.cluster.cli",
           "train", "--config", "configs/babyai-local.yaml", *SUITE_MODEL,
           "name=winasync", f"iterations={iterations}", "metrics.port=0", f"run_root={run_root}",
           "checkpoint_every=1", "mode=async", "save_trajectories=true",
           "generator.tasks_per_step=2", "generator.group_size=4", "env.replicas_per_actor=8",
           "curriculum.horizons=[6]", "generator.context.mode=window",
           "generator.context.keep_turns=2", "learner.skip_zero_variance_groups=false", *extra]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_async_window_run_resumes(tmp_path):
    first = _train(tmp_path, 2)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    second = _train(tmp_path, 4, "--resume", "auto")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "from step_000002" in second.stdout

    (run_dir,) = tmp_path.iterdir()
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2, 3]
    trained = [x for x in lines if x["learner/skipped_update"] == 0.0]
    assert trained and any(x["learner/rows_trained"] > x["learner/episodes_trained"]
                           for x in trained)
    assert all(x["rows_per_episode"] >= 1.0 for x in lines)
    for step in range(4):
        trajs = [from_json_line(s) for s in
                 (run_dir / f"trajectories/step_{step:06d}.jsonl").read_text().splitlines()]
        assert trajs and all(len(t.turn_spans) == t.num_turns for t in trajs)
    ledger = json.loads((run_dir / "ledger.json").read_text())
    assert ledger["reconciled"] and ledger["unaccounted"] == 0 and ledger["conflicts"] == 0
