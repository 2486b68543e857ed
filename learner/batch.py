"""Trajectories -> padded arrays the learner ranks train on (pure numpy, no torch, no Ray)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from protos.trajectory import Failure, Trajectory


def group_index(trajs: Sequence[Trajectory]) -> np.ndarray:
    """Integer id per distinct `group_id`, in order of first appearance."""
    ids: dict[str, int] = {}
    return np.array([ids.setdefault(t.group_id, len(ids)) for t in trajs], dtype=np.int64)


def valid_mask(trajs: Sequence[Trajectory]) -> np.ndarray:
    """True for episodes without an infrastructure failure (they enter group statistics)."""
    return np.array([t.failure is Failure.NONE for t in trajs], dtype=bool)


def pad_batch(trajs: Sequence[Trajectory], advantages: Sequence[float], *,
              pad_id: int) -> dict[str, np.ndarray]:
    """Right-padded `[B, T]` arrays over prompt + response.

    `loss_mask` is 1 exactly on the model's own tokens (response_mask 1), so observation and
    template tokens never carry gradient; `old_logprobs` holds the behaviour logprobs there.
    """
    width = max(len(t.prompt_ids) + len(t.response_ids) for t in trajs)
    b = len(trajs)
    input_ids = np.full((b, width), pad_id, dtype=np.int64)
    attention = np.zeros((b, width), dtype=np.int64)
    loss_mask = np.zeros((b, width), dtype=np.float32)
    old_logprobs = np.zeros((b, width), dtype=np.float32)
    adv = np.zeros((b, width), dtype=np.float32)
    rewards = np.zeros((b, width), dtype=np.float32)
    for row, (t, a) in enumerate(zip(trajs, advantages)):
        p, n = len(t.prompt_ids), len(t.response_ids)
        input_ids[row, :p] = t.prompt_ids
        input_ids[row, p:p + n] = t.response_ids
        attention[row, :p + n] = 1
        loss_mask[row, p:p + n] = t.response_mask
        old_logprobs[row, p:p + n] = t.response_logprobs
        adv[row, p:p + n] = a
        rewards[row, p:p + n] = token_rewards(t)
    return {"input_ids": input_ids, "attention_mask": attention, "loss_mask": loss_mask,
            "old_logprobs": old_logprobs, "advantages": adv, "token_rewards": rewards}


def token_rewards(t: Trajectory) -> np.ndarray:
    """Per-token rewards over `response_ids`: turn k's reward on the last model token of turn
    k (the k-th run of response_mask 1s). If the turn count and the runs disagree (a turn cut
    by the context limit), the episode reward goes on the last model token instead."""
    mask = np.asarray(t.response_mask, dtype=np.int64)
    out = np.zeros(len(mask), dtype=np.float32)
    ends = np.flatnonzero((mask == 1) & (np.append(mask[1:], 0) == 0))  # last token of each run
    if len(ends) == 0:
        return out
    if len(t.rewards) == len(ends):
        out[ends] = t.rewards
    else:
        out[ends[-1]] = t.reward
    return out


def split_rows(batch: dict[str, np.ndarray], parts: int) -> list[dict[str, np.ndarray]]:
    """Split along rows into `parts` near-equal pieces (every piece non-empty)."""
    rows = np.array_split(np.arange(len(next(iter(batch.values())))), parts)
    return [{k: v[r] for k, v in batch.items()} for r in rows]


def trim(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Drop padding columns that no row uses (a shard's longest row sets its width)."""
    width = int(batch["attention_mask"].sum(1).max())
    return {k: v[:, :width] for k, v in batch.items()}


def micro_batches(batch: dict[str, np.ndarray], count: int) -> list[dict[str, np.ndarray]]:
    """`count` trimmed row slices of `batch` (some may be empty when rows < count)."""
    rows = np.array_split(np.arange(len(batch["input_ids"])), count)
    return [trim({k: v[r] for k, v in batch.items()}) if len(r) else {} for r in rows]


def micro_batch_count(batch: dict[str, np.ndarray], token_budget: int) -> int:
    """How many micro-batches keep each under `token_budget` padded tokens (rows x width);
    1 when the budget is 0 (off). A single row over the budget still gets its own."""
    rows = len(batch["input_ids"])
    if token_budget <= 0 or rows == 0:
        return 1
    width = int(batch["attention_mask"].sum(1).max())
    per_micro = max(1, token_budget // max(width, 1))
    return -(-rows // per_micro)
