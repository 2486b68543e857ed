"""Episodes that run independently over the real vLLM engine's continuous batching: the ids
and behaviour logprobs each episode recorded are exactly what the engine scores for the same
sequence (the learner-side check is tests/integration/test_training_loop.py; the default loop
is lock-step, `generator.loop=independent` chooses this one)."""

from __future__ import annotations

import pytest
from conftest import ONE_RANK, SUITE_MODEL

from horizonrl.actors.episodes import Episode, IndependentEpisodes
from horizonrl.actors.rollout import AgentLoop
from horizonrl.envpool.babyai import SYSTEM_PROMPT, parse_action
from horizonrl.envpool.config import EnvConfig
from horizonrl.envpool.pool import EnvPool
from horizonrl.protos.chat import ChatFormat

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]

TOL = 1e-4  # one engine, fp32: a batch of different composition sums in another order


def test_vllm_step_loop_records_the_engines_own_ids_and_logprobs(tiny_model_path, tokenizer):
    from horizonrl.actors.engine import VLLMEngine

    chat = ChatFormat(tokenizer)
    engine = VLLMEngine(str(tiny_model_path), seed=0, max_model_len=1024,
                        stop_token_ids=[chat.im_end_id], dtype="float32")
    pool = EnvPool(EnvConfig(kwargs={"level": "BabyAI-GoToRedBall-v0"}, in_process=True,
                             replicas_per_actor=8), name="it-independent")
    pool.wait_ready()
    eps = [Episode(i, "babyai", 7 + i // 4, AgentLoop(
        chat=chat, system_prompt=SYSTEM_PROMPT, parse_action=parse_action, horizon=4,
        max_context_tokens=1024, max_tokens_per_turn=8)) for i in range(12)]
    runner = IndependentEpisodes(engine, {"babyai": pool}, max_tokens=8, temperature=1.0,
                                 max_in_flight=8, on_done=lambda done: None)
    tally = runner.run(eps)
    assert tally.peak_in_flight == 8 and not engine.busy()
    assert tally.generated_tokens == sum(sum(ep.loop.response_mask) for ep in eps)

    seqs = [ep.loop.prompt_ids + ep.loop.response_ids for ep in eps]
    scored = engine.score(seqs)
    worst = 0.0
    for ep, s in zip(eps, scored):
        n = len(ep.loop.prompt_ids)
        for m, lp, ref in zip(ep.loop.response_mask, ep.loop.response_logprobs, s[n:]):
            if m:
                worst = max(worst, abs(lp - ref))
    print(f"\nmax |recorded - scored| = {worst:.2e} over {len(eps)} episodes")
    assert worst < TOL
    assert all(ep.loop.num_turns >= 1 for ep in eps)


def test_learner_scores_the_independent_loops_trajectories_as_recorded(tmp_path):
    """The whole stack with `generator.loop=independent` (Ray actor env, gRPC push): before any
    update, the learner's logprobs of every pushed trajectory equal the behaviour logprobs the
    engine recorded, token for token."""
    from pathlib import Path

    import ray

    from horizonrl.actors.generator import Task
    from horizonrl.cluster.config import load_config
    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.rollout.iteration import make_run_dir
    from horizonrl.cluster.train.driver import Trainer

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "configs/babyai-local.yaml", [
        *SUITE_MODEL, ONE_RANK,
        "name=indep", "iterations=1", "metrics.port=0", f"run_root={tmp_path}",
        "checkpoint_every=0", "generator.loop=independent", "generator.max_episodes_in_flight=6",
        "env.replicas_per_actor=8", "generator.tasks_per_step=3", "generator.group_size=4",
        "curriculum.horizons=[4]", "learner.dtype=float32", "generator.dtype=float32"])
    with ray_session(cfg.ray), Trainer(cfg, run_dir=make_run_dir(cfg)) as trainer:
        tasks = [Task(task_id=f"babyai-{s}", seed=s) for s in (3, 5, 8)]
        report = ray.get(trainer.generators[0].rollout.remote(tasks, group_size=4, step=0))
        trajs = trainer.ingest.drain()
        assert sorted(t.trajectory_id for t in trajs) == sorted(report.trajectory_ids)
        assert len(trajs) == 12 and report.seconds.generate > 0
        scored = trainer.learner.score([list(t.prompt_ids + t.response_ids) for t in trajs])
    worst = 0.0
    for t, s in zip(trajs, scored):
        n = len(t.prompt_ids)
        for m, lp, ref in zip(t.response_mask, t.response_logprobs, s[n:]):
            if m:
                worst = max(worst, abs(lp - ref))
    print(f"\nmax |behaviour - learner| = {worst:.2e} over {len(trajs)} trajectories")
    assert worst < TOL
