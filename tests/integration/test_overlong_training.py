"""`learner.overlong: mask | penalty` through a real run: one iteration per mode on the whole
stack (local Ray, vLLM, gRPC, a DeepSpeed rank, BabyAI). The ledger must give masked episodes
the fate `overlong` and penalised ones their place in the update with the penalty as their
reward; the in-training eval must report what the env paid.

Episodes must end both ways for that to say anything. BabyAI here stops itself after one
primitive step (`max_primitive_steps=1`: ended by the env, not over-long), and an action it
does not know takes no step and costs 0.1 (`invalid_penalty`), so an episode that only makes
invalid moves for the 3 turns is cut by the horizon, and the others' rewards differ by how
many invalid moves came first.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from horizonrl.cluster.config import load_config

# ~1.5 min for the two runs (and 1-2 min more the first time, to build the model).
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("shared_ray")]

ROOT = Path(__file__).resolve().parents[2]
PENALTY = 0.5


@pytest.fixture(scope="module")
def acting_model() -> Path:
    """A tiny model pre-trained long enough (100 steps) to name a valid BabyAI action now and
    then; the session's `tiny_model_path` (4 steps) never does, so with it every episode is
    cut and no penalised episode reaches an update. The suite's default-config model
    (conftest.SUITE_MODEL) acts too well here: with it no eval episode was cut. Built into the
    repo's model cache once (1-2 min on 2 cores)."""
    from horizonrl.cluster.config import ModelConfig, TinyModelConfig
    from horizonrl.cluster.model.load import ensure_model
    from horizonrl.envpool.config import EnvConfig

    tiny = TinyModelConfig(transcripts=300, pretrain_steps=100, batch_size=16)
    return ensure_model(ModelConfig(tiny=tiny, cache_dir=str(ROOT / ".cache/models")),
                        env=EnvConfig())


def _config(mode: str, root: Path, model: Path):
    return load_config(ROOT / "configs/babyai-local.yaml", [
        f"name=overlong-{mode}", "iterations=1", "metrics.port=0", f"run_root={root}",
        "checkpoint_every=0", f"model.path={model}", "save_trajectories=true",
        "env.kwargs.max_primitive_steps=1", "env.kwargs.invalid_penalty=0.1",
        "curriculum.horizons=[3]", "env.replicas_per_actor=16",
        "generator.tasks_per_step=4", "generator.group_size=4",
        "learner.world_size=1", "learner.minibatches=1", "learner.warmup_steps=0",
        f"learner.overlong={mode}", f"learner.overlong_penalty={PENALTY}",
        # Eval at horizon 1: any episode whose first action is invalid is cut there (a valid
        # one ends it through max_primitive_steps), so the eval has cut episodes whatever the
        # model's skill; at 3 a cut needs three invalid actions in a row, which a model built
        # on another CPU did not make in 8 episodes.
        "eval.every=1", "eval.tasks=8", "eval.horizons=[1]",
    ])


def _spy_on_eval(monkeypatch) -> dict[str, list]:
    """What the driver's periodic eval collected, the records it made and the summary."""
    import horizonrl.cluster.eval.evaluate as evaluate
    import horizonrl.cluster.eval.metrics as eval_metrics

    seen: dict[str, list] = {"trajs": [], "records": [], "summary": []}
    to_records, summarise = evaluate.to_records, eval_metrics.summarise

    def records_spy(model, trajs, max_turns):
        seen["trajs"] += trajs
        out = to_records(model, trajs, max_turns)
        seen["records"] += out
        return out

    def summarise_spy(records, ks):
        out = summarise(records, ks)
        seen["summary"].append(out)
        return out

    monkeypatch.setattr(evaluate, "to_records", records_spy)
    monkeypatch.setattr(eval_metrics, "summarise", summarise_spy)
    return seen


def _train(cfg, monkeypatch) -> tuple[Path, dict, dict[str, list]]:
    from horizonrl.cluster.rollout.iteration import make_run_dir
    from horizonrl.cluster.train.driver import Trainer

    seen = _spy_on_eval(monkeypatch)
    run_dir = make_run_dir(cfg)
    with Trainer(cfg, run_dir=run_dir) as trainer:
        metrics = trainer.step()
    return run_dir, metrics, seen


def _run_record(run_dir: Path):
    """The step's trajectories as trained (overlong rule applied), each id's fate and the
    ledger's summary; the episodes ended both ways."""
    from horizonrl.protos.codec import from_json_line

    trajs = [from_json_line(x) for x in
             (run_dir / "trajectories/step_000000.jsonl").read_text().splitlines()]
    fates = {x["id"]: x["fate"] for x in
             map(json.loads, (run_dir / "ledger.jsonl").read_text().splitlines())}
    summary = json.loads((run_dir / "ledger.json").read_text())
    assert summary["reconciled"] and summary["generated"] == len(trajs) == len(fates) == 16
    cut = sum(t.cut == "horizon" for t in trajs)
    assert 0 < cut < len(trajs), f"{cut} of {len(trajs)} cut: the run tests one ending only"
    return trajs, fates, summary


def _check_loss(trajs, fates: dict[str, str], learn: dict[str, float]) -> None:
    """The update learned from exactly the episodes the ledger calls trained: their count and
    their model tokens."""
    chosen = [t for t in trajs if fates[t.trajectory_id] in ("trained", "dropped:update_skipped")]
    assert learn["episodes_trained"] == len(chosen)
    trained = [t for t in trajs if fates[t.trajectory_id] == "trained"]
    if trained:
        assert learn["tokens_trained"] == sum(sum(t.response_mask) for t in trained)


def _check_mask(run_dir: Path, metrics: dict) -> None:
    trajs, fates, summary = _run_record(run_dir)
    assert summary["dropped"]["overlong"] == sum(t.cut is not None for t in trajs)
    for t in trajs:  # exactly the cut ones are masked, and none of them reached the loss
        assert bool(t.info.get("overlong_masked")) == (t.cut is not None)
        assert (fates[t.trajectory_id] == "dropped:overlong") == (t.cut is not None)
        assert t.reward == pytest.approx(sum(t.rewards))
    _check_loss(trajs, fates, metrics["learner"])


def _check_penalty(run_dir: Path, metrics: dict) -> None:
    trajs, fates, summary = _run_record(run_dir)
    assert "overlong" not in summary["dropped"]
    for t in trajs:  # what the learner got: the env's reward, less the penalty if cut
        assert t.reward == pytest.approx(sum(t.rewards) - PENALTY * (t.cut is not None))
    # A group with an episode the env ended has a signal: its cut members are trained on,
    # with the penalty in their advantage.
    assert any(fates[t.trajectory_id] == "trained" for t in trajs if t.cut)
    _check_loss(trajs, fates, metrics["learner"])


def _check_eval(seen: dict[str, list]) -> None:
    """Every eval episode scored with what the env paid: the sum of its per-turn rewards,
    which the overlong rule never touches."""
    trajs, records = seen["trajs"], seen["records"]
    assert len(trajs) == 8 and any(t.cut for t in trajs), "no eval episode was cut"
    paid = [sum(t.rewards) for t in trajs]
    assert [r.reward for r in records] == pytest.approx(paid)
    (summary,) = seen["summary"]
    cell = summary["policy"]["babyai"]["1"]
    assert cell["episodes"] == 8  # masked episodes are still the policy's results
    assert cell["mean_reward"] == pytest.approx(sum(paid) / len(paid))


def test_overlong_mask_and_penalty_through_the_driver_and_the_ledger(
        acting_model, tmp_path, monkeypatch):
    from horizonrl.cluster.ops.runtime import ray_session

    checks = {"mask": _check_mask, "penalty": _check_penalty}
    cfgs = {mode: _config(mode, tmp_path / mode, acting_model) for mode in checks}
    with ray_session(cfgs["mask"].ray):
        for mode, check in checks.items():
            with monkeypatch.context() as m:
                run_dir, metrics, seen = _train(cfgs[mode], m)
            check(run_dir, metrics)
            _check_eval(seen)
            lines = (run_dir / "metrics.jsonl").read_text().splitlines()
            assert "eval/babyai/h1/accuracy" in json.loads(lines[-1])
