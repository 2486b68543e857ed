"""User agents as env replicas: `agent.callable` runs its own loop against the endpoint.

An `AgentWorker` is an `EnvWorker` whose replicas each run one episode of the user's agent at a
time, on a thread of their own: `agent(items)` calls the function with an `AgentTask` (the
task seed, an OpenAI client for the episode's endpoint and key, and the replica's env behind
`TaskEnv`) and returns what it ended with. The pool gives these calls the env calls' deadline,
failure marking and restarts. The function may be sync or async and returns the episode's
reward, or None to take the reward the env gave through `task.env`.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from horizonrl.envpool.base import StepResult, TextEnv
from horizonrl.envpool.pool import EnvError, EnvWorker


@dataclass(frozen=True, slots=True)
class AgentOutcome:
    """What an agent's run ended with (envpool/agent_worker.py reports it)."""

    reward: float
    terminated: bool = True
    success: bool = False
    env_steps: int = 0
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AgentCall:
    """What the generator sends to run one episode."""

    seed: int
    task_id: str
    base_url: str
    api_key: str
    model: str
    horizon: int


class TaskEnv:
    """The replica's env for one episode, keeping the reward, end, success and rejected
    actions it reported."""

    def __init__(self, env: TextEnv, seed: int) -> None:
        self._env, self.seed = env, seed
        self.reward, self.steps, self.invalid = 0.0, 0, 0
        self.terminated = self.success = self.started = False

    def reset(self) -> tuple[str, dict[str, Any]]:
        """The task's first observation (always the task's own seed)."""
        self.started = True
        return self._env.reset(seed=self.seed)

    def step(self, action: str) -> StepResult:
        if not self.started:
            raise RuntimeError("call task.env.reset() before task.env.step()")
        result = self._env.step(action)
        self.steps += 1
        self.invalid += bool(result.info.get("invalid_action", False))
        self.reward += float(result.reward)
        self.terminated = self.terminated or bool(result.terminated)
        self.success = self.success or bool(result.info.get("success", False))
        return result


@dataclass(slots=True)
class AgentTask:
    """What the user's agent function gets for one episode."""

    seed: int
    task_id: str
    env_name: str
    horizon: int  # model calls the episode may make (the curriculum's horizon)
    base_url: str
    api_key: str
    model: str
    env: TaskEnv

    def client(self, **kwargs: Any) -> Any:
        """An `openai.OpenAI` client for this episode (no retries by default: a retried
        request after a lost reply reads as an edited history)."""
        from openai import OpenAI

        return OpenAI(base_url=self.base_url, api_key=self.api_key,
                      **{"max_retries": 0, **kwargs})

    def async_client(self, **kwargs: Any) -> Any:
        from openai import AsyncOpenAI

        return AsyncOpenAI(base_url=self.base_url, api_key=self.api_key,
                           **{"max_retries": 0, **kwargs})


def load_agent(path: str) -> Callable[[AgentTask], Any]:
    """The function `module:function` names; a clear error when it cannot be imported."""
    module, sep, name = path.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"agent.callable must be 'module:function', got {path!r}")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"agent.callable {path!r} cannot be loaded: {exc}") from exc
    if not callable(fn):
        raise ValueError(f"agent.callable {path!r} is not callable")
    return fn


def run_agent(fn: Callable[[AgentTask], Any], task: AgentTask) -> AgentOutcome:
    """Run the agent to its end (an async one on an event loop of its own)."""
    out = asyncio.run(fn(task)) if inspect.iscoroutinefunction(fn) else fn(task)
    if inspect.isawaitable(out):
        out = asyncio.run(_wait(out))
    env = task.env
    if out is not None and not isinstance(out, (int, float)):
        raise TypeError(f"the agent returned {type(out).__name__}; return the reward (a "
                        "number) or None to take the env's")
    reward = env.reward if out is None else float(out)
    return AgentOutcome(reward=reward, terminated=env.terminated or not env.started,
                        success=env.success if env.started else reward > 0,
                        env_steps=env.steps, info={"env_invalid_steps": env.invalid})


async def _wait(awaitable: Any) -> Any:
    return await awaitable


class AgentWorker(EnvWorker):
    """Replicas that each run the user's agent, all of them at once (a thread per replica)."""

    def __init__(self, env_name: str, env_kwargs: dict[str, Any], num_replicas: int,
                 recycle_every: int = 0, threads: int = 1, first_replica: int = 0, *,
                 agent: str) -> None:
        super().__init__(env_name, env_kwargs, num_replicas, recycle_every,
                         max(threads, num_replicas), first_replica)
        self.fn = load_agent(agent)

    def agent(self, items: Sequence[tuple[int, AgentCall]]) -> list[AgentOutcome | EnvError]:
        def one(replica: int, call: AgentCall) -> AgentOutcome | EnvError:
            try:
                self._recycle_if_due(replica)
                self.episodes[replica] += 1
                task = AgentTask(call.seed, call.task_id, self.env_name, call.horizon,
                                 call.base_url, call.api_key, call.model,
                                 TaskEnv(self.envs[replica], call.seed))
                outcome = run_agent(self.fn, task)
                self._count(resets=1, steps=outcome.env_steps)
                return outcome
            except Exception as exc:  # the agent's error fails its episode, not the batch
                self.broken[replica] = True
                self._count(errors=1)
                return EnvError("env_error", f"agent raised {exc!r}")

        return self._each(one, items)
