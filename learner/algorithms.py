"""Advantage and loss math as small pure tensor functions (checkable by hand).

Shapes: `[B]` per sequence, `[B, T]` per token; `mask` is 1 on model tokens, 0 elsewhere.
"""

from __future__ import annotations

import torch
from torch import Tensor


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """sum(x * mask) / sum(mask), 0 when the mask is empty (token-mean aggregation)."""
    return (x * mask).sum() / mask.sum().clamp_min(1)


def _valid_groups(rewards: Tensor, groups: Tensor, valid: Tensor):
    """Yield (member mask, valid rewards) for every group with at least 2 valid members."""
    for g in torch.unique(groups):
        idx = (groups == g) & valid
        if int(idx.sum()) >= 2:
            yield idx, rewards[idx].float()


def grpo_advantages(rewards: Tensor, groups: Tensor, valid: Tensor, *,
                    norm_by_std: bool = True, eps: float = 1e-6) -> Tensor:
    """GRPO: A_i = (r_i - mean(r_group)) / (std(r_group) + eps), per group of the same task.

    Only `valid` episodes (no infrastructure failure) enter the group statistics; invalid ones
    get advantage 0. `std` is the unbiased sample std (as in verl); a group with one valid
    member has advantage 0. `norm_by_std=False` drops the division (Dr.GRPO).
    """
    adv = torch.zeros_like(rewards, dtype=torch.float32)
    for idx, r in _valid_groups(rewards, groups, valid):
        centred = r - r.mean()
        std = r.std()
        # All-equal rewards: centred is all 0 already; skip the 0/0 that eps=0 would give.
        adv[idx] = centred / (std + eps) if norm_by_std and std > 0 else centred
    return adv


def surrogate_per_token(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, *,
                        clip: float, dual_clip: float | None = None
                        ) -> tuple[Tensor, Tensor, Tensor]:
    """The PPO surrogate per token, the one the learner trains with.

    With r = exp(logp - old_logp): L = max(-A*r, -A*clip(r, 1-e, 1+e)); with `dual_clip` c
    (Ye et al. 2020) L = min(L, -A*c) where A < 0, so a huge ratio on a bad token cannot blow
    up the loss. Returns (L, -A*r, r); a token was clipped where L != -A*r.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual clip must be > 1 (got {dual_clip}); 3.0 is the usual value")
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    per_token = torch.maximum(unclipped, -advantages * torch.clamp(ratio, 1.0 - clip, 1.0 + clip))
    if dual_clip is not None:
        per_token = torch.where(advantages < 0, torch.minimum(per_token, -advantages * dual_clip),
                                per_token)
    return per_token, unclipped, ratio


def clipped_policy_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                        *, clip: float) -> tuple[Tensor, Tensor, Tensor]:
    """PPO clipped surrogate, token-mean over `mask`; `old_logprobs` are the behaviour
    policy's (the generator's sampled logprobs). Returns (loss, clip fraction, ratio)."""
    per_token, unclipped, ratio = surrogate_per_token(logprobs, old_logprobs, advantages,
                                                      clip=clip)
    return (masked_mean(per_token, mask), masked_mean((per_token != unclipped).float(), mask),
            ratio)


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


def aggregate(loss_per_token: Tensor, mask: Tensor, mode: str, *,
              row_scale: Tensor | None = None, row_share: Tensor | None = None) -> Tensor:
    """Reduce a `[B, T]` per-token loss to a scalar over `mask`.

    "token-mean": sum(l * m) / sum(m), every model token weighs the same.
    "seq-mean-token-mean": mean over rows of (sum_t l*m / sum_t m), each row weighs the same.
    "seq-mean-token-sum": mean over rows of sum_t l*m (long rows weigh more; Dr.GRPO-style).
    Rows with an empty mask are skipped by both seq-mean modes, so padding rows do not dilute
    the mean; 0 when no row has a model token.

    Per-turn rows of window-context episodes (learner.batch.turn_rows) pass `row_scale` (in
    place of 1 / the row's tokens) and `row_share` (the row's share of its episode, summing to
    1 over the episode): the seq-mean modes then average over episodes rather than rows.
    """
    if mode == "token-mean":
        return masked_mean(loss_per_token, mask)
    row_tokens = mask.sum(-1)
    row_sum = (loss_per_token * mask).sum(-1)
    if row_share is None:
        row_share = (row_tokens > 0).float()
    if mode == "seq-mean-token-mean":
        per_row = row_sum * (row_scale if row_scale is not None else
                             1.0 / row_tokens.clamp_min(1))
    elif mode == "seq-mean-token-sum":
        per_row = row_sum
    else:
        raise ValueError(f"unknown aggregation {mode!r}; use token-mean, seq-mean-token-mean "
                         "or seq-mean-token-sum")
    return per_row.sum() / row_share.sum().clamp_min(1e-9)


def rloo_advantages(rewards: Tensor, groups: Tensor, valid: Tensor) -> Tensor:
    """RLOO: A_i = r_i - mean_{j != i} r_j over the valid members j of i's group.

    With n valid members summing to S this is r_i - (S - r_i) / (n - 1). Invalid episodes get
    advantage 0 and are left out of every baseline; a group with one valid member gets 0.
    """
    adv = torch.zeros_like(rewards, dtype=torch.float32)
    for idx, r in _valid_groups(rewards, groups, valid):
        adv[idx] = r - (r.sum() - r) / (len(r) - 1)
    return adv


def _masked_return_to_go(token_rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + gamma * G_next over model tokens only; 0 at masked positions.

    G_next is the return at the next model token of the row, so a masked span neither adds a
    discount step nor a reward: the return crosses it unchanged.
    """
    returns = torch.zeros_like(token_rewards, dtype=torch.float32)
    running = torch.zeros(token_rewards.shape[0], dtype=torch.float32)
    is_model = mask.bool()
    for t in range(token_rewards.shape[1] - 1, -1, -1):
        step = token_rewards[:, t].float() + gamma * running
        running = torch.where(is_model[:, t], step, running)
        returns[:, t] = torch.where(is_model[:, t], running, 0.0)
    return returns


def reinforce_pp_advantages(token_rewards: Tensor, mask: Tensor, *, gamma: float = 1.0,
                            baseline: str | None = None, groups: Tensor | None = None,
                            valid: Tensor | None = None, eps: float = 1e-8) -> Tensor:
    """REINFORCE++: batch-normalised discounted return-to-go, `[B, T]`.

    G_t = r_t + gamma * G_next, G_next being the return at the next model token of the row: the
    recursion runs over model tokens only, so an observation span carries the return across
    unchanged and costs no discount step.
    Rewards are expected on model tokens (e.g. the outcome on the last model token); rewards on
    masked positions are ignored. Then A_t = (G_t - mean(G)) / (std(G) + eps) with mean and
    unbiased std over every model token of the batch.

    `baseline="group"` (REINFORCE++ with baseline) first subtracts, from every G_t of row b,
    the mean over b's group (`groups`, valid rows only) of the sequence return R = G at the
    row's first model token. Rows with `valid` False get 0 and stay out of all statistics.
    """
    if valid is not None:
        mask = mask * valid[:, None].to(mask.dtype)
    returns = _masked_return_to_go(token_rewards, mask, gamma)
    if baseline == "group":
        if groups is None:
            raise ValueError("baseline='group' needs `groups` (the task id of each row)")
        has_tokens = mask.sum(-1) > 0
        first = mask.float().argmax(-1)  # index of the first model token (0 if none)
        seq_return = returns.gather(1, first[:, None]).squeeze(1)
        for g in torch.unique(groups):
            idx = (groups == g) & has_tokens
            if idx.any():
                returns[idx] -= seq_return[idx].mean()
    elif baseline is not None:
        raise ValueError(f"unknown baseline {baseline!r}; use None or 'group'")
    n = mask.sum()
    mean = masked_mean(returns, mask)
    var = (mask * (returns - mean).square()).sum() / (n - 1).clamp_min(1)
    return (returns - mean) / (var.sqrt() + eps) * mask


def gae_advantages(token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float = 1.0,
                   lam: float = 1.0) -> tuple[Tensor, Tensor]:
    """GAE over multi-turn rows whose env tokens are masked; returns (advantages, returns).

    The recursion visits model tokens only, from the right: with V_next the value at the next
    model token of the same row (0 after the last one) and A_next its advantage,
        delta_t = r_t + gamma * V_next - V_t,   A_t = delta_t + gamma * lam * A_next,
        return_t = A_t + V_t.
    Masked spans are skipped, so advantages and returns carry across observations (as in
    AgentGym-RL); masked positions get advantage 0 and return 0, and their rewards and values
    are never read. With gamma = lam = 1, A_t = (sum of rewards from t on) - V_t.
    """
    adv = torch.zeros_like(values, dtype=torch.float32)
    rows = values.shape[0]
    next_value = torch.zeros(rows, dtype=torch.float32)
    next_adv = torch.zeros(rows, dtype=torch.float32)
    is_model = mask.bool()
    for t in range(values.shape[1] - 1, -1, -1):
        v = values[:, t].float()
        delta = token_rewards[:, t].float() + gamma * next_value - v
        a = delta + gamma * lam * next_adv
        here = is_model[:, t]
        next_adv = torch.where(here, a, next_adv)
        next_value = torch.where(here, v, next_value)
        adv[:, t] = torch.where(here, a, 0.0)
    returns = (adv + values.float()) * mask
    return adv, returns


def dual_clip_policy_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor,
                          mask: Tensor, *, clip: float,
                          clip_c: float = 3.0) -> tuple[Tensor, Tensor]:
    """Dual-clip PPO (Ye et al. 2020), token-mean over `mask`: returns (loss, clip fraction =
    share of model tokens where either bound replaced -A*r). See `surrogate_per_token`."""
    per_token, unclipped, _ = surrogate_per_token(logprobs, old_logprobs, advantages, clip=clip,
                                                  dual_clip=clip_c)
    return masked_mean(per_token, mask), masked_mean((per_token != unclipped).float(), mask)
