"""Turn-level credit (learner.credit) on hand-worked numbers; the estimators' contract."""

import numpy as np
import pytest

from horizonrl.learner.batch import pad_batch, turn_rows
from horizonrl.learner.config import LearnerConfig
from horizonrl.learner.credit import estimator_names, make_estimator
from horizonrl.learner.credit.anchors import (
    anchor_groups,
    discounted_returns,
    episode_level,
    leave_one_out_baseline,
)
from horizonrl.protos.trajectory import Failure, Trajectory

R = np.sqrt(0.5)  # a two-member group normalised by its std: (x - mean) / std = +-1/sqrt(2)


def test_discounted_returns_by_hand():
    assert discounted_returns([0, 0, 1], 0.5).tolist() == [0.25, 0.5, 1.0]
    assert discounted_returns([0.2, 0, 1], 1.0).tolist() == [1.2, 1.0, 1.0]
    assert discounted_returns([], 0.9).tolist() == []


# Task group 0: A succeeds in 3 turns through states s0 s1 s2, B fails through s0 s1 s3.
# Task group 1: C passes through the same keys s0 s1 but is another task.
RETURNS = [discounted_returns([0, 0, 1], 0.5), np.zeros(3), np.zeros(2)]
KEYS = [["s0", "s1", "s2"], ["s0", "s1", "s3"], ["s0", "s1"]]


def test_anchor_groups_pair_equal_states_of_one_task_only():
    got = anchor_groups([0, 0, 1], KEYS, RETURNS, by_std=False, from_turn=0)
    assert sorted(got.groups) == [[(0, 0), (1, 0)], [(0, 1), (1, 1)]]  # C is never grouped
    # s0: returns 0.25 and 0 -> +-0.125; s1: 0.5 and 0 -> +-0.25; s2, s3 alone -> 0.
    assert got.advantage[0].tolist() == [0.125, 0.25, 0.0]
    assert got.advantage[1].tolist() == [-0.125, -0.25, 0.0]
    assert got.advantage[2].tolist() == [0.0, 0.0]
    by_std = anchor_groups([0, 0, 1], KEYS, RETURNS, by_std=True, from_turn=0)
    np.testing.assert_allclose(by_std.advantage[0], [R, R, 0.0], atol=1e-5)


def test_opening_turn_joins_no_anchor_group_but_a_return_to_it_does():
    got = anchor_groups([0, 0], [["s0", "s1", "s0"], ["s0", "s0", "s4"]],
                        [np.array([1.0, 2.0, 3.0]), np.array([0.0, 5.0, 0.0])], by_std=False)
    # Turn 0 is skipped; (0, 2) and (1, 1) are both back in s0: returns 3 and 5 -> -1, +1.
    assert got.groups == [[(0, 2), (1, 1)]]
    assert got.advantage[0].tolist() == [0.0, 0.0, -1.0]
    assert got.advantage[1].tolist() == [0.0, 1.0, 0.0]


def test_episode_level_and_leave_one_out_by_hand():
    np.testing.assert_allclose(episode_level([0, 0, 1], [1.0, 0.0, 1.0], by_std=False),
                               [0.5, -0.5, 0.0])
    base = leave_one_out_baseline([0, 0, 0, 1], [0.25, 0.0, 1.0, 3.0])
    np.testing.assert_allclose(base[:3], [0.5, 0.625, 0.125])
    assert np.isnan(base[3])


def _episode(tid, group, rewards, keys, *, failure=Failure.NONE, window=False,
             invalid=()) -> Trajectory:
    """An episode of len(rewards) turns: prompt [1, 2], each turn two model tokens then one
    observation token (none after the last)."""
    resp, mask, spans = [], [], []
    for k in range(len(rewards)):
        spans.append((0, len(resp), len(resp) + 2))
        resp += [10 + k, 11 + k]
        mask += [1, 1]
        if k < len(rewards) - 1:
            resp.append(5)
            mask.append(0)
    return Trajectory(
        trajectory_id=tid, group_id=group, task_id=group, env_name="babyai", policy_version=0,
        horizon=30, prompt_ids=(1, 2), response_ids=tuple(resp), response_mask=tuple(mask),
        response_logprobs=tuple(-0.5 * m for m in mask), rewards=tuple(rewards),
        reward=float(sum(rewards)), num_turns=len(rewards), terminated=True, truncated=False,
        failure=failure, info={"state_keys": list(keys), "invalid_turns": list(invalid)},
        turn_spans=tuple(spans) if window else ())


def _cfg(algorithm, **kw) -> LearnerConfig:
    return LearnerConfig(algorithm=algorithm, world_size=1, minibatches=1, **kw)


def test_gigpo_two_levels_combined_with_fallback_on_tokens():
    """Group g: A wins in 3 turns (s0 s1 s2), B loses in 3 (s0 s1 s3); turn_gamma 0.5,
    step weight 0.5, no std: episode level +-0.5; s1 (turn 1) returns 0.5 vs 0 -> +-0.25;
    turns 0 (opening) and 2 (no partner) fall back to the episode level."""
    trajs = [_episode("a", "g", [0, 0, 1], ["s0", "s1", "s2"]),
             _episode("b", "g", [0, 0, 0], ["s0", "s1", "s3"])]
    cfg = _cfg("gigpo", turn_gamma=0.5, step_adv_weight=0.5, norm_adv_by_std=False)
    credit = make_estimator(cfg).assign(trajs)
    assert credit.keep == [0, 1]
    np.testing.assert_allclose(credit.turn_advantages[0], [0.5, 0.625, 0.5])
    np.testing.assert_allclose(credit.turn_advantages[1], [-0.5, -0.625, -0.5])
    # Tokens: turn k's two model tokens get turn k's value; the observation between turns 0.
    np.testing.assert_allclose(credit.advantages[0], [0.5, 0.5, 0, 0.625, 0.625, 0, 0.5, 0.5])
    assert credit.stats["anchor_groups"] == 1.0
    assert credit.stats["anchor_group_size_mean"] == 2.0
    assert credit.stats["step_adv_nonzero_share"] == pytest.approx(2 / 6)


def test_gigpo_keeps_a_group_of_successes_whose_paths_differ():
    """Both win, A in 2 turns, B in 3 after a detour through s9 back to s1: GRPO has nothing to
    learn from, GiGPO's anchor s1 compares A's 1.0 with B's discounted 0.5 (gamma 0.5)."""
    trajs = [_episode("a", "g", [0, 1], ["s0", "s1"]),
             _episode("b", "g", [0, 0, 1], ["s0", "s9", "s1"]),
             _episode("c", "h", [0, 0], ["s0", "s1"])]  # a flat group with no anchor pair
    grpo = make_estimator(_cfg("grpo")).assign(trajs)
    gigpo = make_estimator(_cfg("gigpo", turn_gamma=0.5, norm_adv_by_std=False)).assign(trajs)
    # s1's returns tie (from s1 both win at once): no signal anywhere, like GRPO.
    assert grpo.keep == gigpo.keep == []
    # Now B wins a turn later from s1.
    trajs[1] = _episode("b", "g", [0, 0, 0, 1], ["s0", "s9", "s1", "s8"])
    gigpo = make_estimator(_cfg("gigpo", turn_gamma=0.5, norm_adv_by_std=False)).assign(trajs)
    assert gigpo.keep == [0, 1]
    np.testing.assert_allclose(gigpo.turn_advantages[0], [0.0, 0.25])  # 1.0 vs 0.5
    np.testing.assert_allclose(gigpo.turn_advantages[1], [0.0, 0.0, -0.25, 0.0])
    assert make_estimator(_cfg("gigpo")).fates(trajs) == {"trained": [0, 1],
                                                          "zero_variance": [2]}


def test_one_turn_episodes_train_exactly_as_grpo():
    trajs = [_episode(f"e{i}", f"g{i // 4}", [float(r)], ["s0"])
             for i, r in enumerate([1, 0, 0, 1, 1, 1, 1, 0])]
    trajs.append(_episode("x", "g0", [1.0], ["s0"], failure=Failure.TIMEOUT))
    grpo, gigpo = (make_estimator(_cfg(a)).assign(trajs) for a in ("grpo", "gigpo"))
    assert grpo.keep == gigpo.keep == list(range(8))
    a = pad_batch([trajs[i] for i in grpo.keep], grpo.advantages, pad_id=0)
    b = pad_batch([trajs[i] for i in gigpo.keep], gigpo.advantages, pad_id=0)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=0, atol=1e-6)


def test_turn_rloo_by_hand():
    """gamma 0.5: A's returns [0.25, 0.5, 1], B's [0, 0, 0], C's [1]; baselines are the other
    two's mean G_0: 0.5, 0.625, 0.125."""
    trajs = [_episode("a", "g", [0, 0, 1], "xyz"), _episode("b", "g", [0, 0, 0], "xyw"),
             _episode("c", "g", [1], "x")]
    credit = make_estimator(_cfg("turn_rloo", turn_gamma=0.5)).assign(trajs)
    np.testing.assert_allclose(credit.turn_advantages[0], [-0.25, 0.0, 0.5])
    np.testing.assert_allclose(credit.turn_advantages[1], [-0.625] * 3)
    np.testing.assert_allclose(credit.turn_advantages[2], [0.875])


def test_window_rows_carry_their_turns_advantage():
    trajs = [_episode("a", "g", [0, 0, 1], ["s0", "s1", "s2"], window=True),
             _episode("b", "g", [0, 0, 0], ["s0", "s1", "s3"], window=True)]
    cfg = _cfg("gigpo", turn_gamma=0.5, step_adv_weight=0.5, norm_adv_by_std=False)
    credit = make_estimator(cfg).assign(trajs)
    rows = turn_rows(trajs, pad_batch(trajs, credit.advantages, pad_id=0), pad_id=0)
    per_row = [float(r[m > 0].mean()) for r, m in zip(rows["advantages"], rows["loss_mask"])]
    np.testing.assert_allclose(per_row, [0.5, 0.625, 0.5, -0.5, -0.625, -0.5])


def test_rejected_commands_leave_only_positive_turns():
    from horizonrl.learner.batch import positive_turns_only

    t = _episode("a", "g", [0, 0, 1], ["s0", "s1", "s2"], invalid=(0, 1))
    masked = positive_turns_only(t, 0.0, np.array([-0.5, 0.25, 0.5]))
    # Turn 0 was rejected but its advantage is negative: it keeps its loss; turn 1 does not.
    assert masked.response_mask == (1, 1, 0, 0, 0, 0, 1, 1)
    assert positive_turns_only(t, -1.0, None) is t
    assert positive_turns_only(t, 1.0, None).response_mask == (0, 0, 0, 0, 0, 0, 1, 1)


def test_every_registered_estimator_answers_the_contract():
    trajs = [_episode("a", "g", [0, 1], ["s0", "s1"]), _episode("b", "g", [0, 0], ["s0", "s1"])]
    assert {"grpo", "rloo", "reinforce_pp", "ppo", "rejection_sampling", "gigpo",
            "turn_rloo"} <= set(estimator_names())
    for name in estimator_names():
        est = make_estimator(_cfg(name))
        credit = est.assign(trajs)
        assert len(credit.advantages) == len(credit.keep) == len(credit.turn_advantages)
        fates = est.fates(trajs)
        assert sorted(i for ids in fates.values() for i in ids) == [0, 1]
    with pytest.raises(ValueError, match=r"unknown learner\.algorithm 'nope'"):
        LearnerConfig(algorithm="nope")


def test_turn_gae_by_hand():
    from horizonrl.learner.credit.anchors import turn_gae

    # Rewards [0, 1], values [0.5, 0.8], gamma 0.5, lambda 1:
    # delta_1 = 1 - 0.8 = 0.2; delta_0 = 0 + 0.5 * 0.8 - 0.5 = -0.1; A_0 = -0.1 + 0.5 * 0.2.
    adv, ret = turn_gae([0.0, 1.0], [0.5, 0.8], gamma=0.5, lam=1.0)
    np.testing.assert_allclose(adv, [0.0, 0.2], atol=1e-12)
    np.testing.assert_allclose(ret, [0.5, 1.0])
    adv, _ = turn_gae([0.0, 1.0], [0.5, 0.8], gamma=0.5, lam=0.0)
    np.testing.assert_allclose(adv, [-0.1, 0.2])


def test_ppo_window_rows_get_one_value_and_advantage_per_turn():
    """Two window episodes (3 and 1 turns) as turn rows: the critic's value at each row's first
    model token is the turn's value; GAE runs across each episode's rows only."""
    import torch

    from horizonrl.learner.objectives import turn_gae_targets

    trajs = [_episode("a", "g", [0, 0, 1], ["s0", "s1", "s2"], window=True),
             _episode("b", "g", [1], ["s0"], window=True)]
    rows = turn_rows(trajs, pad_batch(trajs, [0.0, 0.0], pad_id=0), pad_id=0)
    assert rows["episode"].tolist() == [0, 0, 0, 1] and rows["turn"].tolist() == [0, 1, 2, 0]
    mask = torch.from_numpy(rows["loss_mask"])
    first = mask.argmax(-1)
    values = torch.zeros(mask.shape)
    for r, v in enumerate([0.5, 0.25, 0.5, 0.75]):
        values[r, first[r]:] = v  # the critic's value along the row; its first model token counts
    adv, ret = turn_gae_targets(torch.from_numpy(rows["token_rewards"]), values, mask,
                                torch.from_numpy(rows["episode"]),
                                torch.from_numpy(rows["turn"]), gamma=1.0, lam=1.0)
    # gamma = lambda = 1: A_k = (rewards from k on) - V_k; episode b alone: 1 - 0.75.
    per_row = [float(a[m > 0].mean()) for a, m in zip(adv, mask)]
    np.testing.assert_allclose(per_row, [0.5, 0.75, 0.5, 0.25])
    assert float(ret[0][mask[0] > 0].mean()) == pytest.approx(1.0)
    assert float((adv * (1 - mask)).abs().sum()) == 0.0


def test_default_estimator_is_the_grpo_it_replaced():
    """The default (`grpo`) keeps exactly the valid episodes of groups whose rewards differ and
    gives them `algorithms.grpo_advantages`; its fates are what the ledger recorded before."""
    import random

    import torch

    from horizonrl.learner import algorithms as alg
    from horizonrl.learner.batch import group_index, valid_mask
    from horizonrl.learner.credit import groups_with_signal

    rng = random.Random(3)
    trajs = [_episode(f"e{i}", f"g{i // 4}",
                      [0.0] * rng.randint(0, 3) + [float(rng.random() < 0.4)], [],
                      failure=Failure.TIMEOUT if rng.random() < 0.1 else Failure.NONE)
             for i in range(40)]
    credit = make_estimator(_cfg("grpo")).assign(trajs)
    valid = valid_mask(trajs)
    signal = set(groups_with_signal(trajs))
    want_keep = [i for i, t in enumerate(trajs) if valid[i] and t.group_id in signal]
    want = alg.grpo_advantages(torch.tensor([t.reward for t in trajs]),
                               torch.from_numpy(group_index(trajs)), torch.from_numpy(valid))
    assert credit.keep == want_keep and len(want_keep) > 0
    np.testing.assert_allclose(credit.advantages, want.numpy()[want_keep], rtol=0, atol=1e-7)
    fates = make_estimator(_cfg("grpo")).fates(trajs)
    assert fates["trained"] == want_keep
    assert sorted(fates["timeout"] + fates.get("zero_variance", []) + want_keep) == \
        list(range(40))


def test_dynamic_sampling_counts_the_estimators_signal():
    """A group of two successes whose paths differ has no reward variance but has GiGPO
    signal; a flat failing group has neither."""
    trajs = [_episode("a", "g", [0, 1], ["s0", "s1"]),
             _episode("b", "g", [0, 0, 0, 1], ["s0", "s9", "s1", "s8"]),
             _episode("c", "h", [0, 0], ["s0", "s1"]), _episode("d", "h", [0, 0], ["s0", "s1"])]
    assert make_estimator(_cfg("grpo")).signal_groups(trajs) == []
    for skip in (True, False):
        cfg = _cfg("gigpo", skip_zero_variance_groups=skip)
        assert make_estimator(cfg).signal_groups(trajs) == ["g"]
