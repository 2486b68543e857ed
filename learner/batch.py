"""Trajectories -> padded arrays the learner ranks train on (pure numpy, no torch, no Ray)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from horizonrl.protos.trajectory import Failure, Trajectory


def group_index(trajs: Sequence[Trajectory]) -> np.ndarray:
    """Integer id per distinct `group_id`, in order of first appearance."""
    ids: dict[str, int] = {}
    return np.array([ids.setdefault(t.group_id, len(ids)) for t in trajs], dtype=np.int64)


def valid_mask(trajs: Sequence[Trajectory]) -> np.ndarray:
    """True for episodes without an infrastructure failure that are not masked as over-long
    (`apply_overlong`): they enter group statistics and the loss."""
    return np.array([t.failure is Failure.NONE and not t.info.get("overlong_masked")
                     for t in trajs], dtype=bool)


def apply_overlong(trajs: Sequence[Trajectory], mode: str, penalty: float) -> list[Trajectory]:
    """`learner.overlong` on episodes cut by the context limit or the horizon (`t.cut`).

    train: unchanged. mask: flagged `overlong_masked` (out of the loss and of their group's
    statistics; the ledger's reason is `overlong`). penalty: reward - `penalty`, the env's
    reward kept in info["env_reward"]. Applied once, where the driver collects a step's
    trajectories, so dynamic sampling, advantages and the ledger all see the same rewards.
    """
    if mode == "train":
        return list(trajs)
    if mode not in ("mask", "penalty"):
        raise ValueError(f"unknown overlong mode {mode!r}; use train, mask or penalty")
    out = []
    for t in trajs:
        if t.cut is None or t.failure is not Failure.NONE:
            out.append(t)
        elif mode == "mask":
            out.append(replace(t, info={**t.info, "overlong_masked": True}))
        else:
            out.append(replace(t, reward=t.reward - penalty,
                               info={**t.info, "env_reward": t.reward}))
    return out


def model_turn_ranges(t: Trajectory) -> list[tuple[int, int]] | None:
    """[start, end) in `response_ids` of each turn's sampled tokens, in turn order: the turn
    spans when the episode kept them (windowed contexts), else the runs of `response_mask` 1
    (observations, mask 0, separate the turns). None when the runs do not match the turn count
    (a turn with no trainable token, as in a demonstration's injected action)."""
    if t.turn_spans:
        return [(start, end) for _, start, end in t.turn_spans]
    runs = _mask_runs(t.response_mask)
    return runs if len(runs) == t.num_turns else None


def _mask_runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s."""
    m = np.asarray(mask, dtype=np.int8)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], m, [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def without_invalid_turns(t: Trajectory, turns: Sequence[int] | None = None) -> Trajectory:
    """`t` with the tokens of the turns whose action the env rejected (info["invalid_turns"];
    only those also in `turns` when given) taken out of the loss (`learner.mask_invalid_turns`):
    a success should not also reinforce the malformed commands it made on the way. Unchanged
    when nothing was invalid or the turns cannot be located."""
    bad = t.info.get("invalid_turns") or []
    if turns is not None:
        bad = [k for k in bad if k in set(turns)]
    ranges = model_turn_ranges(t) if bad else None
    if not ranges:
        return t
    mask = list(t.response_mask)
    for turn in bad:
        if 0 <= turn < len(ranges):
            start, end = ranges[turn]
            mask[start:end] = [0] * (end - start)
    return replace(t, response_mask=tuple(mask))


def positive_turns_only(t: Trajectory, advantage: float | np.ndarray,
                        turn_advantages: np.ndarray | None) -> Trajectory:
    """`learner.mask_invalid_turns` for one kept episode: its rejected turns leave the loss
    where their advantage is positive (every turn of an episode with a positive episode-level
    advantage; with per-turn advantages, the turns whose own advantage is positive)."""
    if turn_advantages is None:
        return without_invalid_turns(t) if float(np.max(advantage)) > 0 else t
    return without_invalid_turns(t, [k for k, a in enumerate(turn_advantages) if a > 0])


def pad_batch(trajs: Sequence[Trajectory], advantages: Sequence[float | np.ndarray], *,
              pad_id: int) -> dict[str, np.ndarray]:
    """Right-padded `[B, T]` arrays over prompt + response.

    `advantages[b]`: one value for every response token of episode b, or an array with one
    per response token (turn-level estimators, learner.credit).
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


def turn_rows(trajs: Sequence[Trajectory], batch: dict[str, np.ndarray], *,
              pad_id: int) -> dict[str, np.ndarray]:
    """Window-context episodes -> one row per turn, from `pad_batch(trajs, ...)`'s arrays.

    Turn k of an episode with spans (ws, ts, te) becomes the row prompt_ids +
    response_ids[ws:te]: the exact ids it was sampled from, then its reply. Only the reply's
    model tokens carry loss; the window's earlier turns are context here and are trained in
    their own rows, so every model token is trained exactly once, with its episode's
    advantage. An episode without spans is one row (its whole response).

    Aggregation: `row_scale` (1 / the episode's model tokens) and `row_share` (the row's
    share of them) make the seq-mean modes average over episodes, not rows, so an episode of
    30 turns weighs what an episode of 3 does; token-mean needs neither, every token weighs
    the same. With a window at least as long as the episode, the rows' tokens, logprobs and
    advantages are the full row's, and every mode gives the full-context loss.
    """
    spans = [(b, len(t.prompt_ids), ws, ts, te) for b, t in enumerate(trajs)
             for ws, ts, te in (t.turn_spans or ((0, 0, len(t.response_ids)),))]
    width = max(p + te - ws for _, p, ws, _, te in spans)
    out = {k: np.zeros((len(spans), width), dtype=v.dtype) for k, v in batch.items()}
    out["input_ids"][:] = pad_id
    episode_tokens = batch["loss_mask"].sum(1)
    scale = np.zeros(len(spans), dtype=np.float32)
    share = np.zeros(len(spans), dtype=np.float32)
    for r, (b, p, ws, ts, te) in enumerate(spans):
        out["input_ids"][r, :p] = batch["input_ids"][b, :p]
        out["input_ids"][r, p:p + te - ws] = batch["input_ids"][b, p + ws:p + te]
        out["attention_mask"][r, :p + te - ws] = 1
        turn = slice(p + ts - ws, p + te - ws)
        for k in ("loss_mask", "old_logprobs", "advantages", "token_rewards"):
            out[k][r, turn] = batch[k][b, p + ts:p + te]
        n = max(float(episode_tokens[b]), 1.0)
        scale[r], share[r] = 1.0 / n, out["loss_mask"][r].sum() / n
    out["row_scale"], out["row_share"] = scale, share
    # Which episode and turn each row is: PPO's GAE runs across an episode's turn rows.
    out["episode"] = np.array([b for b, *_ in spans], dtype=np.int64)
    out["turn"] = np.concatenate([np.arange(len(t.turn_spans) or 1) for t in trajs])
    return out


def token_rewards(t: Trajectory) -> np.ndarray:
    """Per-token rewards over `response_ids`: turn k's reward on the last model token of turn
    k (the k-th run of response_mask 1s). If the turn count and the runs disagree (a turn cut
    by the context limit), the episode reward goes on the last model token instead. A penalty
    `learner.overlong=penalty` took off the episode's reward (its turns' rewards stay the env's
    record) goes on the last model token too, where the outcome is."""
    out = np.zeros(len(t.response_mask), dtype=np.float32)
    ends = [end - 1 for _, end in _mask_runs(t.response_mask)]  # last token of each run
    if len(ends) == 0:
        return out
    if len(t.rewards) == len(ends):
        out[ends] = t.rewards
        out[ends[-1]] += t.reward - t.info.get("env_reward", t.reward)
    else:
        out[ends[-1]] = t.reward
    return out


def split_rows(batch: dict[str, np.ndarray], parts: int) -> list[dict[str, np.ndarray]]:
    """Split along rows into `parts` near-equal pieces (every piece non-empty)."""
    rows = np.array_split(np.arange(len(next(iter(batch.values())))), parts)
    return [{k: v[r] for k, v in batch.items()} for r in rows]


def loss_units(batch: dict[str, np.ndarray], *, token_mean: bool) -> np.ndarray:
    """What each row adds to the denominator of its optimizer step's loss: its model tokens
    under token-mean; under the seq-mean modes its share of an episode (`row_share` of a turn
    row, 1 for a whole-episode row with a model token, as `algorithms.aggregate` counts)."""
    tokens = batch["loss_mask"].sum(1).astype(np.float64)
    if token_mean:
        return tokens
    if "row_share" in batch:
        return batch["row_share"].astype(np.float64)
    return (tokens > 0).astype(np.float64)


def shard_episodes(batch: dict[str, np.ndarray], rows_per_episode: Sequence[int], *,
                   ranks: int, minibatches: int, token_mean: bool,
                   balance: bool = False) -> list[dict[str, np.ndarray]]:
    """One update's rows -> a shard per rank, dealt by whole episodes.

    Episodes go to ranks and then to each rank's minibatches as contiguous near-equal runs
    (full mode's rows exactly), and a turn row goes where its episode went, so an episode's
    turns train in one optimizer step and a window as long as the horizon trains what full
    mode does. Each row carries `minibatch` (its step on the rank), `loss_units` and
    `step_units` (the step's units summed over every rank): ranks normalise by the whole
    step's count, so the loss does not depend on how its rows were split (LearnerWorker._step).
    `batch` holds the rows of episode 0, then of episode 1, ...

    `balance`: each optimizer step keeps the same episodes, but they are dealt to ranks by
    token count (longest first, to the rank with the fewest tokens so far), so no rank waits
    at the step's all-reduce for one that drew the long episodes. The loss is unchanged.
    """
    counts = np.asarray(rows_per_episode, dtype=np.int64)
    if counts.sum() != len(batch["input_ids"]) or len(counts) < ranks * minibatches:
        raise ValueError(f"{len(counts)} episodes in {len(batch['input_ids'])} rows cannot fill "
                         f"{ranks} ranks x {minibatches} minibatches (one episode each at least)")
    episode = np.repeat(np.arange(len(counts)), counts)
    slots = np.empty(len(counts), dtype=np.int64)  # rank * minibatches + step, per episode
    for r, eps in enumerate(np.array_split(np.arange(len(counts)), ranks)):
        for m, part in enumerate(np.array_split(eps, minibatches)):
            slots[part] = r * minibatches + m
    if balance:
        tokens = np.bincount(episode, weights=batch["attention_mask"].sum(1),
                             minlength=len(counts))
        slots = _balanced_slots(slots % minibatches, tokens, ranks=ranks,
                                minibatches=minibatches)
    slot = slots[episode]
    units = loss_units(batch, token_mean=token_mean)
    per_step = np.bincount(slot % minibatches, weights=units, minlength=minibatches)
    out = []
    for r in range(ranks):
        rows = np.flatnonzero(slot // minibatches == r)
        shard = {k: v[rows] for k, v in batch.items()}
        shard["minibatch"] = slot[rows] % minibatches
        shard["loss_units"], shard["step_units"] = units[rows], per_step[shard["minibatch"]]
        out.append(shard)
    return out


def _balanced_slots(step: np.ndarray, tokens: np.ndarray, *, ranks: int,
                    minibatches: int) -> np.ndarray:
    """Slot (rank * minibatches + step) per episode: each step's episodes over the ranks by
    longest-processing-time-first on their tokens (every rank gets one: a step has at least
    `ranks` episodes, and the first `ranks` go to empty ranks)."""
    slots = np.empty(len(step), dtype=np.int64)
    for m in range(minibatches):
        load = np.zeros(ranks)
        eps = np.flatnonzero(step == m)
        for e in eps[np.argsort(-tokens[eps], kind="stable")]:
            r = int(np.argmin(load))
            load[r] += tokens[e]
            slots[e] = r * minibatches + m
    return slots


def split_minibatches(shard: dict[str, np.ndarray], count: int) -> list[dict[str, np.ndarray]]:
    """A rank's shard from `shard_episodes` -> its `count` minibatches, in step order."""
    step = shard["minibatch"]
    return [{k: v[step == m] for k, v in shard.items()} for m in range(count)]


def trim(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Drop padding columns that no row uses (a shard's longest row sets its width)."""
    width = int(batch["attention_mask"].sum(1).max())
    return {k: v[:, :width] if v.ndim == 2 else v for k, v in batch.items()}
