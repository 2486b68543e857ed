"""Window-context episodes on the whole stack: local Ray, vLLM, gRPC, 2 DeepSpeed ranks, BabyAI.

Each turn's row, rebuilt by the learner from the trajectory's spans, is scored by the learner and
by the generator's engine; both must give the logprobs vLLM recorded when it sampled the turn
(the learning rate is negligible, so the one update leaves the weights as they were). A window of
one turn is far shorter than the episodes, so a wrong slice would show at once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SUITE_MODEL

from horizonrl.cluster.config import load_config

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]
ROOT = Path(__file__).resolve().parents[2]


def test_rows_are_the_contexts_vllm_sampled_from(tmp_path):
    import numpy as np
    import ray

    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.rollout.iteration import make_run_dir
    from horizonrl.cluster.train.driver import Trainer
    from horizonrl.learner.batch import pad_batch, turn_rows

    cfg = load_config(ROOT / "configs/babyai-local.yaml", [
        *SUITE_MODEL,
        "name=window", "iterations=1", "metrics.port=0", f"run_root={tmp_path}",
        "checkpoint_every=0", "env.replicas_per_actor=16", "generator.tasks_per_step=4",
        "generator.group_size=4", "curriculum.horizons=[5]", "generator.context.mode=window",
        "generator.context.keep_turns=1", "learner.minibatches=1", "learner.lr=1e-12",
        "learner.warmup_steps=0", "learner.skip_zero_variance_groups=false",
        "learner.dtype=float32", "generator.dtype=float32"])  # the 1e-4 logprob checks need fp32
    with ray_session(cfg.ray), Trainer(cfg, run_dir=make_run_dir(cfg)) as trainer:
        m = trainer.step()
        trajs = trainer.last_trajectories
        assert all(len(t.turn_spans) == t.num_turns for t in trajs)
        assert any(t.turn_spans[-1][0] > 0 for t in trajs), "no episode outgrew its window"
        rows = sum(t.rows for t in trajs)
        assert m["learner"]["episodes_trained"] == len(trajs) == 16
        assert m["learner"]["rows_trained"] == rows > len(trajs)
        assert m["rows_per_episode"] == pytest.approx(rows / len(trajs))
        assert m["ledger"]["reconciled"] and m["ledger"]["trained"] == 16

        long = sorted(trajs, key=lambda t: -t.num_turns)[:2]
        batch = turn_rows(long, pad_batch(long, [0.0] * len(long), pad_id=0), pad_id=0)
        n = batch["attention_mask"].sum(1)
        seqs = [batch["input_ids"][r, :n[r]].tolist() for r in range(len(n))]
        learner = trainer.learner.score(seqs)
        engine = ray.get(trainer.generators[0].score.remote(seqs))
        for r in range(len(seqs)):
            # score()[i] is the logprob of token i given tokens < i: the loss mask's positions.
            mask = batch["loss_mask"][r, :n[r]] > 0
            recorded = batch["old_logprobs"][r, :n[r]][mask]
            for name, got in (("learner", learner[r]), ("vLLM", engine[r])):
                diff = np.abs(np.asarray(got)[mask] - recorded).max()
                assert diff < 1e-4, f"row {r}: {name} vs the sampled logprobs differ by {diff}"
