"""Environment replicas in Ray actors, handed out as slots, with timeouts and restarts.

`EnvWorker` is a plain class (unit-testable without Ray) hosting several replicas; `EnvPool`
spreads replicas over `EnvWorker` actors and batches calls: one Ray call per actor per turn
instead of one per replica. A dead or hung actor fails only the episodes it hosted (reported as
`EnvError`, so the learner masks them out instead of scoring 0) and is replaced.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from envpool.base import StepResult
from envpool.config import EnvConfig
from envpool.registry import make_env


@dataclass(frozen=True, slots=True)
class EnvError:
    """An infrastructure failure in place of a step result: `kind` is env_error or timeout."""

    kind: str
    message: str


@dataclass(frozen=True, slots=True)
class Slot:
    """One replica lent out by the pool; `epoch` tells if its actor was restarted since."""

    actor: int
    replica: int
    epoch: int


class EnvWorker:
    """Hosts `num_replicas` environments in one process; every env error stays per replica."""

    def __init__(self, env_name: str, env_kwargs: dict[str, Any], num_replicas: int) -> None:
        self.envs = [make_env(env_name, **env_kwargs) for _ in range(num_replicas)]
        self.steps = 0

    def ready(self) -> bool:
        return True

    def health(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "replicas": len(self.envs), "steps": self.steps}

    def reset(self, items: Sequence[tuple[int, int]]) -> list[tuple[str, dict] | EnvError]:
        out: list[tuple[str, dict] | EnvError] = []
        for replica, seed in items:
            try:
                out.append(self.envs[replica].reset(seed=seed))
            except Exception as exc:  # one broken replica must not fail the batch
                out.append(EnvError("env_error", f"reset failed: {exc!r}"))
        return out

    def step(self, items: Sequence[tuple[int, str]]) -> list[StepResult | EnvError]:
        out: list[StepResult | EnvError] = []
        for replica, action in items:
            try:
                out.append(self.envs[replica].step(action))
                self.steps += 1
            except Exception as exc:
                out.append(EnvError("env_error", f"step failed: {exc!r}"))
        return out

    def close(self) -> None:
        for env in self.envs:
            env.close()


class EnvPool:
    """Replicas spread over `cfg.num_actors` EnvWorker actors. Lives in its generator's process."""

    def __init__(self, cfg: EnvConfig, *, name: str = "envpool") -> None:
        self.cfg = cfg
        self.name = name
        self.actors: list[Any] = [self._spawn() for _ in range(cfg.num_actors)]
        self.epochs = [0] * cfg.num_actors
        self.restarts = 0
        self._free = [(a, r) for a in range(cfg.num_actors) for r in range(cfg.replicas_per_actor)]

    @property
    def capacity(self) -> int:
        return self.cfg.num_actors * self.cfg.replicas_per_actor

    def _spawn(self) -> Any:
        import ray

        remote = ray.remote(num_cpus=self.cfg.num_cpus_per_actor, max_restarts=0)(EnvWorker)
        return remote.remote(self.cfg.name, self.cfg.kwargs, self.cfg.replicas_per_actor)

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        import ray

        ray.get([a.ready.remote() for a in self.actors], timeout=timeout_s)

    def acquire(self, n: int) -> list[Slot]:
        if n > len(self._free):
            raise RuntimeError(f"{self.name}: asked for {n} replicas, {len(self._free)} free of "
                               f"{self.capacity}; raise env.replicas_per_actor or env.num_actors")
        taken, self._free = self._free[:n], self._free[n:]
        return [Slot(a, r, self.epochs[a]) for a, r in taken]

    def release(self, slots: Sequence[Slot]) -> None:
        self._free.extend((s.actor, s.replica) for s in slots)

    def reset(self, slots: Sequence[Slot], seeds: Sequence[int]) -> list[Any]:
        return self._call("reset", slots, [(s.replica, int(x)) for s, x in zip(slots, seeds)])

    def step(self, slots: Sequence[Slot], actions: Sequence[str]) -> list[Any]:
        return self._call("step", slots, [(s.replica, a) for s, a in zip(slots, actions)])

    def _call(self, method: str, slots: Sequence[Slot], items: list[tuple]) -> list[Any]:
        """One remote call per actor; results in slot order; failures become EnvError."""
        import ray

        results: list[Any] = [None] * len(slots)
        by_actor: dict[int, list[int]] = {}
        for i, s in enumerate(slots):
            if s.epoch != self.epochs[s.actor]:
                results[i] = EnvError("env_error", "replica lost: its actor was restarted")
            else:
                by_actor.setdefault(s.actor, []).append(i)
        refs = {a: getattr(self.actors[a], method).remote([items[i] for i in idx])
                for a, idx in by_actor.items()}
        deadline = time.monotonic() + self.cfg.call_timeout_s
        for a, ref in refs.items():
            try:
                got = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except ray.exceptions.GetTimeoutError:
                got = [EnvError("timeout", f"{method} exceeded {self.cfg.call_timeout_s}s")] * len(
                    by_actor[a])
                self._restart(a, kill=True)
            except ray.exceptions.RayActorError as exc:
                got = [EnvError("env_error", f"env actor died: {type(exc).__name__}")] * len(
                    by_actor[a])
                self._restart(a, kill=False)
            for i, r in zip(by_actor[a], got):
                results[i] = r
        return results

    def _restart(self, actor: int, *, kill: bool) -> None:
        import ray

        if kill:
            ray.kill(self.actors[actor], no_restart=True)
        self.actors[actor] = self._spawn()
        self.epochs[actor] += 1
        self.restarts += 1

    def health(self) -> list[dict[str, Any] | str]:
        import ray

        out: list[dict[str, Any] | str] = []
        for a in self.actors:
            try:
                out.append(ray.get(a.health.remote(), timeout=self.cfg.call_timeout_s))
            except Exception as exc:
                out.append(f"unhealthy: {type(exc).__name__}")
        return out
