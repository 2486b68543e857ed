"""Fault injection for chaos tests and drills: any registered env, with a fault at a chosen step.

    env: {name: faulty, kwargs: {env: babyai, env_kwargs: {...}, fault: exit, at_step: 7,
                                 once_file: /tmp/drill-1}}

`fault` is `exit` (the replica's whole process dies at once, as on OOM-kill or preemption),
`raise` (the env raises, as a buggy env does), `sleep` (the step hangs `sleep_s` seconds, as a
stuck browser or JVM does) or `latency` (every step waits `sleep_s` times a factor of mean 1,
as a remote env server answers: uniform in [1 - jitter, 1 + jitter], or with `heavy_tail` > 0
lognormal of that sigma, whose tail holds rare steps many times the mean, as a browser or a
loaded server has; each replica draws from its own generator, seeded by its creation order in
the process; `at_step` is ignored). `start_s` > 0 makes each replica take that long to build,
as a JVM or a browser on a loaded node does (on top of any fault).
`at_step` counts steps over the process's lifetime. With `once_file`
the fault fires once per drill: the file is created when it fires, and a replacement replica that
finds it behaves normally. The registry hands the drill BabyAI's prompt and parser, so drills
wrap BabyAI (the embedded default); the env itself can wrap any registered env.
"""

from __future__ import annotations

import itertools
import os
import random
import time
from pathlib import Path
from typing import Any

# The drill's prompt and parser are BabyAI's (re-exported for the registry).
from horizonrl.envpool.babyai import SYSTEM_PROMPT, format_action, parse_action, random_action  # noqa: F401
from horizonrl.envpool.base import StepResult, TextEnv
from horizonrl.envpool.registry import make_env

_INSTANCES = itertools.count()  # seeds each replica's latency draws
_STEPS = {"count": 0}  # per process: faults are about the process, not one replica


class FaultyEnv:
    """Wraps `env` and injects `fault` on the `at_step`-th step of this process."""

    def __init__(self, *, env: str, env_kwargs: dict[str, Any] | None = None,
                 fault: str = "exit", at_step: int = 1, once_file: str | None = None,
                 sleep_s: float = 5.0, jitter: float = 0.0, heavy_tail: float = 0.0,
                 start_s: float = 0.0) -> None:
        if fault not in ("exit", "raise", "sleep", "latency"):
            raise ValueError(f"fault must be exit, raise, sleep or latency, got {fault!r}")
        if not 0 <= jitter <= 1:
            raise ValueError(f"jitter must be in [0, 1], got {jitter}")
        if heavy_tail < 0:
            raise ValueError(f"heavy_tail (a lognormal sigma) must be >= 0, got {heavy_tail}")
        time.sleep(start_s)
        self.inner: TextEnv = make_env(env, **(env_kwargs or {}))
        self.fault, self.at_step, self.sleep_s = fault, at_step, sleep_s
        self.once_file = Path(once_file) if once_file else None
        self.jitter, self.heavy_tail = jitter, heavy_tail
        self._latency = random.Random(next(_INSTANCES))

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        return self.inner.reset(seed=seed, options=options)

    def step(self, action: str) -> StepResult:
        if self.fault == "latency":
            time.sleep(self.sleep_s * self._factor())
            return self.inner.step(action)
        _STEPS["count"] += 1
        if _STEPS["count"] >= self.at_step and self._arm():
            if self.fault == "exit":
                os._exit(137)
            if self.fault == "raise":
                raise RuntimeError("injected env fault")
            time.sleep(self.sleep_s)
        return self.inner.step(action)

    def _factor(self) -> float:
        """A latency factor of mean 1: lognormal(-sigma^2/2, sigma) with a heavy tail, else
        uniform within the jitter."""
        if self.heavy_tail > 0:
            s = self.heavy_tail
            return self._latency.lognormvariate(-s * s / 2, s)
        return self._latency.uniform(1 - self.jitter, 1 + self.jitter)

    def _arm(self) -> bool:
        """True once per drill (or every time without a once_file)."""
        if self.once_file is None:
            return True
        try:
            with self.once_file.open("x") as f:  # atomic: exactly one replica fires
                f.write(str(os.getpid()))
            return True
        except FileExistsError:
            return False

    def oracle_action(self) -> str:
        return self.inner.oracle_action()  # type: ignore[attr-defined]

    def close(self) -> None:
        self.inner.close()
