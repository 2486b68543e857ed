"""Advantage and loss math against numbers computed by hand."""

import math

import pytest
import torch

from horizonrl.learner import algorithms as alg


def test_grpo_advantages_hand_computed():
    # Group a: rewards 1, 0, 0, 1 -> mean 0.5, unbiased std sqrt(1/3) = 0.57735.
    # Group b: rewards 1, 1 -> std 0 -> advantages 0 (no signal).
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    valid = torch.ones(6, dtype=torch.bool)
    adv = alg.grpo_advantages(rewards, groups, valid, eps=0.0)
    a = 0.5 / math.sqrt(1 / 3)
    assert adv.tolist() == pytest.approx([a, -a, -a, a, 0.0, 0.0], abs=1e-5)


def test_grpo_failed_episodes_are_masked_out_of_group_stats():
    # The env_error episode (index 2) must not count as a 0 reward: the group is then 1, 0, 1.
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    groups = torch.zeros(4, dtype=torch.long)
    valid = torch.tensor([True, True, False, True])
    adv = alg.grpo_advantages(rewards, groups, valid, eps=0.0)
    mean, std = 2 / 3, math.sqrt(((1 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2)
    assert adv.tolist() == pytest.approx(
        [(1 - mean) / std, (0 - mean) / std, 0.0, (1 - mean) / std], abs=1e-5)


def test_grpo_without_std_is_centred_rewards():
    adv = alg.grpo_advantages(torch.tensor([3.0, 1.0]), torch.tensor([0, 0]),
                              torch.tensor([True, True]), norm_by_std=False)
    assert adv.tolist() == [1.0, -1.0]


def test_clipped_loss_hand_computed():
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 9.0]]))  # ratios vs old logp 0
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, -1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last token is an env token
    loss, clip_frac, _ = alg.clipped_policy_loss(logp, old, adv, mask, clip=0.2)
    # token 1: A=1, r=1.5 -> max(-1.5, -1.2) = -1.2 (clipped)
    # token 2: A=-1, r=0.5 -> max(0.5, 0.8) = 0.8 (clipped)
    # token 3: A=1, r=1.1 -> max(-1.1, -1.1) = -1.1
    assert loss.item() == pytest.approx((-1.2 + 0.8 - 1.1) / 3, abs=1e-6)
    assert clip_frac.item() == pytest.approx(2 / 3)


def test_kl_estimators_hand_computed():
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    log_r = math.log(0.5)  # ref - logp
    assert alg.kl_penalty(logp, ref, "k1").item() == pytest.approx(-log_r)
    assert alg.kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * log_r**2)
    assert alg.kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 - 1 - log_r)
    with pytest.raises(ValueError, match="k1, k2 or k3"):
        alg.kl_penalty(logp, ref, "k9")


def test_token_logprobs_shift():
    # Uniform logits over 4 tokens: every position after the first has log(1/4).
    logits = torch.zeros(1, 3, 4)
    ids = torch.tensor([[0, 1, 2]])
    assert alg.token_logprobs(logits, ids)[0].tolist() == pytest.approx(
        [0.0, math.log(0.25), math.log(0.25)])


def test_changed_env_token_does_not_change_loss():
    torch.manual_seed(0)
    logp, old, adv = torch.randn(1, 6), torch.randn(1, 6), torch.ones(1, 6)
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 0.0]])
    base, _, _ = alg.clipped_policy_loss(logp, old, adv, mask, clip=0.2)
    logp2 = logp.clone()
    logp2[0, 2] += 5.0  # an observation token's logprob moves
    moved, _, _ = alg.clipped_policy_loss(logp2, old, adv, mask, clip=0.2)
    assert moved.item() == base.item()


def test_rloo_leave_one_out_with_invalid_member():
    # Group 0: valid rewards 1, 0, 3 and an invalid episode (reward 5, ignored).
    #   r=1: baseline (0 + 3) / 2 = 1.5 -> -0.5
    #   r=0: baseline (1 + 3) / 2 = 2.0 -> -2.0
    #   r=3: baseline (1 + 0) / 2 = 0.5 ->  2.5
    # Group 1: a single valid member -> 0.
    rewards = torch.tensor([1.0, 0.0, 5.0, 3.0, 2.0])
    groups = torch.tensor([0, 0, 0, 0, 1])
    valid = torch.tensor([True, True, False, True, True])
    adv = alg.rloo_advantages(rewards, groups, valid)
    assert adv.tolist() == pytest.approx([-0.5, -2.0, 0.0, 2.5, 0.0])


def test_reinforce_pp_return_carries_across_masked_span():
    # gamma 0.5; positions 2-3 are an observation (their reward 9 is ignored).
    # G5 = 2; G4 = 0 + 0.5*2 = 1; G1 = 0 + 0.5*G4 = 0.5 (no discount step for the span);
    # G0 = 1 + 0.5*0.5 = 1.25. Model-token returns 1.25, 0.5, 1, 2: mean 4.75/4 = 1.1875;
    # deviations .0625, -.6875, -.1875, .8125; squares sum 1.171875; unbiased var /3 = 0.390625,
    # std 0.625 -> A = .1, -1.1, -.3, 1.3 and 0 on the span.
    rewards = torch.tensor([[1.0, 0.0, 9.0, 9.0, 0.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]])
    adv = alg.reinforce_pp_advantages(rewards, mask, gamma=0.5, eps=0.0)
    assert adv[0].tolist() == pytest.approx([0.1, -1.1, 0.0, 0.0, -0.3, 1.3], abs=1e-6)


def test_reinforce_pp_batch_normalisation_and_group_baseline():
    # gamma 1. Returns per row: row 0 [1, 1], row 1 [0, 0], row 2 [3, 3], row 3 invalid.
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 3.0], [0.0, 100.0]])
    mask = torch.ones(4, 2)
    groups = torch.tensor([0, 0, 1, 1])
    valid = torch.tensor([True, True, True, False])
    # No baseline: tokens 1, 1, 0, 0, 3, 3 -> mean 4/3; squared deviations
    # 2*(1/9 + 16/9 + 25/9) = 28/3; unbiased var 28/15.
    adv = alg.reinforce_pp_advantages(rewards, mask, valid=valid, eps=0.0)
    mean, std = 4 / 3, math.sqrt(28 / 15)
    expected = [(g - mean) / std for g in (1, 1, 0, 0, 3, 3)] + [0.0, 0.0]
    assert adv.flatten().tolist() == pytest.approx(expected, abs=1e-6)
    # Group baseline: group 0 sequence returns 1, 0 -> mean 0.5; group 1 has one valid row
    # (return 3) -> subtracts itself. Tokens .5, .5, -.5, -.5, 0, 0: mean 0, squares sum 1,
    # unbiased var 1/5.
    adv = alg.reinforce_pp_advantages(rewards, mask, baseline="group", groups=groups,
                                      valid=valid, eps=0.0)
    a = 0.5 / math.sqrt(1 / 5)
    assert adv.flatten().tolist() == pytest.approx([a, a, -a, -a, 0, 0, 0, 0], abs=1e-6)
    with pytest.raises(ValueError, match="needs `groups`"):
        alg.reinforce_pp_advantages(rewards, mask, baseline="group")


def test_reinforce_pp_changed_env_token_does_not_change_advantage():
    torch.manual_seed(0)
    rewards = torch.randn(2, 7)
    mask = torch.tensor([[1.0, 1, 0, 0, 1, 0, 1], [0, 1, 1, 0, 0, 1, 1]])
    base = alg.reinforce_pp_advantages(rewards, mask, gamma=0.9)
    rewards2 = rewards.clone()
    rewards2[0, 2] += 5.0  # a reward landing on an observation token
    rewards2[1, 4] -= 3.0
    assert torch.equal(alg.reinforce_pp_advantages(rewards2, mask, gamma=0.9), base)


def test_gae_gamma_lam_one_is_return_to_go_minus_value():
    # Model tokens 0, 2, 3 (position 1 is an observation with value 7, never read).
    # Return-to-go over model tokens: 1, 1, 1 -> A = 1-0.5, 1-0.2, 1-0.6.
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 7.0, 0.2, 0.6]])
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    adv, ret = alg.gae_advantages(rewards, values, mask)
    assert adv[0].tolist() == pytest.approx([0.5, 0.0, 0.8, 0.4])
    assert ret[0].tolist() == pytest.approx([1.0, 0.0, 1.0, 1.0])


def test_gae_discounted_across_masked_span():
    # gamma 0.9, lam 0.8 (gamma*lam = 0.72); positions 2-3 are an observation.
    # t4: delta = 1 + 0 - 0.5 = 0.5;              A4 = 0.5
    # t1: delta = 0.5 + 0.9*0.5 - 0.3 = 0.65;     A1 = 0.65 + 0.72*0.5 = 1.01
    # t0: delta = 0 + 0.9*0.3 - 0.4 = -0.13;      A0 = -0.13 + 0.72*1.01 = 0.5972
    # returns = A + V: 0.9972, 1.31, 0, 0, 1.0
    rewards = torch.tensor([[0.0, 0.5, 0.0, 0.0, 1.0]])
    values = torch.tensor([[0.4, 0.3, 9.0, 9.0, 0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]])
    adv, ret = alg.gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8)
    assert adv[0].tolist() == pytest.approx([0.5972, 1.01, 0.0, 0.0, 0.5], abs=1e-6)
    assert ret[0].tolist() == pytest.approx([0.9972, 1.31, 0.0, 0.0, 1.0], abs=1e-6)


def test_gae_changed_env_token_does_not_change_advantage():
    torch.manual_seed(0)
    rewards, values = torch.randn(2, 6), torch.randn(2, 6)
    mask = torch.tensor([[1.0, 0, 0, 1, 1, 0], [1, 1, 0, 1, 0, 1]])
    base_adv, base_ret = alg.gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8)
    rewards2, values2 = rewards.clone(), values.clone()
    values2[0, 1] += 4.0  # the critic's value on an observation token
    rewards2[1, 4] += 2.0  # a reward on an observation token
    adv, ret = alg.gae_advantages(rewards2, values2, mask, gamma=0.9, lam=0.8)
    assert torch.equal(adv, base_adv) and torch.equal(ret, base_ret)


def test_dual_clip_bound_binds_for_negative_advantage():
    ratios = torch.tensor([[5.0, 0.5, 5.0, 1.0, 100.0]])
    logp, old = torch.log(ratios), torch.zeros(1, 5)
    adv = torch.tensor([[-1.0, -1.0, 2.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])  # the last token is an env token
    loss, clip_frac = alg.dual_clip_policy_loss(logp, old, adv, mask, clip=0.2, clip_c=3.0)
    # token 1: A=-1, r=5   -> PPO max(5, 1.2) = 5, dual min(5, 3) = 3 (dual bound binds)
    # token 2: A=-1, r=0.5 -> max(0.5, 0.8) = 0.8, min(0.8, 3) = 0.8 (PPO clip binds)
    # token 3: A=2,  r=5   -> max(-10, -2.4) = -2.4 (A >= 0: no dual bound)
    # token 4: A=-1, r=1   -> 1 (nothing binds)
    assert loss.item() == pytest.approx((3 + 0.8 - 2.4 + 1) / 4, abs=1e-6)
    assert clip_frac.item() == pytest.approx(3 / 4)
    ppo_loss, _, _ = alg.clipped_policy_loss(logp, old, adv, mask, clip=0.2)
    assert ppo_loss.item() == pytest.approx((5 + 0.8 - 2.4 + 1) / 4, abs=1e-6)


def test_aggregate_modes():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # row 2 empty
    # token-mean: (1 + 2 + 4) / 3 tokens
    assert alg.aggregate(loss, mask, "token-mean").item() == pytest.approx(7 / 3)
    # seq-mean-token-mean: rows 1.5 and 4, empty row skipped -> 2.75
    assert alg.aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx(2.75)
    # seq-mean-token-sum: rows 3 and 4, empty row skipped -> 3.5
    assert alg.aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx(3.5)
    with pytest.raises(ValueError, match="token-mean"):
        alg.aggregate(loss, mask, "sum")


def test_decoupled_loss_is_chosen_by_config_not_by_batch_keys() -> None:
    from horizonrl.learner.config import LearnerConfig
    from horizonrl.learner.objectives import policy_objective

    torch.manual_seed(0)
    logits = torch.randn(1, 5, 11)
    ids = torch.randint(0, 11, (1, 5))
    mb = {"input_ids": ids, "loss_mask": torch.tensor([[0.0, 1, 1, 1, 1]]),
          "advantages": torch.ones(1, 5), "old_logprobs": alg.token_logprobs(logits, ids)}
    plain, _ = policy_objective(logits, mb, LearnerConfig(decoupled_loss=False),
                                ref_logprobs=None)
    with pytest.raises(ValueError, match="prox_logprobs"):
        policy_objective(logits, mb, LearnerConfig(decoupled_loss=True), ref_logprobs=None)
    # Prox equal to the behaviour and unit weights: the decoupled form is the plain one.
    both = {**mb, "prox_logprobs": mb["old_logprobs"], "is_weights": torch.ones(1, 5)}
    decoupled, _ = policy_objective(logits, both, LearnerConfig(decoupled_loss=True),
                                    ref_logprobs=None)
    assert decoupled.item() == pytest.approx(plain.item())
    # A stray prox key does not switch a plain run to the decoupled loss.
    shifted = {**both, "prox_logprobs": mb["old_logprobs"] - 1.0}
    again, _ = policy_objective(logits, shifted, LearnerConfig(decoupled_loss=False),
                                ref_logprobs=None)
    assert again.item() == pytest.approx(plain.item())
