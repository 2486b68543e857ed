"""The Trajectory record shared by generators and learner (typed, frozen).

Field names follow verl's agent-loop output (`prompt_ids`, `response_ids`, `response_mask`,
`response_logprobs`, `num_turns`) plus `policy_version` and `horizon`. Protobuf appears only in
the transport codec (`protos/codec.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Failure(StrEnum):
    """Why an episode did not finish normally; infra failures are masked out of group stats."""

    NONE = "none"
    ENV_ERROR = "env_error"
    TIMEOUT = "timeout"
    GENERATOR_ERROR = "generator_error"


@dataclass(frozen=True, slots=True)
class Trajectory:
    """One finished episode in token space.

    `response_ids` holds everything after the first prompt: model tokens (mask 1) interleaved
    with environment/template tokens (mask 0). `response_logprobs` has one entry per response
    token: the behaviour policy's logprob on model tokens, 0.0 on masked tokens.

    `turn_versions` holds the policy version that sampled each model turn (partial rollouts:
    an episode in flight takes new weights at its next turn, so its turns may come from
    several versions; a turn never does). `policy_version` is the oldest of them, which the
    staleness bound and older readers use. Empty: every turn came from `policy_version`.

    `turn_spans` is set for episodes run with a window context (`generator.context.mode:
    window`): one `(window_start, turn_start, turn_end)` per model turn, offsets into
    `response_ids`. Turn k was sampled from `prompt_ids + response_ids[window_start:turn_start]`
    and is `response_ids[turn_start:turn_end]`; the learner trains one row per turn
    (`turn_rows`). Empty: the whole episode was one context and is one row.
    """

    trajectory_id: str
    group_id: str
    task_id: str
    env_name: str
    policy_version: int
    horizon: int
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    response_mask: tuple[int, ...]
    response_logprobs: tuple[float, ...]
    rewards: tuple[float, ...]
    reward: float
    num_turns: int
    terminated: bool
    truncated: bool
    failure: Failure = Failure.NONE
    turn_seconds: tuple[float, ...] = ()
    info: dict[str, Any] = field(default_factory=dict)
    turn_spans: tuple[tuple[int, int, int], ...] = ()
    turn_versions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if len(self.response_mask) != n or len(self.response_logprobs) != n:
            raise ValueError(
                f"trajectory {self.trajectory_id}: response_ids ({n}), response_mask "
                f"({len(self.response_mask)}) and response_logprobs "
                f"({len(self.response_logprobs)}) must have the same length"
            )
        if self.num_turns > self.horizon:
            raise ValueError(
                f"trajectory {self.trajectory_id}: {self.num_turns} turns exceed horizon "
                f"{self.horizon}"
            )
        self._check_spans()
        if self.turn_versions and (len(self.turn_versions) != self.num_turns
                                   or min(self.turn_versions) != self.policy_version):
            raise ValueError(
                f"trajectory {self.trajectory_id}: turn_versions {list(self.turn_versions)} "
                f"must hold one version per turn ({self.num_turns}), the oldest being "
                f"policy_version {self.policy_version}")

    def _check_spans(self) -> None:
        """Spans are ordered, inside `response_ids`, and never overlap: every response token
        belongs to at most one turn's row."""
        end = 0
        for k, (ws, ts, te) in enumerate(self.turn_spans):
            if not 0 <= ws <= ts < te <= len(self.response_ids) or ts < end:
                raise ValueError(
                    f"trajectory {self.trajectory_id}: turn span {k} {(ws, ts, te)} is not "
                    f"0 <= window_start <= turn_start < turn_end <= {len(self.response_ids)} "
                    f"after the previous turn's end {end}")
            end = te

    @property
    def rows(self) -> int:
        """Training rows this episode becomes: one per turn in window mode, else one."""
        return len(self.turn_spans) or 1

    def version_of_turn(self, k: int) -> int:
        """The policy version that sampled model turn `k` (0-based)."""
        return self.turn_versions[k] if self.turn_versions else self.policy_version

    @property
    def cut(self) -> str | None:
        """What ended an unfinished episode: "context" (the context limit), "horizon" (the
        turn budget), or None (the env ended it, or an infrastructure failure)."""
        return self.info.get("cut")
