"""Kill an async run with partial rollouts after a checkpoint, then `--resume auto`: nothing is
lost and nothing is trained twice. The checkpoint holds the phase's untrained buffer and the
groups its rollouts in flight had not completed; the resumed run trains the buffer and
re-issues those groups with their own task seeds and group ids (counted as resampled) before
any new rollout."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.slow]  # ~2-3 min
ROOT = Path(__file__).resolve().parents[2]
TASKS, GROUP = 2, 2


def _cmd(run_root: Path, model: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "horizonrl.cluster.cli", "train",
            "--config", "configs/babyai-local.yaml", "name=aresume", "iterations=6",
            "metrics.port=0", f"run_root={run_root}", "checkpoint_every=1", "mode=async",
            "max_staleness=2", "generator.partial_rollouts=true", f"model.path={model}",
            # 0.1-0.3 s per env step: a rollout is in flight at every checkpoint.
            "env.name=faulty", "env.label=babyai", "env.replicas_per_actor=4",
            "env.kwargs={env: babyai, env_kwargs: {level: BabyAI-GoToRedBall-v0, "
            "reward: binary}, fault: latency, sleep_s: 0.2, jitter: 0.5}",
            f"generator.tasks_per_step={TASKS}", f"generator.group_size={GROUP}",
            "curriculum.horizons=[4]", "learner.skip_zero_variance_groups=false", *extra]


def test_kill_then_resume_loses_and_duplicates_nothing(tmp_path, kill_when, tiny_model_path):
    alive = kill_when(_cmd(tmp_path, tiny_model_path), root=tmp_path, cwd=ROOT,
                      pattern="aresume__0__*/checkpoints/step_000003")
    assert not alive, f"processes of the killed run survived: {alive}"
    (run_dir,) = tmp_path.iterdir()
    assert not (run_dir / "checkpoints/step_000006").exists(), "killed too late"
    # What the checkpoint a resume starts from owes (read now: later ones replace it).
    owed_by_step = {int(d.name.split("_")[1]): sum(map(len, json.loads(
        (d / "trainer_state.json").read_text())["phase"]["in_flight_groups"].values()))
        for d in (run_dir / "checkpoints").glob("step_*") if (d / "trainer_state.json").exists()}

    second = subprocess.run([*_cmd(tmp_path, tiny_model_path), "--resume", "auto"], cwd=ROOT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True,
                            text=True, timeout=900)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    resumed_at = int(re.search(r"from step_(\d+) ", second.stdout).group(1))
    assert 3 <= resumed_at < 6

    ledger = json.loads((run_dir / "ledger.json").read_text())
    assert ledger["reconciled"] and ledger["unaccounted"] == 0 and ledger["conflicts"] == 0
    fates = [json.loads(x) for x in (run_dir / "ledger.jsonl").read_text().splitlines()]
    ids = [f["id"] for f in fates]
    assert len(ids) == len(set(ids)) == ledger["generated"]  # no trajectory twice
    assert set(range(6)) <= {f["step"] for f in fates}  # (6: the buffer left at the end)
    # Ids name their rollout and task (gen0-s<rollout>-<task>-<k>-<uuid>): every group met
    # its fate exactly once per episode, and the rollouts behind them leave no gap (one
    # generator ends its rollouts in order), so the one in flight at the checkpoint came
    # back with its own tasks and group ids.
    groups = Counter(re.fullmatch(r"gen\d+-s(\d+)-(.+)-\d+-[0-9a-f]{8}", i).groups()
                     for i in ids)
    assert set(groups.values()) == {GROUP}, groups
    rollouts = sorted({int(r) for r, _ in groups})
    assert rollouts == list(range(len(rollouts))), rollouts
    assert all(sum(r == str(k) for r, _ in groups) == TASKS for k in rollouts)
    # The groups the checkpoint's rollouts in flight owed (the running one's incomplete
    # groups, all of the one queued behind it) were counted as resampled: their episodes had
    # no ids before the kill.
    owed = owed_by_step[resumed_at]
    print(f"\nresumed from step {resumed_at}; owed groups {owed}; ledger {ledger}")
    assert owed >= 1 and ledger["resampled_episodes"] == owed * GROUP
