"""Async mode on the real stack: no trained trajectory is staler than max_staleness, and the
decoupled loss's importance weights are exp(learner logprob - behaviour logprob), truncated."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import ONE_RANK, SUITE_MODEL

from horizonrl.cluster.config import load_config

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]
ROOT = Path(__file__).resolve().parents[2]


def test_async_staleness_bound_and_importance_weights(tmp_path):
    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.rollout.iteration import make_run_dir
    from horizonrl.cluster.train.driver import Trainer

    cfg = load_config(ROOT / "configs/babyai-local.yaml", [
        *SUITE_MODEL, ONE_RANK,
        "name=async", "iterations=4", "metrics.port=0", f"run_root={tmp_path}",
        "mode=async", "max_staleness=1", "env.replicas_per_actor=16",
        "generator.tasks_per_step=4", "generator.group_size=4", "curriculum.horizons=[3]",
        "learner.minibatches=1", "learner.lr=1e-3", "learner.warmup_steps=0",
        "learner.skip_zero_variance_groups=false",
        "learner.dtype=float32", "generator.dtype=float32"])  # the 1e-4 logprob checks need fp32
    lags, dropped = [], []
    with ray_session(cfg.ray), Trainer(cfg, run_dir=make_run_dir(cfg)) as trainer:
        assert trainer.learner.cfg.decoupled_loss  # on by default in async mode
        for _ in range(4):
            version = trainer.policy_version  # the learner's version when it trains
            m = trainer.step()
            lags += [version - t.policy_version for t in trainer.last_trajectories]
            dropped.append(m["async"]["dropped_stale"])
            assert m["learner"].get("is_weight_mean", 1.0) > 0
        trajs = trainer.last_trajectories
        # Generators lag in async mode; the fleet's record of what each holds is exact (read
        # once the rollout in flight has ended) and never ahead of the run's version.
        held = trainer.fleet.versions()
        assert held == trainer.fleet.held and max(held) <= trainer.policy_version
        checked = trainer.learner.importance_weights(trajs)
        # Independently: the learner's logprobs of the same sequences, via score().
        seqs = [list(t.prompt_ids + t.response_ids) for t in trajs]
        scored = trainer.learner.score(seqs)
    print(f"\ntrained lags {sorted(set(lags))}, dropped stale per step {dropped}")
    assert lags and max(lags) <= 1
    assert any(lag == 1 for lag in lags), "generation never overlapped an update"
    mask = checked["loss_mask"] > 0
    for row, s in enumerate(scored):
        n = len(s)
        np.testing.assert_allclose(checked["prox_logprobs"][row, :n][mask[row, :n]],
                                   np.array(s)[mask[row, :n]], atol=1e-4)
    raw = np.exp(checked["prox_logprobs"] - checked["old_logprobs"])
    np.testing.assert_allclose(checked["is_weights"][mask], np.minimum(raw[mask], 2.0),
                               rtol=1e-5, atol=1e-6)
    assert np.all(checked["is_weights"][~mask] == 0)
    assert np.any(np.abs(raw[mask] - 1) > 1e-3), "behaviour and learner never differed"


def test_split_stale_drops_exactly_the_old_versions():
    from horizonrl.cluster.train.async_phase import split_stale
    from horizonrl.protos.trajectory import Trajectory

    def t(v):
        return Trajectory(trajectory_id=f"t{v}", group_id="g", task_id="x", env_name="e",
                          policy_version=v, horizon=1, prompt_ids=(1,), response_ids=(2,),
                          response_mask=(1,), response_logprobs=(0.0,), rewards=(0.0,),
                          reward=0.0, num_turns=1, terminated=True, truncated=False)

    fresh, stale = split_stale([t(5), t(4), t(3), t(2)], version=5, max_staleness=2)
    assert [x.policy_version for x in fresh] == [5, 4, 3]
    assert [x.policy_version for x in stale] == [2]
