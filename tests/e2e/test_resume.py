"""Kill the whole training process tree after a horizon change; `--resume auto` continues
the step count, policy_version and curriculum exactly."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SUITE_MODEL

pytestmark = [pytest.mark.integration, pytest.mark.chaos,  # the driver SIGKILL case
              pytest.mark.slow]  # about a minute: with the other chaos cases, in CI's slow set
ROOT = Path(__file__).resolve().parents[2]


def _cmd(run_root: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "horizonrl.cluster.cli",
            "train", "--config", "configs/babyai-local.yaml", *SUITE_MODEL,
            "name=resume", "iterations=10", "metrics.port=0",
            f"run_root={run_root}", "checkpoint_every=2",
            "generator.tasks_per_step=2", "generator.group_size=2", "env.replicas_per_actor=4",
            "curriculum.horizons=[2, 3]", "curriculum.boundaries=[2]", *extra]


def test_sigkill_after_stage_change_then_resume(tmp_path, kill_when):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # Killed once the checkpoint after the stage change is written.
    alive = kill_when(_cmd(tmp_path), root=tmp_path, cwd=ROOT,
                      pattern="resume__0__*/checkpoints/step_000004")
    assert not alive, f"processes of the killed run survived: {alive}"
    (run_dir,) = tmp_path.iterdir()

    assert not (run_dir / "checkpoints/step_000010").exists(), "killed too late"

    second = subprocess.run([*_cmd(tmp_path), "--resume", "auto"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    resumed_at = int(re.search(r"from step_(\d+) ", second.stdout).group(1))
    assert 4 <= resumed_at < 10  # after the stage change at step 2

    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(10))  # each step logged exactly once
    assert [x["horizon"] for x in lines] == [2, 2] + [3] * 8
    assert [x["policy_version"] for x in lines] == list(range(1, 11))
    final = json.loads((run_dir / "checkpoints/step_000010/trainer_state.json").read_text())
    assert final["step"] == 10 and final["policy_version"] == 10
    assert final["curriculum"]["step"] == 10 and final["curriculum"]["horizon"] == 3
    # The ledger continues across the kill: steps re-run after the checkpoint replace their
    # lost lines, and every id ends trained or dropped with a reason.
    ledger = json.loads((run_dir / "ledger.json").read_text())
    assert ledger["reconciled"] and ledger["unaccounted"] == 0 and ledger["conflicts"] == 0
    fates = [json.loads(x) for x in (run_dir / "ledger.jsonl").read_text().splitlines()]
    assert sorted({f["step"] for f in fates}) == list(range(10))
    assert ledger["generated"] == len(fates) == ledger["trained"] + ledger["dropped_total"]
