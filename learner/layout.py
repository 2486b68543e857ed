"""How a rank's minibatch becomes micro-batches and forward passes (`learner.layout`).

Every layout trains the same rows with the same losses and gradients; they differ in the
tokens a forward pass computes. The rows stay right-padded `[B, T]` arrays throughout (what
`learner.batch` builds and the objectives read); a layout picks which rows share a micro-batch
(`plan_micro_batches`) and how their logprobs are computed (`token_logprobs_by_layout`), and
hands back `[B, T]` logprobs aligned with those rows.

- padded: consecutive rows, each micro-batch padded to its longest row (the original path).
- bucketed: rows sorted by length and cut into micro-batches of at most the token budget
  (rows x width), so rows of one micro-batch have about the same length and little padding.
- packed: the rows of a micro-batch concatenated into one sequence with position ids that
  restart per row; transformers then keeps attention inside each row (a block-diagonal mask
  under SDPA, flash-attention's variable-length kernel where the model runs on it).
- shared_prefix: window-mode turn rows of one episode repeat its system and task prompt; the
  prompt runs once per episode, its keys and values are reused by each row's window (a KV
  cache with gradients), so the shared tokens are computed once rather than once per row.

`auto` picks shared_prefix for turn rows and bucketed otherwise: on CPU the measured fastest
(docs/learner.md). Packing pays for its N^2 mask there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from horizonrl.learner import algorithms as alg

LAYOUTS = ("padded", "bucketed", "packed", "shared_prefix")
DEFAULT_BUDGET = 8192  # tokens per micro-batch when micro_batch_tokens is 0 (bucketed and up)


def resolve_layout(name: str, batch: dict[str, np.ndarray], *, checkpointing: bool = False,
                   zero_stage: int = 2) -> str:
    """The layout `name` means for this batch: `auto` -> shared_prefix for turn rows (they
    carry `episode`), bucketed for whole-episode rows; shared_prefix without turn rows is
    bucketed (each row would be its own prefix). The shared prefix needs transformers' KV
    cache, which gradient checkpointing turns off, and runs two forward passes per episode,
    a count that differs between ranks, where ZeRO-3 gathers parameters collectively at
    every forward: with either, auto is bucketed and shared_prefix an error."""
    if name not in (*LAYOUTS, "auto"):
        raise ValueError(f"unknown learner.layout {name!r}; use auto or one of {LAYOUTS}")
    clash = ("learner.gradient_checkpointing" if checkpointing else
             "learner.zero_stage=3" if zero_stage == 3 else None)
    if name == "shared_prefix" and clash:
        raise ValueError(f"learner.layout=shared_prefix cannot run with {clash} (it needs the "
                         "KV cache and a forward count that may differ by rank); use auto")
    if name in ("auto", "shared_prefix"):
        return "shared_prefix" if "episode" in batch and not clash else "bucketed"
    return name


def row_lengths(batch: dict[str, np.ndarray]) -> np.ndarray:
    """Tokens of each right-padded row."""
    return batch["attention_mask"].sum(1).astype(np.int64)


def token_budget(layout: str, configured: int, lengths: np.ndarray) -> int:
    """Tokens a micro-batch may hold: the configured budget (0: DEFAULT_BUDGET beyond the padded
    layout, whose 0 means one micro-batch), never below the longest row, which must fit."""
    longest = int(lengths.max()) if len(lengths) else 1
    if layout == "padded":
        return configured
    return max(configured or DEFAULT_BUDGET, longest)


def plan_micro_batches(batch: dict[str, np.ndarray], *, layout: str,
                       budget: int) -> list[np.ndarray]:
    """Row indices of each micro-batch of `batch` (a minibatch on one rank), by `layout`."""
    n = len(batch["input_ids"])
    if n == 0:
        return []
    lengths = row_lengths(batch)
    if layout == "padded":
        width = int(lengths.max())
        per_micro = n if budget <= 0 else max(1, budget // max(width, 1))
        return [r for r in np.array_split(np.arange(n), -(-n // per_micro))]
    if layout == "bucketed":
        return _buckets(np.argsort(-lengths, kind="stable"), lengths, budget)
    if layout == "packed":
        return _first_fit([np.array([r]) for r in range(n)], lengths.astype(float), budget)
    if layout == "shared_prefix":
        units, costs = _prefix_units(batch, lengths, budget)
        return _first_fit(units, np.array(costs), budget)
    raise ValueError(f"unknown layout {layout!r}")


def rank_plan(mb: dict[str, np.ndarray], name: str, configured_budget: int, *,
              agree: Callable[[int], int], checkpointing: bool = False,
              zero_stage: int = 2) -> tuple[str, list[np.ndarray | None]]:
    """One rank's layout and micro-batch rows for minibatch `mb`, padded with None (a
    zero-weight pass) to `agree(count)`, the largest count over the ranks, so every rank runs
    as many passes. The padded layout agrees on the count first and splits its rows evenly
    by it, as it always has."""
    layout = resolve_layout(name, mb, checkpointing=checkpointing, zero_stage=zero_stage)
    budget = token_budget(layout, configured_budget, row_lengths(mb))
    plan: list[np.ndarray | None] = list(plan_micro_batches(mb, layout=layout, budget=budget))
    count = agree(len(plan))
    if layout == "padded":
        plan = list(np.array_split(np.arange(len(mb["input_ids"])), count))
        return layout, [r if len(r) else None for r in plan]
    return layout, plan + [None] * (count - len(plan))


def _buckets(order: np.ndarray, lengths: np.ndarray, budget: int) -> list[np.ndarray]:
    """Rows in `order` (longest first) cut where one more row would pass `budget` padded
    tokens (rows x the micro-batch's longest row)."""
    out, current = [], []
    for r in order:
        if current and (len(current) + 1) * lengths[current[0]] > budget:
            out.append(np.array(current))
            current = []
        current.append(int(r))
    return out + [np.array(current)] if current else out


def _first_fit(units: list[np.ndarray], costs: np.ndarray, budget: int) -> list[np.ndarray]:
    """First-fit decreasing: units (row groups) into micro-batches of at most `budget` tokens
    (a unit above it alone)."""
    bins: list[list[int]] = []
    loads: list[float] = []
    for u in np.argsort(-costs, kind="stable"):
        for b, load in enumerate(loads):
            if load + costs[u] <= budget:
                bins[b].append(int(u))
                loads[b] += costs[u]
                break
        else:
            bins.append([int(u)])
            loads.append(float(costs[u]))
    return [np.concatenate([units[u] for u in b]) for b in bins]


def shared_prefix_length(ids: np.ndarray, lengths: np.ndarray, loss_mask: np.ndarray) -> int:
    """Tokens the rows of one episode share from the start and that carry no loss in any row
    (their logits are not computed, only the keys and values): the common prefix cut at the
    first loss token, and one token short of the shortest row so every row keeps a window."""
    width = int(lengths.min())
    same = np.all(ids[:, :width] == ids[:1, :width], axis=0)
    common = int(np.argmin(same)) if not same.all() else width
    first_loss = np.flatnonzero(loss_mask.any(0))
    limit = int(first_loss[0]) if len(first_loss) else width
    return max(0, min(common, limit, width - 1))


def _prefix_units(batch: dict[str, np.ndarray], lengths: np.ndarray,
                  budget: int) -> tuple[list[np.ndarray], list[float]]:
    """Rows grouped by episode, each group cut into chunks whose prefix plus padded windows
    fit `budget` (a chunk runs the prefix once); and each chunk's tokens computed."""
    units, costs = [], []
    for e in np.unique(batch["episode"]):
        rows = np.flatnonzero(batch["episode"] == e)
        rows = rows[np.argsort(-lengths[rows], kind="stable")]
        p = shared_prefix_length(batch["input_ids"][rows], lengths[rows],
                                 batch["loss_mask"][rows])
        current: list[int] = []
        for r in [*rows, None]:  # None closes the last chunk
            if current and (r is None or
                            p + (len(current) + 1) * (lengths[current[0]] - p) > budget):
                units.append(np.array(current))
                costs.append(float(p + len(current) * (lengths[current[0]] - p)))
                current = []
            if r is not None:
                current.append(int(r))
    return units, costs


def _unit_cost(batch: dict[str, np.ndarray], rows: np.ndarray, lengths: np.ndarray) -> float:
    p = shared_prefix_length(batch["input_ids"][rows], lengths[rows], batch["loss_mask"][rows])
    return float(p + len(rows) * (lengths[rows].max() - p))


def computed_tokens(batch: dict[str, np.ndarray], micros: Sequence[np.ndarray],
                    layout: str) -> int:
    """Token positions the forward passes of `micros` compute (padding included): what a
    layout saves, for metrics and the benchmark."""
    lengths = row_lengths(batch)
    if layout in ("padded", "bucketed"):
        return int(sum(len(m) * lengths[m].max() for m in micros if len(m)))
    if layout == "packed":
        return int(lengths.sum())
    total = 0
    for m in micros:
        for e in np.unique(batch["episode"][m]):
            total += int(_unit_cost(batch, m[batch["episode"][m] == e], lengths))
    return total


def token_logprobs_by_layout(model: Any, t: dict[str, Tensor], *, layout: str,
                             temperature: float = 1.0, entropy: bool = True,
                             ) -> tuple[Tensor, Tensor | None]:
    """`[B, T]` logprobs of each row's tokens given its prefix (and the entropy of each
    next-token distribution, aligned like `algorithms.token_logprobs`) from one micro-batch's
    right-padded rows, computed the `layout` way, logits divided by `temperature`. Positions
    outside a row, and inside a shared prefix, are 0: no loss is ever taken there."""
    ids = t["input_ids"]

    def scaled(logits: Tensor) -> Tensor:
        return logits if temperature == 1.0 else logits / temperature

    if layout in ("padded", "bucketed"):
        # No KV cache: nothing is generated, and transformers would build one per layer.
        logits = scaled(model(input_ids=ids, use_cache=False).logits)
        return (alg.token_logprobs(logits, ids),
                alg.entropy_from_logits(logits) if entropy else None)
    if layout == "packed":
        return _packed(model, t, scaled, entropy)
    if layout == "shared_prefix":
        return _shared(model, t, scaled, entropy)
    raise ValueError(f"unknown layout {layout!r}")


def _packed(model: Any, t: dict[str, Tensor], scaled: Any,
            entropy: bool) -> tuple[Tensor, Tensor | None]:
    """One sequence of the rows end to end, position ids restarting at each row."""
    ids, inside = t["input_ids"], t["attention_mask"].bool()
    lengths = inside.sum(1)
    flat = ids[inside][None]  # rows are right-padded: row 0's tokens, then row 1's, ...
    starts = torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
    positions = (torch.arange(flat.shape[1], device=ids.device) - starts)[None]
    logits = scaled(model(input_ids=flat, position_ids=positions, use_cache=False).logits)
    # A row's first token reads the previous row's last logits here; it is a prompt token
    # (no loss), and the padded path gives it 0 too.
    first = (positions == 0).squeeze(0)
    logp = alg.token_logprobs(logits, flat)[0].masked_fill(first, 0.0)
    out = torch.zeros(ids.shape, dtype=logp.dtype, device=ids.device)
    logp_rows = out.masked_scatter(inside, logp)
    if not entropy:
        return logp_rows, None
    ent = alg.entropy_from_logits(logits)[0].masked_fill(first, 0.0)
    return logp_rows, out.masked_scatter(inside, ent)


def _shared(model: Any, t: dict[str, Tensor], scaled: Any,
            entropy: bool) -> tuple[Tensor, Tensor | None]:
    """Per episode: its shared prefix once (keys and values kept, last logits only), then its
    rows' windows as a batch attending to that prefix."""
    ids = t["input_ids"]
    logp = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)
    ent = torch.zeros_like(logp) if entropy else None
    episode = t["episode"].cpu().numpy()
    lengths = t["attention_mask"].sum(1).cpu().numpy()
    ids_np, mask_np = ids.cpu().numpy(), t["loss_mask"].cpu().numpy()
    for e in np.unique(episode):
        rows = np.flatnonzero(episode == e)
        p = shared_prefix_length(ids_np[rows], lengths[rows], mask_np[rows])
        r = torch.from_numpy(rows).to(ids.device)
        window = ids[r, p:int(lengths[rows].max())]
        if p == 0:  # nothing shared: the rows alone
            logits = scaled(model(input_ids=window, use_cache=False).logits)
            seq, start = window, 0
        else:
            pre = model(input_ids=ids[r[:1], :p], use_cache=True, logits_to_keep=1)
            pre.past_key_values.batch_repeat_interleave(len(rows))
            logits = scaled(model(input_ids=window, past_key_values=pre.past_key_values,
                                  use_cache=True).logits)
            # The prefix's last logits predict each window's first token; the prefix's own
            # positions stay 0 (no loss there by construction).
            logits = torch.cat([scaled(pre.logits[:, -1:]).expand(len(rows), -1, -1), logits], 1)
            seq, start = torch.cat([ids[r, p - 1:p], window], 1), p - 1
        at = (r[:, None], torch.arange(start, start + seq.shape[1], device=ids.device))
        logp = logp.index_put(at, alg.token_logprobs(logits, seq))
        if entropy:
            ent = ent.index_put(at, alg.entropy_from_logits(logits))
    return logp, ent
