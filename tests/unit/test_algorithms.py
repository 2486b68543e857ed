"""Advantage and loss math against numbers computed by hand."""

import math

import pytest
import torch

from learner import algorithms as alg


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
