"""The environment contract every horizonrl environment follows (gymnasium-style, text in/out)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

# Task ids are integer seeds. Seeds at or above this offset belong to an environment's fixed eval
# split, seeds below it to its train split; each environment maps a seed to one of its tasks.
EVAL_SEED_OFFSET = 1_000_000
# Seeds from here on are train-split tasks that training never draws (it draws seeds below
# EVAL_SEED_OFFSET): new instances of training tasks, e.g. a training goal of TextCraft with
# distractors and an order it was never trained on, or new BabyAI layouts of a training level.
NEW_INSTANCE_OFFSET = 2_000_000
MAX_ACTION_CHARS = 2_000  # no action in any env is longer; longer text is invalid without parsing
_ACTION_RE = re.compile(r"action\s*:", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one `TextEnv.step` returns.

    `info` carries at least `invalid_action` (bool) and `success` (bool); environments that
    know their legal moves add `available_actions` (list[str]).
    """

    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class TextEnv(Protocol):
    """A text environment: `str` observations and actions, no numpy spaces.

    Invalid actions never raise: they come back as an observation ("Invalid action ...")
    with `info["invalid_action"] = True` and use up the turn.
    """

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]: ...

    def step(self, action: str) -> StepResult: ...

    def close(self) -> None: ...


def task_split(seed: int | None) -> tuple[str, int]:
    """("train" | "eval", index within that split) for a task seed (None counts as train 0).
    Seeds from NEW_INSTANCE_OFFSET map to the train split again (index seed - offset)."""
    seed = 0 if seed is None else int(seed)
    if seed < 0:
        raise ValueError(f"task seeds are >= 0, got {seed}")
    if seed >= NEW_INSTANCE_OFFSET:
        return "train", seed - NEW_INSTANCE_OFFSET
    return ("eval", seed - EVAL_SEED_OFFSET) if seed >= EVAL_SEED_OFFSET else ("train", seed)


def split_seeds(split: str, n: int) -> list[int]:
    """The first `n` task seeds of an evaluation split: `eval` (held-out tasks) or
    `train-new` (training tasks in instances training never drew)."""
    offsets = {"eval": EVAL_SEED_OFFSET, "train-new": NEW_INSTANCE_OFFSET}
    if split not in offsets:
        raise ValueError(f"unknown split {split!r}; use one of {', '.join(offsets)}")
    return [offsets[split] + i for i in range(n)]


def parse_agentgym_action(text: str) -> str:
    """The action in an AgentGym-style reply ("Thought: ... Action: <action>"). Never raises.

    Takes the rest of the line after the last "Action:"; with no "Action:" anywhere, the first
    non-empty line. Whitespace is collapsed; case is kept (envs normalise as they need).
    """
    if not isinstance(text, str):
        return ""
    text = text[: MAX_ACTION_CHARS * 4]  # a runaway generation costs nothing to parse
    marks = list(_ACTION_RE.finditer(text))
    if marks:
        rest = text[marks[-1].end() :].lstrip()
        line = rest.splitlines()[0] if rest else ""
    else:
        line = next((ln for ln in text.splitlines() if ln.strip()), "")
    return " ".join(line[:MAX_ACTION_CHARS].split())


def utf8_safe(text: str) -> str:
    """`text` with what UTF-8 cannot encode (lone surrogates, valid in JSON escapes and Python
    strings) replaced, so sending it over HTTP/JSON never fails."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def shaping_weight(name: str, value: float) -> float:
    """A shaped-reward weight (an env kwarg such as `invalid_penalty`): a float >= 0, 0 = off."""
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return float(value)
