"""Environment replicas hosted in one process: `EnvWorker`, the body of each env actor.

A plain class, unit-testable without Ray: `EnvPool` (envpool/pool.py) makes it a Ray actor at the
edge, or calls it on a thread per worker with `env.in_process`. Every failure stays with its
replica and comes back as an `EnvError` in that replica's place, never as a raised exception, so
one broken env fails only its own episode.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from horizonrl.envpool.base import StepResult, TextEnv
from horizonrl.envpool.config import replica_kwargs
from horizonrl.envpool.registry import make_env
from horizonrl.protos.placement import node_ip


@dataclass(frozen=True, slots=True)
class EnvError:
    """An infrastructure failure in place of a step result: `kind` is env_error or timeout."""

    kind: str
    message: str



class EnvWorker:
    """Hosts `num_replicas` environments in one process; every env error stays per replica.

    With `recycle_every` > 0 a replica is closed and rebuilt before its next reset once it has run
    that many episodes: long-lived envs leak (a JVM grows from ~100 to ~670 MB over SciWorld
    episodes; AgentGym's WebShop server ran out of memory after 2.5 h of RL). A replica whose
    reset or step raised is rebuilt the same way before its next reset: its JVM, browser or
    connection may be dead, and a fresh one costs one env start.
    """

    def __init__(self, env_name: str, env_kwargs: dict[str, Any], num_replicas: int,
                 recycle_every: int = 0, threads: int = 1, first_replica: int = 0) -> None:
        self.env_name, self.env_kwargs = env_name, dict(env_kwargs)
        self.first_replica = first_replica  # this worker's replicas' place in the whole run
        self.envs = [self._make(r) for r in range(num_replicas)]
        self.episodes = [0] * num_replicas  # since the replica was (re)built
        self.broken = [False] * num_replicas  # raised since it was built: rebuild at reset
        self.recycle_every = recycle_every
        self.stats = {"steps": 0, "resets": 0, "recycles": 0, "rebuilds": 0, "errors": 0,
                      "step_seconds": 0.0}
        # Replicas of one batch run side by side for I/O-bound envs (env.step_threads).
        self._threads = ThreadPoolExecutor(threads) if threads > 1 else None
        self._lock = threading.Lock()  # the counters, when calls run on several threads

    def _each(self, fn: Any, items: Sequence[tuple]) -> list[Any]:
        """`fn(replica, arg)` for every item, in order; on the worker's threads if it has them
        (each replica is in at most one item: the pool lends a replica to one episode)."""
        if self._threads is None or len(items) < 2:
            return [fn(r, a) for r, a in items]
        return list(self._threads.map(lambda item: fn(*item), items))

    def _count(self, **add: float) -> None:
        with self._lock:
            for k, v in add.items():
                self.stats[k] += v

    def _make(self, replica: int) -> TextEnv:
        return make_env(self.env_name, **replica_kwargs(self.env_kwargs,
                                                        self.first_replica + replica))

    def ready(self) -> bool:
        return True

    def node_ip(self) -> str:
        return node_ip()

    def health(self) -> dict[str, Any]:
        """pid, replica count, counters, and the RSS of this process and its children (JVMs)."""
        import psutil

        me = psutil.Process()
        kids = me.children(recursive=True)
        rss_children = 0
        for k in kids:
            with contextlib.suppress(psutil.Error):
                rss_children += k.memory_info().rss
        return {"pid": os.getpid(), "replicas": len(self.envs), **self.stats,
                "rss_bytes": me.memory_info().rss, "children_rss_bytes": rss_children,
                "children": len(kids)}

    def _recycle_if_due(self, replica: int) -> None:
        due = self.recycle_every and self.episodes[replica] >= self.recycle_every
        if not (due or self.broken[replica]):
            return
        with contextlib.suppress(Exception):  # a broken env must not block its successor
            self.envs[replica].close()
        self.envs[replica] = self._make(replica)
        self._count(**{"rebuilds" if self.broken[replica] else "recycles": 1})
        self.episodes[replica], self.broken[replica] = 0, False

    def reset(self, items: Sequence[tuple[int, int]]) -> list[tuple[str, dict] | EnvError]:
        def one(replica: int, seed: int) -> tuple[str, dict] | EnvError:
            try:
                self._recycle_if_due(replica)
                out = self.envs[replica].reset(seed=seed)
                self.episodes[replica] += 1
                self._count(resets=1)
                return out
            except Exception as exc:  # one broken replica must not fail the batch
                self.broken[replica] = True
                self._count(errors=1)
                return EnvError("env_error", f"reset failed: {exc!r}")

        return self._each(one, items)

    def step(self, items: Sequence[tuple[int, str]]) -> list[StepResult | EnvError]:
        def one(replica: int, action: str) -> StepResult | EnvError:
            t0 = time.perf_counter()
            try:
                out = self.envs[replica].step(action)
                self._count(steps=1, step_seconds=time.perf_counter() - t0)
                return out
            except Exception as exc:
                self.broken[replica] = True
                self._count(errors=1, step_seconds=time.perf_counter() - t0)
                return EnvError("env_error", f"step failed: {exc!r}")

        return self._each(one, items)

    def oracle(self, items: Sequence[tuple[int, None]]) -> list[str | EnvError]:
        """Each replica's scripted-agent action (`oracle_action()`), for tests and baselines."""
        out: list[str | EnvError] = []
        for replica, _ in items:
            try:
                out.append(self.envs[replica].oracle_action())
            except Exception as exc:
                out.append(EnvError("env_error", f"oracle failed: {exc!r}"))
        return out

    def close(self) -> None:
        for env in self.envs:
            with contextlib.suppress(Exception):
                env.close()
        if self._threads is not None:
            self._threads.shutdown(wait=False)
