"""Trajectories -> evaluation records: outcomes, turns and failures carried over exactly."""

from __future__ import annotations

from horizonrl.cluster.eval.evaluate import eval_env_configs, eval_tasks, to_records
from horizonrl.cluster.eval.metrics import invalid_action_rate, repeated_action_rate, summarise
from horizonrl.envpool.base import EVAL_SEED_OFFSET
from horizonrl.envpool.config import EnvConfig
from horizonrl.protos.trajectory import Failure, Trajectory


def _traj(group, actions, success, failure=Failure.NONE, invalid=0):
    n = len(actions)
    return Trajectory(
        trajectory_id=f"{group}-{len(actions)}-{success}", group_id=group, task_id=group,
        env_name="babyai", policy_version=0, horizon=4, prompt_ids=(1,),
        response_ids=(2,) * n, response_mask=(1,) * n, response_logprobs=(-0.1,) * n,
        rewards=(0.0,) * n, reward=float(success), num_turns=n, terminated=success,
        truncated=not success, failure=failure,
        info={"success": success, "invalid_actions": invalid, "actions": actions, "seed": 7})


def test_records_keep_outcomes_and_number_samples_per_task():
    trajs = [_traj("t1", ["go", "go", "left"], True),
             _traj("t1", ["left", "left"], False, invalid=1),
             _traj("t2", [], False, failure=Failure.ENV_ERROR)]
    recs = to_records("base", trajs, max_turns=4)
    assert [r.sample for r in recs] == [0, 1, 0]
    assert [r.success for r in recs] == [True, False, False]
    assert recs[2].failure == "env_error" and recs[0].failure == ""
    assert recs[0].seed == 7 and recs[1].invalid_actions == 1
    ok = recs[:2]
    assert repeated_action_rate(ok) == 2 / 5   # go->go and left->left, over 5 turns
    assert invalid_action_rate(ok) == 1 / 5
    cell = summarise(recs, [1, 2])["base"]["babyai"]["4"]
    assert cell["failed_episodes"] == 1 and cell["accuracy"] == 0.5
    assert cell["pass_at_k"]["2"]["value"] == 1.0  # t1: 1 of 2 samples succeeded


def test_eval_tasks_are_the_first_eval_seeds_of_each_env():
    envs = [EnvConfig(), EnvConfig(name="textcraft", kwargs={})]
    tasks = eval_tasks(envs, 3, "eval-h5")
    assert [t.seed for t in tasks] == [EVAL_SEED_OFFSET + i for i in range(3)] * 2
    assert [t.env for t in tasks] == ["babyai"] * 3 + ["textcraft"] * 3
    assert len({t.group for t in tasks}) == 6


def test_eval_pools_hold_one_replica_per_episode_unless_replicas_are_heavy():
    cheap = EnvConfig(name="babyai", replicas_per_actor=8)
    heavy = EnvConfig(name="miniwob", replicas_per_actor=4, num_actors=2,
                      eval_replicas_per_actor=4)
    sized = eval_env_configs([cheap, heavy], episodes=300)
    assert [e.replicas_per_actor for e in sized] == [300, 4]
    assert sized[1].num_actors == 2 and cheap.replicas_per_actor == 8  # copies, not edits
