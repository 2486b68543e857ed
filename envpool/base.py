"""The environment contract every horizonrl environment follows (gymnasium-style, text in/out)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


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
