"""Advantage and loss math as small pure tensor functions (checkable by hand).

Shapes: `[B]` per sequence, `[B, T]` per token; `mask` is 1 on model tokens, 0 elsewhere.
"""

from __future__ import annotations

import torch
from torch import Tensor


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """sum(x * mask) / sum(mask), 0 when the mask is empty (token-mean aggregation)."""
    return (x * mask).sum() / mask.sum().clamp_min(1)


def grpo_advantages(rewards: Tensor, groups: Tensor, valid: Tensor, *,
                    norm_by_std: bool = True, eps: float = 1e-6) -> Tensor:
    """GRPO: A_i = (r_i - mean(r_group)) / (std(r_group) + eps), per group of the same task.

    Only `valid` episodes (no infrastructure failure) enter the group statistics; invalid ones
    get advantage 0. `std` is the unbiased sample std (as in verl); a group with one valid
    member has advantage 0. `norm_by_std=False` drops the division (Dr.GRPO).
    """
    adv = torch.zeros_like(rewards, dtype=torch.float32)
    for g in torch.unique(groups):
        idx = (groups == g) & valid
        n = int(idx.sum())
        if n < 2:
            continue
        r = rewards[idx].float()
        centred = r - r.mean()
        std = r.std()
        # All-equal rewards: centred is all 0 already; skip the 0/0 that eps=0 would give.
        adv[idx] = centred / (std + eps) if norm_by_std and std > 0 else centred
    return adv


def clipped_policy_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                        *, clip: float) -> tuple[Tensor, Tensor, Tensor]:
    """PPO clipped surrogate: mean over tokens of max(-A*ratio, -A*clip(ratio, 1-e, 1+e)).

    `old_logprobs` are the behaviour policy's (the generator's sampled logprobs). Returns
    (loss, clip fraction, ratio) with the loss token-mean aggregated over `mask`.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip, 1.0 + clip)
    loss = masked_mean(torch.maximum(unclipped, clipped), mask)
    clip_frac = masked_mean((clipped > unclipped).float(), mask)
    return loss, clip_frac, ratio


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: str = "k3") -> Tensor:
    """Per-token KL(pi || ref) estimators from log r = ref - logp (Schulman's k1, k2, k3).

    k1 = -log r; k2 = (log r)^2 / 2; k3 = r - 1 - log r (non-negative, low variance).
    """
    log_r = ref_logprobs - logprobs
    if kind == "k1":
        return -log_r
    if kind == "k2":
        return 0.5 * log_r.square()
    if kind == "k3":
        return torch.exp(log_r) - 1.0 - log_r
    raise ValueError(f"unknown KL estimator {kind!r}; use k1, k2 or k3")


def token_logprobs(logits: Tensor, input_ids: Tensor) -> Tensor:
    """Logprob of each token given its prefix, `[B, T]`, position 0 set to 0.

    Logits at position t predict token t+1, hence the shift.
    """
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Per-position entropy of the next-token distribution, aligned like `token_logprobs`."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    ent = -(logp.exp() * logp).sum(-1)
    return torch.cat([torch.zeros_like(ent[:, :1]), ent], dim=1)
