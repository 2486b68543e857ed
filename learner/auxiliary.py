"""Auxiliary training data and losses: SFT, rejection sampling and DPO (pure code, no Ray).

Data builders turn finished `Trajectory` records (or a JSONL of chat conversations) into
token-level examples whose `loss_mask` is 1 exactly on the model's own tokens, the same rule
`learner.batch.pad_batch` uses for RL; losses follow `learner.algorithms.token_logprobs`
(the logprob at position t is of token t given tokens < t, position 0 gets 0).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from horizonrl.learner.algorithms import masked_mean, token_logprobs
from horizonrl.learner.batch import trim, without_invalid_turns
from horizonrl.protos.chat import ChatFormat
from horizonrl.protos.trajectory import Failure, Trajectory


@dataclass(frozen=True, slots=True)
class SFTExample:
    """One training sequence; `loss_mask` is 1 on the tokens the model should learn to emit."""

    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DPOPair:
    """A preferred and a dispreferred response to the same prompt (masks as `response_mask`)."""

    prompt_ids: tuple[int, ...]
    chosen_ids: tuple[int, ...]
    chosen_mask: tuple[int, ...]
    rejected_ids: tuple[int, ...]
    rejected_mask: tuple[int, ...]

    def chosen_example(self) -> SFTExample:
        """Prompt + chosen response, scored on the chosen model tokens (for `sequence_logprob`)."""
        return _example(self.prompt_ids, self.chosen_ids, self.chosen_mask)

    def rejected_example(self) -> SFTExample:
        """Prompt + rejected response, scored on the rejected model tokens."""
        return _example(self.prompt_ids, self.rejected_ids, self.rejected_mask)


@dataclass(frozen=True, slots=True)
class JsonlSFTData:
    """Examples read from a conversation JSONL, and how many were cut or dropped for length."""

    examples: list[SFTExample]
    truncated: int
    """Examples cut to `max_tokens` (some assistant tokens survived)."""
    skipped: int
    """Examples dropped because no assistant token fit within `max_tokens`."""


# -- trajectories -> examples -----------------------------------------------------------------
def _example(prompt_ids: Sequence[int], response_ids: Sequence[int],
             response_mask: Sequence[int]) -> SFTExample:
    return SFTExample(input_ids=tuple(prompt_ids) + tuple(response_ids),
                      loss_mask=(0,) * len(prompt_ids) + tuple(int(m) for m in response_mask))


def succeeded(traj: Trajectory) -> bool:
    """Solved the task: a positive outcome reward or the env's own success flag."""
    return traj.reward > 0 or bool(traj.info.get("success", False))


def _usable(traj: Trajectory) -> bool:
    # Infrastructure failures say nothing about the policy; an episode without a model token
    # (e.g. the context was full before the first turn) has nothing to train on; one that
    # `learner.overlong=mask` masked is out of every loss (the ledger drops it as `overlong`,
    # so picking it too would give it two fates).
    return (traj.failure is Failure.NONE and any(traj.response_mask)
            and not traj.info.get("overlong_masked"))


def sft_examples_from_trajectories(trajs: Iterable[Trajectory], *,
                                   only_successful: bool) -> list[SFTExample]:
    """Prompt + response per episode, loss on model tokens only; failed episodes dropped."""
    return [_example(t.prompt_ids, t.response_ids, t.response_mask) for t in trajs
            if _usable(t) and (succeeded(t) or not only_successful)]


def rejection_sampling_indices(trajs: Sequence[Trajectory]) -> list[int]:
    """Which episodes rejection sampling keeps: successful ones, one per distinct response
    within each group.

    Duplicates are common when a group's samples converge on the same solution; keeping them
    would weight easy tasks by how often the policy already solves them.
    """
    seen: set[tuple[str, tuple[int, ...], tuple[int, ...]]] = set()
    out = []
    for i, t in enumerate(trajs):
        key = (t.group_id, t.prompt_ids, t.response_ids)
        if _usable(t) and succeeded(t) and key not in seen:
            seen.add(key)
            out.append(i)
    return out


def rejection_sampling_examples(trajs: Iterable[Trajectory], *,
                                mask_invalid_turns: bool = False) -> list[SFTExample]:
    """The kept episodes (`rejection_sampling_indices`) as SFT data; with
    `mask_invalid_turns` (learner config) the turns the env rejected carry no loss."""
    trajs = [without_invalid_turns(t) if mask_invalid_turns else t for t in trajs]
    return [_example(trajs[i].prompt_ids, trajs[i].response_ids, trajs[i].response_mask)
            for i in rejection_sampling_indices(trajs)]


def dpo_pairs_from_groups(trajs: Iterable[Trajectory], *,
                          max_pairs_per_group: int = 1) -> list[DPOPair]:
    """Chosen/rejected pairs from episodes of the same group and the same prompt ids.

    Episodes rank by (success, reward): a success beats a failure, then higher reward wins.
    The best is paired with the worst, the second best with the second worst and so on (each
    episode used once, up to `max_pairs_per_group`); pairs whose ranks tie, or whose responses
    are identical, are skipped since they carry no preference. Infra failures never enter.
    """
    if max_pairs_per_group < 1:
        raise ValueError(f"max_pairs_per_group must be >= 1, got {max_pairs_per_group}")
    groups: dict[tuple[str, tuple[int, ...]], list[Trajectory]] = {}
    for t in trajs:
        if _usable(t):
            groups.setdefault((t.group_id, t.prompt_ids), []).append(t)
    pairs = []
    for members in groups.values():
        # sorted() is stable, so equal ranks keep arrival order: the output is deterministic.
        ranked = sorted(members, key=lambda t: (succeeded(t), t.reward), reverse=True)
        for i in range(min(max_pairs_per_group, len(ranked) // 2)):
            best, worst = ranked[i], ranked[-1 - i]
            if (succeeded(best), best.reward) == (succeeded(worst), worst.reward):
                break  # every remaining pair lies between these two ranks: all ties
            if best.response_ids == worst.response_ids:
                continue
            pairs.append(DPOPair(prompt_ids=best.prompt_ids, chosen_ids=best.response_ids,
                                 chosen_mask=best.response_mask, rejected_ids=worst.response_ids,
                                 rejected_mask=worst.response_mask))
    return pairs


# -- pair files -------------------------------------------------------------------------------
_PAIR_FIELDS = ("prompt_ids", "chosen_ids", "chosen_mask", "rejected_ids", "rejected_mask")


def write_pairs_jsonl(pairs: Iterable[DPOPair], path: str | Path) -> int:
    """One JSON object per pair (lists of ints); returns the number written."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for p in pairs:
            f.write(json.dumps({k: list(getattr(p, k)) for k in _PAIR_FIELDS}) + "\n")
            n += 1
    return n


def _int_list(row: dict, key: str, where: str) -> tuple[int, ...]:
    value = row.get(key)
    if not isinstance(value, list) or not all(type(v) is int for v in value):
        raise ValueError(f"{where}: {key!r} must be a list of ints")
    return tuple(value)


def _parse_pair(line: str, where: str) -> DPOPair:
    row = _json_object(line, where)
    p = DPOPair(*(_int_list(row, k, where) for k in _PAIR_FIELDS))
    for ids, mask, side in ((p.chosen_ids, p.chosen_mask, "chosen"),
                            (p.rejected_ids, p.rejected_mask, "rejected")):
        if len(ids) != len(mask) or not set(mask) <= {0, 1}:
            raise ValueError(f"{where}: {side}_mask must be 0/1 with one entry per {side}_ids")
    return p


def read_pairs_jsonl(path: str | Path) -> list[DPOPair]:
    """Pairs written by `write_pairs_jsonl`; a malformed line raises naming file and line."""
    return [_parse_pair(line, f"{path}:{n}") for n, line in _lines(path)]


def _lines(path: str | Path) -> Iterable[tuple[int, str]]:
    """Non-blank lines with their 1-based numbers."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if line.strip():
                yield n, line


def _json_object(line: str, where: str) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    return row


# -- conversation JSONL -> examples -----------------------------------------------------------
def _messages(row: dict[str, Any], where: str,
              default_system: str | None) -> list[tuple[str, str]]:
    """Validated (role, content) list: system, user, then assistant/user alternating."""
    raw = row.get("messages")
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{where}: expected a non-empty 'messages' list")
    msgs = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") \
                or not isinstance(m.get("content"), str):
            raise ValueError(f"{where}: message {i} needs 'role' (system, user or assistant) "
                             "and a string 'content'")
        msgs.append((m["role"], m["content"]))
    if msgs[0][0] != "system":
        if default_system is None:
            raise ValueError(f"{where}: the first message must be the system prompt (the agent "
                             "loop always has one), or pass default_system")
        msgs.insert(0, ("system", default_system))
    roles = [r for r, _ in msgs[1:]]
    expected = ["user", "assistant"] * ((len(roles) + 1) // 2)
    if len(roles) < 2 or roles != expected[:len(roles)] or roles[-1] != "assistant":
        raise ValueError(f"{where}: after the system message, roles must alternate user, "
                         f"assistant, ... and end with assistant; got {roles}")
    return msgs


def conversation_example(chat: ChatFormat, messages: Sequence[tuple[str, str]]) -> SFTExample:
    """Encode with the agent loop's segments: prompt, then (assistant turn, next user turn)s.

    Assistant turns (with their closing <|im_end|>) carry the loss; everything else is context.
    """
    ids = chat.prompt_ids(messages[0][1], messages[1][1])
    mask = [0] * len(ids)
    for i in range(2, len(messages), 2):
        turn = chat.assistant_ids(messages[i][1])
        ids += turn
        mask += [1] * len(turn)
        if i + 1 < len(messages):
            obs = chat.observation_ids(messages[i + 1][1])
            ids += obs
            mask += [0] * len(obs)
    return SFTExample(input_ids=tuple(ids), loss_mask=tuple(mask))


def sft_examples_from_jsonl(path: str | Path, chat: ChatFormat, *, max_tokens: int,
                            default_system: str | None = None) -> JsonlSFTData:
    """SFT examples from `{"messages": [{"role": ..., "content": ...}, ...]}` lines.

    Loss on assistant turns only. An example longer than `max_tokens` is cut to its first
    `max_tokens` tokens, or dropped when no assistant token survives the cut; both are counted.
    A malformed line raises ValueError naming the file and line.
    """
    if max_tokens < 2:
        raise ValueError(f"max_tokens must be >= 2 (a prompt token and a target), got {max_tokens}")
    examples, truncated, skipped = [], 0, 0
    for n, line in _lines(path):
        where = f"{path}:{n}"
        ex = conversation_example(chat, _messages(_json_object(line, where), where, default_system))
        if len(ex.input_ids) > max_tokens:
            ex = SFTExample(ex.input_ids[:max_tokens], ex.loss_mask[:max_tokens])
            if not any(ex.loss_mask):
                skipped += 1
                continue
            truncated += 1
        examples.append(ex)
    return JsonlSFTData(examples=examples, truncated=truncated, skipped=skipped)


def pad_examples(examples: Sequence[SFTExample], pad_id: int) -> dict[str, np.ndarray]:
    """Right-padded `[B, T]` arrays: input_ids, attention_mask and loss_mask (as `pad_batch`)."""
    if not examples:
        raise ValueError("pad_examples needs at least one example")
    width = max(len(e.input_ids) for e in examples)
    b = len(examples)
    input_ids = np.full((b, width), pad_id, dtype=np.int64)
    attention = np.zeros((b, width), dtype=np.int64)
    loss_mask = np.zeros((b, width), dtype=np.float32)
    for row, e in enumerate(examples):
        n = len(e.input_ids)
        input_ids[row, :n] = e.input_ids
        attention[row, :n] = 1
        loss_mask[row, :n] = e.loss_mask
    return {"input_ids": input_ids, "attention_mask": attention, "loss_mask": loss_mask}


# -- losses -----------------------------------------------------------------------------------
def _predicted(mask: Tensor) -> Tensor:
    # Nothing predicts position 0 (its logprob is 0 by convention), so it never counts.
    out = mask.float().clone()
    out[:, 0] = 0.0
    return out


def sft_loss(logits: Tensor, input_ids: Tensor, loss_mask: Tensor) -> Tensor:
    """Mean next-token NLL over the tokens where `loss_mask` is 1 (token-mean aggregation)."""
    return masked_mean(-token_logprobs(logits, input_ids), _predicted(loss_mask))


def sequence_logprob(logits: Tensor, input_ids: Tensor, mask: Tensor) -> Tensor:
    """Per-row sum of token logprobs over `mask`, `[B]` (the log-likelihood DPO compares)."""
    return (token_logprobs(logits, input_ids) * _predicted(mask)).sum(-1)


def dpo_loss(policy_chosen: Tensor, policy_rejected: Tensor, ref_chosen: Tensor,
             ref_rejected: Tensor, beta: float) -> tuple[Tensor, Tensor, Tensor]:
    """DPO (Rafailov et al. 2023) on `[B]` sequence logprobs; returns (loss, accuracy, margin).

    With implicit rewards r_c = beta * (pc - rc) and r_r = beta * (pr - rr):
    loss = mean(-log sigmoid(r_c - r_r)); accuracy = share of pairs with r_c > r_r;
    margin = mean(r_c - r_r). Accuracy and margin are detached (metrics only).
    """
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}; 0.1 is the usual value")
    chosen_reward = beta * (policy_chosen - ref_chosen)
    rejected_reward = beta * (policy_rejected - ref_rejected)
    diff = chosen_reward - rejected_reward
    loss = -F.logsigmoid(diff).mean()
    with torch.no_grad():
        accuracy = (diff > 0).float().mean()
        margin = diff.mean()
    return loss, accuracy, margin


def auxiliary_loss(kind: str, shard: dict[str, np.ndarray], policy: Any, ref: Any | None,
                   tensors: Any, *, dpo_beta: float) -> tuple[Tensor, dict[str, float]]:
    """One rank's SFT (`kind="sft"`: input_ids, loss_mask) or DPO (`"dpo"`: chosen_* and
    rejected_* arrays, against the frozen `ref`) loss on its shard, and its figures; `tensors`
    turns numpy arrays into the policy's device tensors (LearnerWorker._tensors)."""
    if kind == "sft":
        t = tensors(trim(shard))
        loss = sft_loss(policy(input_ids=t["input_ids"]).logits, t["input_ids"], t["loss_mask"])
        return loss, {"sft_loss": loss.item()}
    if kind != "dpo":
        raise ValueError(f"unknown auxiliary objective {kind!r}; use sft or dpo")
    if ref is None:
        raise RuntimeError("DPO needs the reference model: set learner.kl_coef > 0")
    logps = {}
    for side in ("chosen", "rejected"):
        t = tensors(trim({"input_ids": shard[f"{side}_input_ids"],
                          "attention_mask": shard[f"{side}_attention_mask"],
                          "loss_mask": shard[f"{side}_loss_mask"]}))
        ids, mask = t["input_ids"], t["loss_mask"]
        logps[side] = sequence_logprob(policy(input_ids=ids).logits, ids, mask)
        with torch.no_grad():
            logps[f"ref_{side}"] = sequence_logprob(ref(input_ids=ids).logits, ids, mask)
    loss, acc, margin = dpo_loss(logps["chosen"], logps["rejected"], logps["ref_chosen"],
                                 logps["ref_rejected"], dpo_beta)
    return loss, {"dpo_loss": loss.item(), "reward_accuracy": acc.item(),
                  "reward_margin": margin.item()}
