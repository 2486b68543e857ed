"""`learner.overlong` downstream of `apply_overlong`: what evaluation reports and what the ledger
records for episodes cut by the horizon (no Ray: the pieces the driver chains, on hand-made
episodes whose numbers are known)."""

from __future__ import annotations

import pytest

from horizonrl.cluster.eval.evaluate import to_records
from horizonrl.cluster.eval.metrics import summarise
from horizonrl.cluster.train.ledger import Ledger
from horizonrl.learner.auxiliary import (
    dpo_pairs_from_groups,
    rejection_sampling_indices,
    sft_examples_from_trajectories,
)
from horizonrl.learner.batch import apply_overlong, token_rewards
from horizonrl.learner.config import LearnerConfig
from horizonrl.learner.group import LearnerGroup
from horizonrl.protos.trajectory import Trajectory

HORIZON = 3


def _episode(tid: str, group: str, reward: float, *, cut: bool, response=(5, 6)) -> Trajectory:
    """A success that the env ended (cut=False) or an episode the horizon cut (cut=True), with
    a shaped `reward` (what the env paid, whatever the outcome)."""
    n = len(response)
    turns = HORIZON if cut else 1
    return Trajectory(
        trajectory_id=tid, group_id=group, task_id=group, env_name="babyai", policy_version=0,
        horizon=HORIZON, prompt_ids=(1, 2), response_ids=tuple(response),
        response_mask=(1,) * n, response_logprobs=(-0.5,) * n, rewards=(0.0,) * turns,
        reward=reward, num_turns=turns, terminated=not cut, truncated=cut,
        info={"success": not cut, "actions": ["go"] * turns, "seed": 0,
              **({"cut": "horizon"} if cut else {})})


def _eval_batch() -> list[Trajectory]:
    # Env rewards 1.0, 0.0 and 0.25 (a shaped partial reward on a cut episode): mean 5/12.
    return [_episode("a", "t1", 1.0, cut=False), _episode("b", "t1", 0.0, cut=True),
            _episode("c", "t2", 0.25, cut=True)]


def test_eval_mean_reward_is_the_envs_under_the_overlong_penalty():
    """The driver's periodic eval collects through the same path as training, so its
    episodes carry the training penalty; the report must show what the env paid."""
    collected = apply_overlong(_eval_batch(), "penalty", 0.5)
    assert [t.reward for t in collected] == [1.0, -0.5, -0.25]  # what the learner sees
    records = to_records("policy", collected, max_turns=HORIZON)
    assert [r.reward for r in records] == [1.0, 0.0, 0.25]
    cell = summarise(records, [1])["policy"]["babyai"][str(HORIZON)]
    assert cell["mean_reward"] == pytest.approx(5 / 12)
    assert cell["accuracy"] == pytest.approx(1 / 3)


def test_eval_counts_masked_episodes_as_the_policy_played_them():
    """Masking keeps cut episodes out of the loss, not out of the policy's score."""
    records = to_records("policy", apply_overlong(_eval_batch(), "mask", 0.5), HORIZON)
    cell = summarise(records, [1])["policy"]["babyai"][str(HORIZON)]
    assert cell["episodes"] == 3 and cell["failed_episodes"] == 0
    assert cell["mean_reward"] == pytest.approx(5 / 12)


def _learner(algorithm: str) -> LearnerGroup:
    """The group's bookkeeping without ranks: `fates` reads only the config."""
    group = LearnerGroup.__new__(LearnerGroup)
    group.cfg = LearnerConfig(algorithm=algorithm, world_size=1, minibatches=1)
    return group


def _ledger_of(trajs: list[Trajectory], algorithm: str) -> tuple[dict, Ledger]:
    """Fates into a ledger the way the driver's `_account` does."""
    fates = _learner(algorithm).fates(trajs)
    led = Ledger()
    led.add_generated(t.trajectory_id for t in trajs)
    for fate, idx in fates.items():
        ids = [trajs[i].trajectory_id for i in idx]
        if fate == "trained":
            led.add_trained(ids, step=0)
        else:
            led.add_dropped(ids, fate, step=0)
    return fates, led


def _train_batch() -> list[Trajectory]:
    # Group g1: one success, two cut episodes (one with a positive shaped reward); g2: all cut.
    return [_episode("s", "g1", 1.0, cut=False, response=(5, 6)),
            _episode("p", "g1", 0.4, cut=True, response=(7, 8)),
            _episode("z", "g1", 0.0, cut=True, response=(9, 9)),
            _episode("y", "g2", 0.0, cut=True), _episode("x", "g2", 0.0, cut=True)]


@pytest.mark.parametrize("algorithm", ["grpo", "rejection_sampling"])
def test_masked_episodes_are_dropped_as_overlong_and_nothing_else(algorithm):
    """Every cut episode is `dropped:overlong`, once, and the ledger reconciles: rejection
    sampling must not pick a masked episode that looks successful (reward > 0)."""
    fates, led = _ledger_of(apply_overlong(_train_batch(), "mask", 0.5), algorithm)
    assert sorted(fates["overlong"]) == [1, 2, 3, 4]
    s = led.summary()
    assert s["reconciled"], led.conflicts
    assert s["dropped"]["overlong"] == 4
    # Only the success is left: alone in its group, GRPO has no signal; rejection sampling
    # keeps it.
    assert s["trained"] == (1 if algorithm == "rejection_sampling" else 0)


def test_penalised_episodes_are_trained_with_the_penalty():
    trajs = apply_overlong(_train_batch(), "penalty", 0.5)
    fates, led = _ledger_of(trajs, "grpo")
    # g1's rewards 1.0, -0.1, -0.5 have signal; g2's -0.5, -0.5 have none.
    assert sorted(fates["trained"]) == [0, 1, 2] and sorted(fates["zero_variance"]) == [3, 4]
    assert led.summary()["reconciled"]
    assert [t.reward for t in trajs[:3]] == pytest.approx([1.0, -0.1, -0.5])
    assert [t.info.get("env_reward") for t in trajs[:3]] == [None, 0.4, 0.0]


def test_token_rewards_carry_the_penalty_for_reinforce_pp_and_ppo():
    """REINFORCE++ and PPO read per-token rewards: a penalised cut episode's tokens must sum to
    its penalised reward, not to the env's turns alone."""
    cut = _episode("b", "t1", 0.25, cut=True, response=(5, 6, 7, 8, 9, 10))
    cut = cut.__class__(**{**{f: getattr(cut, f) for f in cut.__dataclass_fields__},
                           "response_mask": (1, 1, 0, 1, 0, 1),
                           "rewards": (0.0, 0.0, 0.25)})  # three turns: three runs
    [penalised] = apply_overlong([cut], "penalty", 0.5)
    tokens = token_rewards(penalised)
    assert tokens.sum() == pytest.approx(penalised.reward) == pytest.approx(-0.25)
    assert tokens[5] == pytest.approx(-0.25) and tokens[:5].sum() == 0.0
    assert token_rewards(cut).sum() == pytest.approx(0.25)  # no penalty: the env's turns


def test_offline_learners_leave_masked_episodes_out():
    """SFT and DPO on a run's saved trajectories follow the run's mask too."""
    trajs = apply_overlong(_train_batch()[:2], "mask", 0.5)
    assert rejection_sampling_indices(trajs) == [0]
    assert len(sft_examples_from_trajectories(trajs, only_successful=False)) == 1
    assert dpo_pairs_from_groups(trajs) == []
