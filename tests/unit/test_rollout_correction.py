"""Rollout correction (learner.objectives): token-level truncated IS, sequence-level masking by
the geometric-mean ratio, and the sampler-vs-learner mismatch figures, on hand-worked ratios."""

import math

import pytest
import torch
from pydantic import ValidationError

from horizonrl.learner import algorithms as alg
from horizonrl.learner.config import LearnerConfig
from horizonrl.learner.objectives import (
    mismatch_stats,
    policy_objective,
    rollout_correction,
    sequence_keep,
)

LN2 = math.log(2.0)
# Row 0: ratios learner / vLLM of 2, 0.5, 4 (geometric mean 4^(1/3) = 1.587).
# Row 1: ratios 0.25, 0.25 and a pad token (geometric mean 0.25).
LOG_RATIO = torch.tensor([[LN2, -LN2, 2 * LN2], [-2 * LN2, -2 * LN2, 5.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
BEHAVIOUR = torch.full((2, 3), -1.5)
PROX = BEHAVIOUR + LOG_RATIO


def test_tis_truncates_each_token_at_the_cap():
    w, stats = rollout_correction(PROX, BEHAVIOUR, MASK, tis=True, cap=3.0, band=None)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 3.0], [0.25, 0.25, 0.0]]))
    assert stats["mismatch_truncated_share"].item() == pytest.approx(1 / 5)  # the ratio of 4
    assert "mismatch_masked_share" not in stats


def test_sequence_mask_drops_the_row_outside_the_band():
    keep = sequence_keep(LOG_RATIO, MASK, (0.5, 2.0))
    torch.testing.assert_close(keep, torch.tensor([1.0, 0.0]))  # 1.587 in, 0.25 out
    assert sequence_keep(LOG_RATIO, MASK, (0.5, 1.5)).tolist() == [0.0, 0.0]
    assert sequence_keep(LOG_RATIO, MASK, (0.2, 1.6)).tolist() == [1.0, 1.0]
    w, stats = rollout_correction(PROX, BEHAVIOUR, MASK, tis=False, cap=3.0, band=(0.5, 2.0))
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert stats["mismatch_masked_share"].item() == pytest.approx(2 / 5)
    assert "mismatch_truncated_share" not in stats  # no TIS, nothing truncated


def test_tis_and_sequence_mask_combine():
    w, _ = rollout_correction(PROX, BEHAVIOUR, MASK, tis=True, cap=3.0, band=(0.5, 2.0))
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 3.0], [0.0, 0.0, 0.0]]))


def test_a_row_without_model_tokens_is_kept():
    assert sequence_keep(torch.zeros(1, 2), torch.zeros(1, 2), (0.9, 1.1)).tolist() == [1.0]


def test_mismatch_figures_by_hand():
    stats = mismatch_stats(PROX, BEHAVIOUR, MASK)
    # |log r|: ln2, ln2, 2ln2, 2ln2, 2ln2 over 5 model tokens (the pad's 5.0 is off the mask).
    assert stats["mismatch_log_ratio_abs_mean"].item() == pytest.approx(8 * LN2 / 5, rel=1e-6)
    assert stats["mismatch_log_ratio_abs_max"].item() == pytest.approx(2 * LN2, rel=1e-6)
    k3 = [r - 1 - math.log(r) for r in (2.0, 0.5, 4.0, 0.25, 0.25)]
    assert stats["mismatch_kl"].item() == pytest.approx(sum(k3) / 5, rel=1e-5)
    zero = mismatch_stats(BEHAVIOUR, BEHAVIOUR, MASK)
    assert all(v.item() == 0.0 for v in zero.values())


def test_mismatch_kl_of_near_equal_logprobs_is_small_and_never_negative():
    """Logprobs 1e-6..1e-4 apart (vLLM and the learner on the same weights): k3 is lr^2 / 2 per
    token, far below float32's rounding of exp(lr) - 1, which made it negative before."""
    gen = torch.Generator().manual_seed(0)
    behaviour = -torch.rand(64, 32, generator=gen) * 5
    for scale in (1e-6, 1e-5, 1e-4):
        learner = behaviour + torch.randn(64, 32, generator=gen) * scale
        lr = (learner - behaviour).double()
        kl = mismatch_stats(learner, behaviour, torch.ones(64, 32))["mismatch_kl"].item()
        assert 0 <= kl == pytest.approx((lr ** 2 / 2).mean().item(), rel=1e-3)


def test_policy_objective_gives_a_masked_row_no_policy_loss():
    cfg = LearnerConfig(kl_coef=0.0)
    logits = torch.randn(2, 3, 7)
    ids = torch.randint(0, 7, (2, 3))
    mb = {"input_ids": ids, "loss_mask": MASK, "advantages": torch.ones(2, 3),
          "old_logprobs": torch.full((2, 3), -1.0)}
    both, _ = policy_objective(logits, {**mb, "is_weights": torch.ones(2, 3)}, cfg,
                               ref_logprobs=None)
    masked, st = policy_objective(logits, {**mb, "is_weights": MASK * torch.tensor([[1.0], [0.0]])},
                                  cfg, ref_logprobs=None)
    row0, _ = policy_objective(logits, {**mb, "loss_mask": MASK * torch.tensor([[1.0], [0.0]])},
                               cfg, ref_logprobs=None)
    # token-mean over 5 tokens with row 1 weighted 0 equals row 0's mean over 3, times 3/5.
    assert masked.item() == pytest.approx(row0.item() * 3 / 5, rel=1e-5)
    assert masked.item() != pytest.approx(both.item())
    assert "mismatch_kl" not in st  # the correction pass reports the mismatch, not the step


def test_policy_objective_reports_the_mismatch_without_a_correction():
    cfg = LearnerConfig(kl_coef=0.0)
    logits = torch.randn(1, 4, 5)
    ids = torch.randint(0, 5, (1, 4))
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    mb = {"input_ids": ids, "loss_mask": mask, "advantages": torch.ones(1, 4),
          "old_logprobs": torch.full((1, 4), -1.0)}
    _, st = policy_objective(logits, mb, cfg, ref_logprobs=None)
    lr = (alg.token_logprobs(logits, ids) + 1.0)[mask > 0]
    assert st["mismatch_log_ratio_abs_max"].item() == pytest.approx(lr.abs().max().item())
    assert st["mismatch_kl"].item() == pytest.approx((lr.exp() - 1 - lr).mean().item(), rel=1e-5)


@pytest.mark.parametrize("band", [(1.2, 2.0), (0.5, 0.9), (0.0, 2.0), (2.0, 0.5)])
def test_band_must_hold_one(band):
    with pytest.raises(ValidationError, match="seq_mask_band"):
        LearnerConfig(seq_mask_band=band)
