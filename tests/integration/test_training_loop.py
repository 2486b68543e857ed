"""Two real iterations on the whole stack: local Ray, vLLM, gRPC, 2 DeepSpeed ranks, BabyAI.

Asserts what the walking skeleton promises: exactly-once delivery, policy_version advancing,
generator logprobs that change with the update and agree with the learner's, and no episode
longer than the horizon broadcast to the generator.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import SUITE_MODEL

from horizonrl.cluster.config import load_config

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]

# fp32 on both sides; vLLM's and HF's kernels differ in summation order only.
LOGPROB_TOL = 1e-4
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return load_config(ROOT / "configs/babyai-local.yaml", [
        *SUITE_MODEL,
        "name=it", "iterations=2", "metrics.port=0", f"run_root={root}", "checkpoint_every=0",
        "env.replicas_per_actor=16", "generator.tasks_per_step=4", "generator.group_size=4",
        "curriculum.horizons=[2, 3]", "curriculum.steps_per_stage=1",
        "learner.minibatches=1", "learner.lr=1e-3", "learner.warmup_steps=0",
        "eval.every=2", "eval.tasks=2", "eval.horizons=[2, 4]",
        # fp32, not the default's auto: learner and vLLM logprobs agree to 1e-4 only there.
        "learner.dtype=float32", "generator.dtype=float32",
    ])


def _held_cpus(timeout_s: float = 60.0) -> float:
    """Logical CPUs the session's actors still hold (ray.kill is asynchronous: bounded wait)."""
    import time

    import ray

    deadline = time.monotonic() + timeout_s
    while True:
        held = ray.cluster_resources().get("CPU", 0) - ray.available_resources().get("CPU", 0)
        if held <= 1e-6 or time.monotonic() > deadline:
            return held
        time.sleep(1)


def test_two_iterations_end_to_end(cfg):
    import ray

    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.rollout.iteration import make_run_dir
    from horizonrl.cluster.train.driver import Trainer

    run_dir = make_run_dir(cfg)
    with ray_session(cfg.ray):
        with Trainer(cfg, run_dir=run_dir) as trainer:
            gen = trainer.generators[0]
            assert ray.get(gen.get_policy_version.remote()) == 0
            metrics, trajs = [], []
            for _ in range(2):
                metrics.append(trainer.step())
                trajs += trainer.last_trajectories
            fixed = [list(t.prompt_ids + t.response_ids) for t in trajs[:4]]
            # One owner of the policy version: the fleet's is what every generator holds.
            assert trainer.fleet.versions() == trainer.fleet.held == [2] * len(
                trainer.generators) and trainer.policy_version == 2

            # Exactly once: what the generators reported sending is what the learner trained on.
            ids = [t.trajectory_id for t in trajs]
            assert len(ids) == len(set(ids)) == 2 * 4 * 4
            assert all(m["trajectories_generated"] == 4 * 4 for m in metrics)
            led = metrics[-1]["ledger"]
            assert led["reconciled"] and led["generated"] == 2 * 4 * 4 == led["trained"] + \
                led["dropped_total"]
            assert trainer.ingest.stats()["duplicates"] == 0
            # Every role on the one local node, as placement.json records it.
            placed = json.loads((run_dir / "placement.json").read_text())
            assert placed == {"driver": "127.0.0.1", "generators": ["127.0.0.1"],
                              "env_actors": ["127.0.0.1"] * cfg.env.num_actors,
                              "learner_ranks": ["127.0.0.1"] * cfg.learner.world_size}

            # No episode ran past the horizon in force, and the broadcast reached the generator.
            assert [m["horizon"] for m in metrics] == [2, 3]
            for t in trajs:
                assert t.num_turns <= t.horizon
            assert {t.horizon for t in trajs} == {2, 3}

            # The update reached the engine: version advanced, logprobs moved and match the learner.
            assert ray.get(gen.get_policy_version.remote()) == 2
            assert any(m["learner"]["skipped_update"] == 0.0 for m in metrics)
            # The sampler-vs-learner gap is reported on every update, and in sync mode (same
            # weights on both sides) it is float noise.
            for m in (m for m in metrics if m["learner"]["skipped_update"] == 0.0):
                assert 0 <= m["learner"]["mismatch_log_ratio_abs_max"] < LOGPROB_TOL
                assert 0 <= m["learner"]["mismatch_kl"] < LOGPROB_TOL
            after = ray.get(gen.score.remote(fixed))
            learner = trainer.learner.score(fixed)
            # Behaviour logprobs recorded at version 0 are the "before" for the same tokens.
            before = [[0.0] * len(t.prompt_ids) + list(t.response_logprobs) for t in trajs[:4]]
            moved = max(abs(a - b) for s_a, s_b, t in zip(after, before, trajs[:4])
                        for a, b, m in zip(s_a[len(t.prompt_ids):], s_b[len(t.prompt_ids):],
                                           t.response_mask) if m)
            assert moved > 1e-3, "generator logprobs did not change after two updates"
            diff = max(abs(a - b) for s_a, s_b in zip(after, learner) for a, b in zip(s_a, s_b))
            print(f"\nlogprobs moved by up to {moved:.4f}; max |vLLM - learner| = {diff:.2e}")
            assert diff < LOGPROB_TOL, f"generator vs learner logprobs differ by {diff}"
        # Closing the trainer ended its actors, not only the learner ranks: a driver that
        # trains again in the same Ray session starts with its CPUs free.
        assert _held_cpus() == 0
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(gen.get_policy_version.remote(), timeout=60)

    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1]
    # Periodic evaluation ran after step 2 with the updated policy, at both turn budgets.
    assert "eval/babyai/h2/accuracy" not in lines[0]
    for h in (2, 4):
        acc = lines[1][f"eval/babyai/h{h}/accuracy"]
        # eval.tasks=2 tasks x 1 sample: a share of 2 episodes, and pass@1 is that same share.
        assert acc * cfg.eval.tasks in (0, 1, 2), acc
        assert lines[1][f"eval/babyai/h{h}/pass@1"] == pytest.approx(acc)
        assert 1 <= lines[1][f"eval/babyai/h{h}/mean_turns"] <= h
    assert (run_dir / "config.yaml").exists()


def test_one_iteration_mixing_two_envs(cfg):
    """A run with extra_envs: each group stays in one env, metrics come per env label."""
    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.rollout.iteration import make_run_dir, sample_tasks
    from horizonrl.cluster.train.driver import Trainer

    # Sampling at 0.7: the learner must score tokens under logits / 0.7, as vLLM sampled them.
    mixed = cfg.model_copy(update={"iterations": 1, "extra_envs": [
        cfg.env.model_copy(update={"name": "deepsearch", "kwargs": {"hops": [1]}})],
        "generator": cfg.generator.model_copy(update={"temperature": 0.7})})
    assert {t.env for t in sample_tasks(mixed, 0)} == {"babyai", "deepsearch"}
    with ray_session(mixed.ray), Trainer(mixed, run_dir=make_run_dir(mixed)) as trainer:
        before = trainer.phase.gather(0).trajs  # rolled out, not trained on
        w = trainer.learner.importance_weights(before)
        mask = w["loss_mask"] > 0
        gap = float(np.abs(w["prox_logprobs"] - w["old_logprobs"])[mask].max())
        print(f"\nat temperature 0.7, max |learner - vLLM| logprob = {gap:.2e}")
        assert gap < LOGPROB_TOL, f"learner and vLLM logprobs at temperature 0.7 differ by {gap}"
        m = trainer.step()
        trajs = trainer.last_trajectories
    groups: dict[str, set[str]] = {}
    for t in trajs:
        groups.setdefault(t.group_id, set()).add(t.env_name)
        assert t.task_id.startswith(t.env_name + "-")
    assert all(len(envs) == 1 for envs in groups.values())
    assert {t.env_name for t in trajs} == {"babyai", "deepsearch"}
    assert m["trajectories_generated"] == len(trajs) and m["ledger"]["reconciled"]
    for env in ("babyai", "deepsearch"):
        mine = [t for t in trajs if t.env_name == env]
        assert m["env"][env]["pool_steps"] > 0 and mine
        # Each env's figures come from its own episodes only.
        assert m["env"][env]["success_rate"] == pytest.approx(
            sum(bool(t.info.get("success")) for t in mine) / len(mine))
        assert m["env"][env]["turns_mean"] == pytest.approx(
            sum(t.num_turns for t in mine) / len(mine))
