"""The multi-turn agent loop for one episode, in token space (plain class, no Ray).

observation -> prompt ids -> model completion (exact sampled ids + logprobs) -> parsed action ->
environment step -> observation ids appended -> ... until the env ends the episode, the horizon is
reached or the context is full. The generator drives many of these in lock-step; a single episode
can be run with `run_episode` for tests and scripts.

With `keep_turns` set (window context) the episode is still recorded whole, but each turn is
sampled from the system prompt and task plus only the latest turns, sliced from the same ids, and
the turn's span is recorded so the learner can rebuild exactly that prompt as a training row.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from horizonrl.envpool.base import StepResult, TextEnv
from horizonrl.protos.chat import ChatFormat
from horizonrl.protos.trajectory import Failure, Trajectory


@dataclass(frozen=True, slots=True)
class Completion:
    """One sampled assistant turn: the engine's exact token ids and their logprobs."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str  # "stop" (ended on a stop token) or "length"
    cached_tokens: int = 0  # prompt tokens the engine's prefix cache served (not recomputed)


class ContextOverflow(ValueError):
    """Not even one turn fits the context: a configuration problem, not a model failure."""


class Engine(Protocol):
    """What the agent loop needs from a language model engine (vLLM, or a fallback)."""

    def generate(
        self, prompts: Sequence[Sequence[int]], *, max_tokens: int, temperature: float
    ) -> list[Completion]: ...


class AgentLoop:
    """One episode's conversation, kept as token ids with a mask and behaviour logprobs."""

    def __init__(self, *, chat: ChatFormat, system_prompt: str, parse_action: Callable[[str], str],
                 horizon: int, max_context_tokens: int, max_tokens_per_turn: int,
                 keep_turns: int | None = None) -> None:
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        if keep_turns is not None and keep_turns < 1:
            raise ValueError(f"keep_turns must be >= 1 (or None: full context), got {keep_turns}")
        self.chat = chat
        self.system_prompt = system_prompt
        self.parse_action = parse_action
        self.horizon = horizon
        self.max_context_tokens = max_context_tokens
        self.max_tokens_per_turn = max_tokens_per_turn
        self.keep_turns = keep_turns
        self.prompt_ids: list[int] = []
        self.response_ids: list[int] = []
        self.response_mask: list[int] = []
        self.response_logprobs: list[float] = []
        self.rewards: list[float] = []
        self.actions: list[str] = []
        self.turn_seconds: list[float] = []
        self.invalid_turns: list[int] = []  # 0-based turns whose action the env rejected
        # Turn k's state key (the state its action was taken in): GiGPO's anchor states.
        self.state_keys: list[str] = []
        self.terminated = False
        self.truncated = False
        self.success = False
        self.failure = Failure.NONE
        self.cut: str | None = None  # "context" or "horizon" when one of them ended the episode
        self.context_error = ""
        self.turn_spans: list[tuple[int, int, int]] = []
        # The policy version of the weights the next turn is sampled with (None: the caller
        # did not say), and of each turn taken (partial rollouts change it between turns,
        # never within one).
        self.policy_version: int | None = None
        self.turn_versions: list[int] = []
        self._window_start = 0  # where the next turn's window begins in response_ids
        self._turn_start = 0.0

    # -- state -------------------------------------------------------------------------------
    @property
    def num_turns(self) -> int:
        return len(self.actions)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated or self.failure is not Failure.NONE

    @property
    def context_ids(self) -> list[int]:
        """Everything the model conditions on for its next turn."""
        return self.prompt_ids + self.response_ids[self._window_start:]

    # -- transitions -------------------------------------------------------------------------
    def start(self, observation: str, info: dict[str, Any] | None = None) -> None:
        """Open the episode on the env's first observation (and its reset `info`)."""
        self.state_keys = [state_key(observation, info)]
        self.prompt_ids = self.chat.prompt_ids(self.system_prompt, observation)
        need = len(self.prompt_ids) + self.max_tokens_per_turn
        if need > self.max_context_tokens:
            raise ContextOverflow(
                f"the first turn needs {len(self.prompt_ids)} prompt tokens (system prompt and "
                f"task) + {self.max_tokens_per_turn} for the reply = {need} > "
                f"generator.max_context_tokens={self.max_context_tokens}; raise it or lower "
                "generator.max_tokens_per_turn")

    def add_model_turn(self, completion: Completion, *, trainable: bool = True) -> str:
        """Append the sampled ids (mask 1; 0 with `trainable=False`, for a turn that must stay
        in the context but not be learned, e.g. an injected random action in a demonstration)
        and return the parsed action."""
        if self.done:
            raise RuntimeError("add_model_turn on a finished episode")
        self._turn_start = time.perf_counter()
        ids, lps = list(completion.token_ids), list(completion.logprobs)
        if len(ids) != len(lps):
            raise ValueError(f"completion has {len(ids)} ids but {len(lps)} logprobs")
        start = len(self.response_ids)
        self._append(ids, int(trainable), lps)
        end = self.chat.im_end_id
        text_ids = ids[:-1] if ids and ids[-1] == end else ids
        if not ids or ids[-1] != end:
            # Cut by max_tokens: close the turn with a template token the model did not sample.
            self._append([end], 0, [0.0])
        self.turn_spans.append((self._window_start, start, len(self.response_ids)))
        if self.policy_version is not None:
            self.turn_versions.append(self.policy_version)
        action = self.parse_action(self.chat.tokenizer.decode(text_ids))
        self.actions.append(action)
        return action

    def add_env_result(self, result: StepResult) -> None:
        """Record the step; append the next observation unless the episode is over."""
        self.rewards.append(float(result.reward))
        if result.info.get("invalid_action", False):
            self.invalid_turns.append(self.num_turns - 1)
        self.success = self.success or bool(result.info.get("success", False))
        self.terminated = bool(result.terminated)
        self.truncated = bool(result.truncated) or (
            not self.terminated and self.num_turns >= self.horizon
        )
        if self.truncated and not result.truncated:
            self.cut = "horizon"
        self.turn_seconds.append(time.perf_counter() - self._turn_start)
        if not self.done:
            self.state_keys.append(state_key(result.observation, result.info))
            self._append(self.chat.observation_ids(result.observation), 0, None)
            self._check_context()

    def new_policy(self, version: int, horizon: int | None = None) -> None:
        """Between turns: the next turns are sampled by `version`, and the curriculum's
        `horizon` applies from the next turn, never below the turns taken plus the one about
        to be taken (a lower horizon cannot end an episode that was allowed to go on)."""
        self.policy_version = int(version)
        if horizon is not None and not self.done:
            self.horizon = max(int(horizon), self.num_turns + 1)

    def fail(self, failure: Failure) -> None:
        """Mark an infrastructure failure: the learner masks it out rather than scoring 0."""
        self.failure = failure

    def _append(self, ids: list[int], mask: int, logprobs: list[float] | None) -> None:
        self.response_ids += ids
        self.response_mask += [mask] * len(ids)
        self.response_logprobs += logprobs if logprobs is not None else [0.0] * len(ids)

    def _check_context(self) -> None:
        # Leave room for a full turn; otherwise the episode ends truncated rather than overflowing.
        if self.keep_turns is not None:
            self._slide_window()
        elif len(self.context_ids) + self.max_tokens_per_turn > self.max_context_tokens:
            self.truncated, self.cut = True, "context"

    def _slide_window(self) -> None:
        """Start the next turn's window at the earliest of the last `keep_turns` turns that
        still leaves room for a reply; the episode ends cut by the context when not even the
        newest turn (its reply and the observation that answered it) fits."""
        budget = self.max_context_tokens - self.max_tokens_per_turn - len(self.prompt_ids)
        starts = [ts for _, ts, _ in self.turn_spans[-self.keep_turns:]]
        fits = [s for s in starts if len(self.response_ids) - s <= budget]
        if fits:
            self._window_start = fits[0]
            return
        newest = len(self.response_ids) - starts[-1]
        self.truncated, self.cut = True, "context"
        self.context_error = (
            f"turn {self.num_turns + 1} does not fit: {len(self.prompt_ids)} prompt tokens "
            f"(system prompt and task) + {newest} for the newest turn and observation + "
            f"{self.max_tokens_per_turn} for the reply > generator.max_context_tokens="
            f"{self.max_context_tokens}")

    # -- output ------------------------------------------------------------------------------
    def to_trajectory(self, *, trajectory_id: str, group_id: str, task_id: str, env_name: str,
                      policy_version: int, info: dict[str, Any] | None = None) -> Trajectory:
        """The episode as a Trajectory. Its version is the oldest of its turns' where the
        loop was told them (`new_policy`), else `policy_version`; `turn_versions` is recorded
        when they differ (partial rollouts)."""
        versions = tuple(self.turn_versions)
        told = bool(versions) and len(versions) == self.num_turns
        several = told and len(set(versions)) > 1
        return Trajectory(
            trajectory_id=trajectory_id, group_id=group_id, task_id=task_id, env_name=env_name,
            policy_version=min(versions) if told else policy_version, horizon=self.horizon,
            prompt_ids=tuple(self.prompt_ids), response_ids=tuple(self.response_ids),
            response_mask=tuple(self.response_mask),
            response_logprobs=tuple(self.response_logprobs),
            rewards=tuple(self.rewards), reward=float(sum(self.rewards)),
            num_turns=self.num_turns, terminated=self.terminated, truncated=self.truncated,
            failure=self.failure, turn_seconds=tuple(self.turn_seconds),
            info={"success": self.success, "invalid_actions": len(self.invalid_turns),
                  "invalid_turns": list(self.invalid_turns), "actions": list(self.actions),
                  "state_keys": self.state_keys[:self.num_turns],
                  **({"cut": self.cut} if self.cut else {}),
                  **({"context_error": self.context_error} if self.context_error else {}),
                  **(info or {})},
            turn_spans=tuple(self.turn_spans) if self.keep_turns is not None else (),
            turn_versions=versions if several else (),
        )


def state_key(observation: str, info: dict[str, Any] | None) -> str:
    """A short digest of the state an observation shows: the env's own `info["state_key"]`
    where it defines one (TextCraft: the inventory; BabyAI: the view without the invalid-action
    note), else the observation with whitespace collapsed and case folded. Equal keys in one
    task group make GiGPO's anchor states (learner.turns); 16 hex digits keep `info` small."""
    key = (info or {}).get("state_key")
    text = key if isinstance(key, str) else " ".join(observation.split()).lower()
    return hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=8).hexdigest()


def run_episode(loop: AgentLoop, engine: Engine, env: TextEnv, *, seed: int,
                temperature: float = 1.0) -> AgentLoop:
    """Run one episode to the end with a single engine and env (no batching)."""
    obs, info = env.reset(seed=seed)
    loop.start(obs, info)
    while not loop.done:
        (completion,) = engine.generate([loop.context_ids], max_tokens=loop.max_tokens_per_turn,
                                        temperature=temperature)
        action = loop.add_model_turn(completion)
        loop.add_env_result(env.step(action))
    return loop
