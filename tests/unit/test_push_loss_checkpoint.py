"""A generator lost for good while a step's new weights are pushed: the learner has applied the
step's update by then, so the checkpoint the run saves as it stops must count that step (and a
resume must not apply its update again), and must not replace the clean checkpoint before it.

The real `Trainer.step` and `Trainer.save_checkpoint` run on plain stand-ins for the actors (no
Ray session): what is checked is the bookkeeping, which step and version a checkpoint records
against how many updates its weights hold."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from horizonrl.actors.curriculum import CurriculumActor
from horizonrl.cluster.config import load_config
from horizonrl.cluster.ops.checkpoints import load_resume, truncate_metrics
from horizonrl.cluster.rollout.iteration import Gathered
from horizonrl.cluster.train.driver import GeneratorLost, Trainer
from horizonrl.cluster.train.ledger import Ledger
from horizonrl.cluster.train.metrics import MetricsLogger
from horizonrl.protos.reports import RolloutReport

ROOT = Path(__file__).resolve().parents[2]


class Handle:
    """A plain object behind Ray's `handle.method.remote(...)` call shape."""

    def __init__(self, obj: object) -> None:
        self._obj = obj

    def __getattr__(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(remote=getattr(self._obj, name))


class Learner:
    """Counts the updates its weights hold; a checkpoint records that count."""

    dtype = "float32"

    def __init__(self) -> None:
        self.updates = 0

    def train(self, trajs: list) -> dict[str, float]:
        self.updates += 1
        return {"loss": 0.0}

    def fates(self, trajs: list) -> dict[str, list[int]]:
        return {}

    def save_hf(self, folder: Path) -> None:
        folder.mkdir(parents=True)
        (folder / "updates.json").write_text(json.dumps(self.updates))

    def save_checkpoint(self, folder: Path) -> None:
        pass

    def score(self, rows: list) -> list[list[float]]:
        return [[0.0] * len(rows[0])]


class PushLosesAGenerator:
    """The sync phase's shape: one step's ids (dropped, so the ledger has lines for it); the
    push advances the version, then finds no node for a dead generator's replacement."""

    def __init__(self, trainer: Trainer, *, fail: bool) -> None:
        self.t, self.fail = trainer, fail

    def gather(self, step: int) -> Gathered:
        ids = (f"gen0-s{step}-a", f"gen0-s{step}-b")
        out = RolloutReport(trajectory_ids=ids, policy_version=self.t.policy_version, horizon=3)
        return Gathered(outs=[out], trajs=[], dropped={"zero_variance": list(ids)})

    def publish(self, learn: dict[str, float]):
        from horizonrl.learner.weights import SyncStats

        self.t.fleet.advance()
        if self.fail:
            raise GeneratorLost("generator gen0 died and its replacement was not running")
        return SyncStats(seconds=0.0, reload_seconds=0.0)

    def state(self) -> None:
        return None  # as the sync phase: nothing beyond (seed, step) to keep


def _trainer(run_dir: Path, monkeypatch, fleet_of, *, at_step: int) -> Trainer:
    """A trainer `at_step` steps in (as a resume would leave it), on stand-ins."""
    import ray

    monkeypatch.setattr(ray, "get", lambda x, **_: x)  # the stand-ins answer at once
    cfg = load_config(ROOT / "configs/babyai-local.yaml", ["metrics.enabled=false"])
    t = Trainer.__new__(Trainer)
    t.cfg, t.run_dir, t.base_model_path = cfg, run_dir, str(run_dir / "base")
    t.step_count = at_step
    t.fleet = fleet_of([], version=at_step)  # the version's owner, no generators to start
    t.curriculum = Handle(CurriculumActor(cfg.curriculum, step=at_step))
    t.learner, t.replay, t.exporter = Learner(), None, None
    t.ingest = SimpleNamespace(stats=lambda: {"duplicates": 0, "queue_depth": 0})
    t.ledger, t.metrics = Ledger.resume(run_dir, at_step), MetricsLogger(run_dir)
    t.phase = PushLosesAGenerator(t, fail=False)
    return t


def test_the_checkpoint_after_a_lost_push_counts_the_applied_update(tmp_path, monkeypatch,
                                                                   fleet_of):
    t = _trainer(tmp_path, monkeypatch, fleet_of, at_step=3)
    clean = t.save_checkpoint()  # step_000003: 3 steps done, nothing of step 3 applied
    t.phase.fail = True
    with pytest.raises(GeneratorLost):
        t.step()
    # What cluster/train/run.py does on GeneratorLost: keep what the learner has learned.
    saved = t.save_checkpoint()
    t.ledger.close()
    t.metrics.close()

    state = load_resume(saved)
    assert t.learner.updates == 1  # step 3's update is in the weights ...
    assert json.loads((saved / "updates.json").read_text()) == 1
    # ... so the checkpoint is of 4 steps done, at the version a clean run has after step 3,
    # and a resume goes on with step 4 instead of applying step 3's update a second time.
    assert (saved.name, state.step, state.policy_version) == ("step_000004", 4, 4)
    assert state.curriculum["step"] == 4
    # The clean checkpoint of 3 steps is still the one it was.
    before = load_resume(clean)
    assert (clean.exists(), before.step, before.policy_version) == (True, 3, 3)
    assert json.loads((clean / "updates.json").read_text()) == 0
    # Step 3's ledger lines and metrics line belong to the checkpoint: a resume keeps them.
    led = Ledger.resume(tmp_path, state.step)
    assert led.fate == {"gen0-s3-a": "dropped:zero_variance", "gen0-s3-b": "dropped:zero_variance"}
    truncate_metrics(tmp_path, state.step)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(x["step"], x["policy_version"]) for x in lines] == [(3, 4)]
