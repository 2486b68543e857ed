"""A generator lost for good at the weight push (SIGKILLed as step 1's weights go out, and no
node left to host its replacement), then `--resume`: the resumed run's weights, version and
ledger are those of a run without the fault, and no update is applied twice.

Both runs resume from their step-2 checkpoint, so both go on with freshly started generators
(same seeds): the runs are then comparable exactly, weights included."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from horizonrl.cluster.config import load_config
from horizonrl.cluster.ops.checkpoints import latest_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.chaos,
              pytest.mark.slow]  # four short trainings on the local stack
ROOT = Path(__file__).resolve().parents[2]


def _cfg(run_root: Path, model: Path):
    # A barely pre-trained model rarely succeeds, so its groups seldom have reward variance:
    # an entropy bonus on every group makes each step's update move the weights all the same.
    return load_config(ROOT / "configs/babyai-local.yaml", [
        "name=pushloss", "iterations=3", "metrics.port=0", f"run_root={run_root}",
        f"model.path={model}", "generator.tasks_per_step=4", "generator.group_size=4",
        "curriculum.horizons=[5]", "learner.minibatches=1", "checkpoint_every=0",
        "learner.entropy_coef=0.01", "learner.skip_zero_variance_groups=false",
        "env.replicas_per_actor=8", "env.num_actors=2"])


def _lose_generator_at_push(trainer, version: int) -> None:
    """When `version` is pushed: generator 0's process is SIGKILLed, and its replacement asks
    for a resource no node offers, as when its node is gone and no other has room."""
    import ray

    fleet = trainer.fleet
    push = fleet.weights.push

    def push_after_loss(v: int):
        if v == version:
            pid = ray.get(fleet.generators[0].health.remote())["pid"]
            g = fleet.cfg.generator.model_copy(update={"resources": {"lost_node": 1.0},
                                                       "restart_timeout_s": 5.0})
            fleet.cfg = fleet.cfg.model_copy(update={"generator": g})  # what replacements ask
            os.kill(pid, signal.SIGKILL)
        return push(v)

    fleet.weights.push = push_after_loss


def _first_two_steps(cfg, *, fault: bool) -> tuple[Path, list[float]]:
    """Steps 0 and 1, then the checkpoint the run leaves (cluster/train/run.py: on GeneratorLost it
    saves one and stops). Returns the run dir and the learner's probe logprobs at the end."""
    from horizonrl.cluster.ops.checkpoints import PROBE_IDS
    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.rollout.iteration import make_run_dir
    from horizonrl.cluster.train.driver import GeneratorLost, Trainer

    run_dir = make_run_dir(cfg)
    with ray_session(cfg.ray), Trainer(cfg, run_dir=run_dir) as trainer:
        trainer.step()
        if fault:
            _lose_generator_at_push(trainer, version=2)
            with pytest.raises(GeneratorLost, match="no node has room"):
                trainer.step()
        else:
            trainer.step()
        trainer.save_checkpoint()
        return run_dir, trainer.learner.score([PROBE_IDS])[0]


def _resume_last_step(cfg, run_dir: Path) -> dict:
    from horizonrl.cluster.ops.checkpoints import PROBE_IDS, load_resume, truncate_metrics
    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.train.driver import Trainer

    state = load_resume(latest_checkpoint(run_dir))  # `--resume auto`, as cluster/train/run.py does
    truncate_metrics(run_dir, state.step)
    with ray_session(cfg.ray), Trainer(cfg, run_dir=run_dir, resume=state) as trainer:
        resumed = {"step": trainer.step_count, "version": trainer.policy_version,
                   "probe": trainer.learner.score([PROBE_IDS])[0]}
        # Resumed generators start at the checkpoint's version, the fleet's.
        assert trainer.fleet.versions() == [trainer.policy_version] * len(trainer.generators)
        while trainer.step_count < cfg.iterations:
            trainer.step()
        final = trainer.save_checkpoint()
    return {"from": state.checkpoint.name, "resumed": resumed, "final": final}


def _weights(ckpt: Path) -> dict:
    from safetensors.torch import load_file

    return {k: v for f in sorted(ckpt.glob("*.safetensors")) for k, v in load_file(f).items()}


def _ledger(run_dir: Path) -> list[tuple[int, str, str]]:
    """(step, id without its random suffix, fate) of every line, in a stable order."""
    lines = [json.loads(x) for x in (run_dir / "ledger.jsonl").read_text().splitlines()]
    return sorted((x["step"], x["id"].rsplit("-", 1)[0], x["fate"]) for x in lines)


def test_generator_lost_at_the_push_then_resume_equals_a_run_without_the_fault(
        tmp_path, tiny_model_path):
    t0 = time.monotonic()
    clean_cfg, lost_cfg = (_cfg(tmp_path / k, tiny_model_path) for k in ("clean", "lost"))
    clean_dir, clean_probe = _first_two_steps(clean_cfg, fault=False)
    lost_dir, lost_probe = _first_two_steps(lost_cfg, fault=True)
    # Step 1's update is in the weights: the checkpoint is of 2 steps done, never step_000001.
    assert latest_checkpoint(lost_dir).name == "step_000002"
    lost = _resume_last_step(lost_cfg, lost_dir)
    clean = _resume_last_step(clean_cfg, clean_dir)
    print(f"\nfour trainings in {time.monotonic() - t0:.0f}s; lost: {lost}; clean: {clean}")

    # The checkpoint the lost push left is of 2 steps done, with step 1's update in it once.
    assert lost["from"] == clean["from"] == "step_000002"
    assert lost["resumed"]["step"] == clean["resumed"]["step"] == 2
    assert lost["resumed"]["version"] == clean["resumed"]["version"] == 2
    assert lost["resumed"]["probe"] == lost_probe  # the weights it had when the push failed
    assert lost_probe == clean_probe
    # The resumed run ends where the run without the fault does: weights, version, ledger.
    a, b = _weights(lost["final"]), _weights(clean["final"])
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    for ckpt in (lost["final"], clean["final"]):
        state = json.loads((ckpt / "trainer_state.json").read_text())
        assert (ckpt.name, state["step"], state["policy_version"]) == ("step_000003", 3, 3)
    assert _ledger(lost_dir) == _ledger(clean_dir)
    summary = json.loads((lost_dir / "ledger.json").read_text())
    assert summary["reconciled"] and summary["generated"] == 3 * 16
    metrics = [json.loads(x) for x in (lost_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["policy_version"]) for m in metrics] == [(0, 1), (1, 2), (2, 3)]
    # Every step updated the weights (the entropy bonus moves them even without successes), so
    # an update applied twice would show in them.
    assert all(m["trajectories_trained"] == 16 and m["learner/skipped_update"] == 0
               for m in metrics)
