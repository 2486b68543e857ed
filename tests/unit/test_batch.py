"""Trajectories -> padded learner arrays: the loss mask covers model tokens only."""

import numpy as np

from horizonrl.learner.batch import group_index, pad_batch, split_rows, trim, valid_mask
from horizonrl.protos.trajectory import Failure, Trajectory


def _traj(tid, group, prompt, resp, mask, failure=Failure.NONE):
    return Trajectory(
        trajectory_id=tid, group_id=group, task_id="t", env_name="babyai", policy_version=0,
        horizon=3, prompt_ids=tuple(prompt), response_ids=tuple(resp),
        response_mask=tuple(mask), response_logprobs=tuple(-0.5 * m for m in mask),
        rewards=(1.0,), reward=1.0, num_turns=1, terminated=True, truncated=False,
        failure=failure)


def test_pad_batch_masks_and_alignment():
    a = _traj("a", "g0", [5, 6], [7, 8, 9], [1, 0, 1])
    b = _traj("b", "g1", [5], [7], [1], failure=Failure.ENV_ERROR)
    batch = pad_batch([a, b], [2.0, -1.0], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9], [5, 7, 0, 0, 0]]
    assert batch["loss_mask"].tolist() == [[0, 0, 1, 0, 1], [0, 1, 0, 0, 0]]
    assert batch["old_logprobs"][0].tolist() == [0, 0, -0.5, 0, -0.5]
    assert batch["advantages"][0].tolist() == [0, 0, 2, 2, 2]
    assert group_index([a, b, a]).tolist() == [0, 1, 0]
    assert valid_mask([a, b]).tolist() == [True, False]
    parts = split_rows(batch, 2)
    assert [len(p["input_ids"]) for p in parts] == [1, 1]
    assert trim(parts[1])["input_ids"].shape == (1, 2)
    assert np.array_equal(trim(parts[0])["input_ids"], batch["input_ids"][:1])


def test_groups_with_signal_ignores_failed_episodes():
    from horizonrl.learner.group import groups_with_signal

    def t(tid, group, reward, failure=Failure.NONE):
        base = _traj(tid, group, [1], [2], [1], failure=failure)
        return base.__class__(**{**{f: getattr(base, f) for f in base.__dataclass_fields__},
                                 "reward": reward, "rewards": (reward,)})

    trajs = [t("a", "g0", 1.0), t("b", "g0", 0.0),               # signal
             t("c", "g1", 1.0), t("d", "g1", 1.0),               # all equal
             t("e", "g2", 1.0), t("f", "g2", 0.0, Failure.TIMEOUT)]  # the 0 is a failure
    assert groups_with_signal(trajs) == ["g0"]


def test_token_rewards_sit_on_each_turns_last_model_token():
    from horizonrl.learner.batch import token_rewards

    base = _traj("a", "g", [1], [5, 6, 7, 8, 9, 10], [1, 1, 0, 0, 1, 0])
    two_turns = base.__class__(**{**{f: getattr(base, f) for f in base.__dataclass_fields__},
                                  "rewards": (0.5, 1.0), "reward": 1.5, "num_turns": 2})
    assert token_rewards(two_turns).tolist() == [0.0, 0.5, 0.0, 0.0, 1.0, 0.0]
    # Turn count and mask runs disagree: the episode reward goes on the last model token.
    assert token_rewards(base).tolist() == [0.0, 0.0, 0.0, 0.0, 1.0, 0.0]


def test_invalid_turns_leave_the_mask_by_spans_or_runs_and_only_when_located():
    from dataclasses import replace

    from horizonrl.learner.batch import without_invalid_turns

    base = _traj("a", "g", [1], [5, 6, 7, 8, 9, 10, 11], [1, 1, 0, 1, 0, 1, 1])
    three = replace(base, num_turns=3, info={"invalid_turns": [0, 2]})
    assert without_invalid_turns(three).response_mask == (0, 0, 0, 1, 0, 0, 0)
    # Windowed episodes carry their turn spans (window start, start, end).
    spans = replace(three, turn_spans=((0, 0, 2), (0, 3, 4), (3, 5, 7)),
                    info={"invalid_turns": [1]})
    assert without_invalid_turns(spans).response_mask == (1, 1, 0, 0, 0, 1, 1)
    # Runs and turn count disagree: the turns cannot be located, nothing changes.
    two = replace(three, num_turns=2)
    assert without_invalid_turns(two) is two
    assert without_invalid_turns(base) is base  # no invalid turns recorded
