"""The per-micro-batch objectives a learner rank minimises, built from learner.algorithms.

Kept apart from the DeepSpeed plumbing in worker.py so they run (and are tested) on any module:
the ZeRO-vs-torch reference test calls exactly these on a plain torch model.
"""

from __future__ import annotations

import torch
from torch import Tensor

from horizonrl.learner import algorithms as alg
from horizonrl.learner.config import LearnerConfig


def policy_objective(logits: Tensor, mb: dict[str, Tensor], cfg: LearnerConfig, *,
                     ref_logprobs: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped (or dual-clipped) surrogate on `mb["advantages"]` against the behaviour
    logprobs (or, with `cfg.decoupled_loss`, against `mb["prox_logprobs"]`), each token
    weighted by `mb["is_weights"]` where the caller computed them (rollout_correction), aggregated
    by `cfg.loss_agg`, plus `kl_coef` x KL to the reference (unless the KL went into the
    rewards) minus `entropy_coef` x entropy. Returns (loss, detached stats)."""
    return policy_loss(alg.token_logprobs(logits, mb["input_ids"]),
                       alg.entropy_from_logits(logits), mb, cfg, ref_logprobs=ref_logprobs)


def policy_loss(logp: Tensor, entropy: Tensor, mb: dict[str, Tensor], cfg: LearnerConfig, *,
                ref_logprobs: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
    """`policy_objective` from the rows' token logprobs and entropies (`[B, T]`, aligned like
    `algorithms.token_logprobs`), however the forward pass laid the rows out (learner.layout)."""
    mask = mb["loss_mask"]
    # Decoupled PPO (off-policy batches): the trust region is around the learner's own
    # pre-update policy ("prox"), and the gap to the behaviour policy that sampled the tokens
    # is corrected by a truncated importance weight.
    decoupled = bool(cfg.decoupled_loss)
    if decoupled and "prox_logprobs" not in mb:
        raise ValueError("learner.decoupled_loss is on but the micro-batch has no prox_logprobs "
                         "and is_weights (LearnerWorker._correction_inputs computes them)")
    per_token, unclipped, ratio = alg.surrogate_per_token(
        logp, mb["prox_logprobs" if decoupled else "old_logprobs"], mb["advantages"],
        clip=cfg.clip_ratio, dual_clip=cfg.dual_clip)
    if "is_weights" in mb:  # rollout correction: TIS and/or sequence masking
        per_token = per_token * mb["is_weights"]
    pg = alg.aggregate(per_token, mask, cfg.loss_agg, row_scale=mb.get("row_scale"),
                       row_share=mb.get("row_share"))
    loss = pg
    kl = torch.zeros(())
    if ref_logprobs is not None:
        kl = alg.masked_mean(alg.kl_penalty(logp, ref_logprobs, cfg.kl_estimator), mask)
        if not cfg.kl_in_reward:
            loss = loss + cfg.kl_coef * kl
    entropy = alg.masked_mean(entropy, mask)
    if cfg.entropy_coef:
        loss = loss - cfg.entropy_coef * entropy
    with torch.no_grad():
        stats = {"pg_loss": pg.detach(), "kl": kl.detach(), "entropy": entropy.detach(),
                 "clip_frac": alg.masked_mean((per_token != unclipped).float(), mask),
                 "ratio_max_dev": ((ratio - 1).abs() * mask).max()}
        if "is_weights" in mb:
            stats["is_weight_mean"] = alg.masked_mean(mb["is_weights"], mask)
        else:  # the sampler-vs-learner gap; the worker keeps it from an update's first step
            stats.update(mismatch_stats(logp, mb["old_logprobs"], mask))
    return loss, stats


def value_objective(values: Tensor, mb: dict[str, Tensor],
                    clip: float) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's clipped value loss: 0.5 * mean over model tokens of
    max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2), R the GAE returns."""
    mask, returns, old = mb["loss_mask"], mb["returns"], mb["old_values"]
    clipped = old + torch.clamp(values - old, -clip, clip)
    per_token = torch.maximum((values - returns).square(), (clipped - returns).square())
    loss = 0.5 * alg.masked_mean(per_token, mask)
    with torch.no_grad():
        frac = alg.masked_mean(((clipped - returns).square() > (values - returns).square())
                               .float(), mask)
    return loss, {"value_loss": loss.detach(), "value_clip_frac": frac}


def whiten(x: Tensor, mask: Tensor, *, sums: Tensor | None = None, eps: float = 1e-8) -> Tensor:
    """(x - mean) / std over masked entries; `sums` = (sum, sum of squares, count) when the
    statistics come from every rank (all-reduced), else this tensor's own."""
    if sums is None:
        sums = torch.stack([(x * mask).sum(), (x.square() * mask).sum(), mask.sum()])
    total, sq, n = sums[0], sums[1], sums[2].clamp_min(1)
    mean = total / n
    var = (sq / n - mean.square()).clamp_min(0)
    return (x - mean) / (var.sqrt() + eps) * mask


def importance_weights(prox_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor,
                       cap: float) -> Tensor:
    """Truncated importance weights min(exp(prox - behaviour), cap) on model tokens (0
    elsewhere)."""
    return torch.clamp(torch.exp(prox_logprobs - behaviour_logprobs) * mask, max=cap)


def sequence_keep(log_ratio: Tensor, mask: Tensor, band: tuple[float, float]) -> Tensor:
    """Sequence-level rollout masking: 1 for the rows whose geometric-mean ratio
    exp(mean over model tokens of log(learner / vLLM)) lies inside `band` (inclusive), else 0;
    `[rows]`. A row without model tokens is kept (it trains nothing either way)."""
    n = mask.sum(-1)
    geo = torch.exp((log_ratio * mask).sum(-1) / n.clamp_min(1))
    inside = (geo >= band[0]) & (geo <= band[1])
    return (inside | (n == 0)).to(mask.dtype)


def mismatch_stats(learner_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor, *,
                   cap: float | None = None, keep: Tensor | None = None) -> dict[str, Tensor]:
    """How far the sampler's (vLLM's) token logprobs are from the learner's on the same tokens,
    before any update: mean and max |log ratio|, KL(vLLM || learner) by the k3 estimator on
    vLLM's samples (E[r - 1 - log r], r = learner / vLLM: unbiased and never negative), the
    share of tokens whose ratio `cap` truncates, and the share that `keep` (sequence_keep)
    masks out."""
    m = mask.float()
    n = m.sum().clamp_min(1)
    lr = (learner_logprobs - behaviour_logprobs) * m
    ratio = torch.exp(lr)
    # r - 1 - log r is lr^2 / 2 at near-equal logprobs (1e-10 at 1e-5 apart), below the
    # rounding of exp(lr) - 1 in float32: in float64 via expm1, and clamped per token, it
    # stays the non-negative estimate it is (it read -5.5e-11 on equal weights before).
    d = lr.double()
    k3 = (torch.expm1(d) - d).clamp_min(0) * m
    out = {"mismatch_log_ratio_abs_mean": lr.abs().sum() / n,
           "mismatch_log_ratio_abs_max": lr.abs().max() if m.any() else torch.zeros(()),
           "mismatch_kl": (k3.sum() / n).to(lr.dtype)}
    if cap is not None:
        out["mismatch_truncated_share"] = ((ratio > cap).float() * m).sum() / n
    if keep is not None:
        out["mismatch_masked_share"] = ((1 - keep.float())[:, None] * m).sum() / n
    return {k: v.detach() for k, v in out.items()}


def rollout_correction(prox_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor, *,
                       tis: bool, cap: float, band: tuple[float, float] | None,
                       ) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token loss weights that correct for the gap between the policy that sampled the
    tokens (vLLM: `behaviour_logprobs`) and the learner's own pre-update policy (`prox`):
    token-level truncated importance sampling min(exp(prox - behaviour), cap) when `tis`
    (else 1), times 0 on the rows `sequence_keep` rejects when `band` is set. A masked row
    keeps its place in the loss's denominator, as if its advantages were 0, so the step's
    scale does not depend on how many rows were masked. Returns (weights [rows, T], 0 off the
    mask; mismatch_stats)."""
    m = mask.float()
    weights = importance_weights(prox_logprobs, behaviour_logprobs, m, cap) if tis else m
    keep = None
    if band is not None:
        keep = sequence_keep(prox_logprobs - behaviour_logprobs, m, band)
        weights = weights * keep[:, None]
    stats = mismatch_stats(prox_logprobs, behaviour_logprobs, m, cap=cap if tis else None,
                           keep=keep)
    return weights, stats


def turn_gae_targets(rewards: Tensor, values: Tensor, mask: Tensor, episode: Tensor,
                     turn: Tensor, *, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """PPO across the turn rows of window-mode episodes (learner.batch.turn_rows): a row's
    reward is the sum of its tokens', its value the critic's at its first model token (the
    state the turn was taken in, with the window the turn saw); GAE runs over each episode's
    turns in order (credit.anchors.turn_gae) and every model token of a row gets its turn's
    advantage and return. Returns (advantages, returns), `[rows, T]`, 0 off the mask."""
    from horizonrl.learner.credit.anchors import turn_gae

    first = mask.float().argmax(-1)
    v = values.gather(1, first[:, None]).squeeze(1).double().cpu().numpy()
    r = (rewards * mask).sum(-1).double().cpu().numpy()
    ep, k = episode.cpu().numpy(), turn.cpu().numpy()
    adv = torch.zeros(len(v), dtype=torch.float64)
    ret = torch.zeros(len(v), dtype=torch.float64)
    for e in set(ep.tolist()):
        rows = [i for i in sorted(range(len(ep)), key=lambda i: k[i]) if ep[i] == e]
        a, g = turn_gae(r[rows], v[rows], gamma=gamma, lam=lam)
        adv[rows], ret[rows] = torch.from_numpy(a), torch.from_numpy(g)
    m = mask.float()
    return adv.float().to(m.device)[:, None] * m, ret.float().to(m.device)[:, None] * m
