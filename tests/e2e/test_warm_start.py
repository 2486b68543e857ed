"""The warm start from one `horizonrl train`: expert demos -> SFT on the learner group -> eval ->
RL from the cloned model; killed in the middle of it, `--resume auto` finishes the same run
without redoing what was complete, and a later resume continues the RL phase."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SUITE_MODEL

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _cmd(run_root: Path, iterations: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "horizonrl.cluster.cli",
            "train", "--config", "configs/babyai-local.yaml", *SUITE_MODEL,
            "name=ws", f"iterations={iterations}", "metrics.port=0", f"run_root={run_root}",
            "checkpoint_every=0", "generator.tasks_per_step=2", "generator.group_size=4",
            "env.replicas_per_actor=8", "init.sft_epochs=2", "init.demo_episodes=24",
            "init.sft_batch_size=8", "init.eval_tasks=4", "init.eval_horizon=3", *extra]


@pytest.mark.slow  # two kills and three starts of a whole run (~2 min); CI runs the slow set
def test_warm_start_killed_then_resumed_then_rl_resumed(tmp_path, kill_when):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # Killed once SFT has finished, while the run evaluates base and clone.
    assert not kill_when(_cmd(tmp_path, 1), root=tmp_path, cwd=ROOT, poll_s=0.2,
                         pattern="ws__0__*/init/model/config.json")
    (run_dir,) = tmp_path.iterdir()
    init = run_dir / "init"
    assert not (init / "warm_start.json").exists(), "killed too late"
    demos = json.loads((init / "demos/summary.json").read_text())
    assert demos["episodes"] == 24 and demos["success_rate"] >= 0.9
    sft = [json.loads(x) for x in (init / "sft_metrics.jsonl").read_text().splitlines()]
    assert len(sft) == 6  # ceil(24 / 8) * 2 epochs
    assert sft[-1]["sft_loss"] < sft[0]["sft_loss"]

    second = subprocess.run([*_cmd(tmp_path, 1), "--resume", "auto"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"resuming the warm start of {run_dir}" in second.stdout
    assert "demos: reusing" in second.stdout and "sft: reusing" in second.stdout
    assert [p.name for p in tmp_path.iterdir()] == [run_dir.name]
    done = json.loads((init / "warm_start.json").read_text())
    assert set(done["eval"]["accuracy"]) == {"base", "bc"}
    assert Path(done["model"]) == (init / "model").resolve()
    state = json.loads((run_dir / "checkpoints/step_000001/trainer_state.json").read_text())
    assert state["base_model_path"] == done["model"]  # RL started from the clone

    # The RL phase resumed with demonstration replay: one SFT step on 4 demos after each update.
    third = subprocess.run([*_cmd(tmp_path, 2, "init.replay_batch=4"), "--resume", "auto"],
                           cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=900)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert "from step_000001" in third.stdout and "[warm-start]" not in third.stdout
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1]
    assert "learner/replay_sft_loss" not in lines[0]
    # Replayed from the demos the clone was trained on: near its last SFT loss, not its first.
    assert lines[1]["learner/replay_sft_loss"] < 0.8 * sft[0]["sft_loss"]
