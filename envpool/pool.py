"""Environment replicas in Ray actors, handed out as slots, with timeouts and restarts.

`EnvWorker` (envpool/replicas.py) is a plain class hosting several replicas; `EnvPool`
spreads replicas over `EnvWorker` actors and batches calls: one Ray call per actor per turn
instead of one per replica. A dead or hung actor fails only the episodes it hosted (reported as
`EnvError`, so the learner masks them out instead of scoring 0) and is replaced. With
`env.in_process` the same EnvWorkers live in the pool's own process and are called on a thread
per worker, under the same deadline: no Ray round trip, for cheap pure-Python envs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from typing import Any

from horizonrl.envpool.config import EnvConfig
from horizonrl.envpool.replicas import EnvError, EnvWorker
from horizonrl.protos.placement import node_ip


@dataclass(slots=True)
class PendingCall:
    """A submitted pool call: per actor its call (Ray ref or future), the positions it
    answers, the actor's epoch when it went out and its deadline (time.monotonic())."""

    method: str
    results: list[Any]
    calls: dict[int, tuple[Any, list[int], int, float]]
    t_start: float


@dataclass(frozen=True, slots=True)
class Slot:
    """One replica lent out by the pool; `epoch` tells if its actor was restarted since."""

    actor: int
    replica: int
    epoch: int


class EnvPool:
    """Replicas spread over `cfg.num_actors` EnvWorker actors. Lives in its generator's process.

    The actors start on first use, in the process that uses the pool: a pool built by the
    driver and handed to a generator starts them from the generator, beside it on its node
    (soft node affinity, `env.colocate`), so env steps do not cross the network.
    """

    def __init__(self, cfg: EnvConfig, *, name: str = "envpool", index: int = 0,
                 agent: str | None = None) -> None:
        """`index`: this pool's place among the run's pools of `cfg` (its generator's), so
        that per-replica kwargs (`urls`) give every replica of the run its own entry.
        `agent`: `module:function` of a user agent each replica runs (envpool/agent_worker.py)
        through the `agent` call, all replicas of an actor at once."""
        self.cfg = cfg
        self.agent = agent
        # Calls an actor serves at once: a running agent holds its replica's thread.
        self.concurrency = cfg.replicas_per_actor if agent else cfg.step_threads
        self.name = name
        self.index = index
        self._actors: list[Any] | None = None  # Ray actors, or EnvWorkers with `in_process`
        self._threads: ThreadPoolExecutor | None = None  # in_process: the calls' deadlines
        # Ray actors not yet known to have started: their `ready` ref. A call to one waits
        # env.start_timeout_s on top of its own deadline, so a slow start (a JVM, a browser,
        # a loaded node) is not taken for a hung call and restarted again.
        self._starting: dict[int, Any] = {}
        self.epochs = [0] * cfg.num_actors
        self.restarts = 0
        # Client-side pool metrics: calls and their latency, failures by kind.
        self.calls = {"reset": 0, "step": 0, "oracle": 0, "agent": 0}
        self.call_seconds = 0.0
        self.errors = {"env_error": 0, "timeout": 0}
        self._free = [(a, r) for a in range(cfg.num_actors) for r in range(cfg.replicas_per_actor)]

    @property
    def actors(self) -> list[Any]:
        if self._actors is None:
            self._actors = [self._spawn(a) for a in range(self.cfg.num_actors)]
        return self._actors

    @property
    def capacity(self) -> int:
        return self.cfg.num_actors * self.cfg.replicas_per_actor

    def _spawn(self, actor: int) -> Any:
        first = (self.index * self.cfg.num_actors + actor) * self.cfg.replicas_per_actor
        args = (self.cfg.name, self.cfg.kwargs, self.cfg.replicas_per_actor,
                self.cfg.recycle_every_episodes, self.cfg.step_threads, first)
        worker: Any = EnvWorker
        extra = {"agent": self.agent} if self.agent else {}
        if self.agent:
            from horizonrl.envpool.agent_worker import AgentWorker as worker
        if self.cfg.in_process:
            return worker(*args, **extra)
        import ray

        # step_threads > 1: a threaded actor, so calls from episodes running independently
        # do not queue behind each other.
        remote = ray.remote(num_cpus=self.cfg.num_cpus_per_actor,
                            resources=self.cfg.resources or None, max_restarts=0,
                            max_concurrency=self.concurrency)(worker)
        if self.cfg.colocate:  # soft: another node where this one lacks room or resources
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            remote = remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
                ray.get_runtime_context().get_node_id(), soft=True))
        handle = remote.remote(*args, **extra)
        self._starting[actor] = handle.ready.remote()
        return handle

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Block until every env actor has started (default: `env.start_timeout_s`)."""
        actors = self.actors  # in_process: built on the spot, nothing to wait for
        if not self.cfg.in_process:
            import ray

            # The `ready` pings the spawns already sent, rather than new ones.
            refs = [self._starting.get(i) or a.ready.remote() for i, a in enumerate(actors)]
            ray.get(refs, timeout=self.cfg.start_timeout_s if timeout_s is None else timeout_s)
            self._starting.clear()

    def node_ips(self) -> list[str]:
        """The node each env actor runs on (in_process: this process's)."""
        import ray

        if self.cfg.in_process:
            return [node_ip()] * len(self.actors)
        return ray.get([a.node_ip.remote() for a in self.actors])

    def close(self) -> None:
        """Close every replica (the actors' processes end with their handles)."""
        for a in self.actors:
            if self.cfg.in_process:
                a.close()
            else:
                a.close.remote()
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)

    def acquire(self, n: int) -> list[Slot]:
        if n > len(self._free):
            raise RuntimeError(f"{self.name}: asked for {n} replicas, {len(self._free)} free of "
                               f"{self.capacity}; raise env.replicas_per_actor or env.num_actors")
        taken, self._free = self._free[:n], self._free[n:]
        return [Slot(a, r, self.epochs[a]) for a, r in taken]

    def free_replicas(self) -> int:
        """Replicas not lent out."""
        return len(self._free)

    def release(self, slots: Sequence[Slot]) -> None:
        self._free.extend((s.actor, s.replica) for s in slots)

    def reset(self, slots: Sequence[Slot], seeds: Sequence[int]) -> list[Any]:
        return self._call("reset", slots, [(s.replica, int(x)) for s, x in zip(slots, seeds)])

    def step(self, slots: Sequence[Slot], actions: Sequence[str]) -> list[Any]:
        return self._call("step", slots, [(s.replica, a) for s, a in zip(slots, actions)])

    def oracle(self, slots: Sequence[Slot]) -> list[Any]:
        """The scripted agent's next action per slot (str), or EnvError."""
        return self._call("oracle", slots, [(s.replica, None) for s in slots])

    def stats(self) -> dict[str, float]:
        """Counters since the pool was built (for metrics: steps/s, latency, restarts, errors)."""
        n = sum(self.calls.values())
        return {"calls": n, "steps": self.calls["step"], "restarts": self.restarts,
                "errors_env_error": self.errors["env_error"],
                "errors_timeout": self.errors["timeout"],
                "call_seconds": self.call_seconds,
                "call_latency_mean_s": self.call_seconds / max(n, 1)}

    def _call(self, method: str, slots: Sequence[Slot], items: list[tuple]) -> list[Any]:
        """One call per actor, waited for; results in slot order; failures become EnvError."""
        return self.collect(self.submit(method, slots, items))

    def submit(self, method: str, slots: Sequence[Slot], items: list[tuple],
               timeout_s: float | None = None) -> PendingCall:
        """Start `method` (reset, step, oracle, agent) on each slot's replica with its item
        (replica, arg): one call per actor; `collect` waits for it, up to `timeout_s` (default
        env.call_timeout_s). Episodes that run independently keep several in flight."""
        timeout_s = timeout_s or self.cfg.call_timeout_s
        pending = PendingCall(method, [None] * len(slots), {}, time.perf_counter())
        by_actor: dict[int, list[int]] = {}
        for i, s in enumerate(slots):
            if s.epoch != self.epochs[s.actor]:
                pending.results[i] = EnvError("env_error", "replica lost: its actor was restarted")
            else:
                by_actor.setdefault(s.actor, []).append(i)
        for a, idx in by_actor.items():
            deadline = time.monotonic() + timeout_s + self._start_allowance(a)
            pending.calls[a] = (self._submit(a, method, [items[i] for i in idx]), idx,
                                self.epochs[a], deadline)
        return pending

    def _start_allowance(self, actor: int) -> float:
        """env.start_timeout_s while `actor` has not answered its `ready` ping yet, else 0."""
        ref = self._starting.get(actor)
        if ref is None:
            return 0.0
        import ray

        if ray.wait([ref], timeout=0)[0]:
            del self._starting[actor]
            return 0.0
        return self.cfg.start_timeout_s

    def ready(self, pendings: Sequence[PendingCall], wait_s: float = 0.0) -> list[bool]:
        """`done` for several submitted calls at once (one `ray.wait` for all of them);
        with `wait_s` > 0, first waits up to that long for any of them to be answered."""
        calls = [c for p in pendings for c, _, _, _ in p.calls.values()]
        if calls and wait_s > 0:
            if self.cfg.in_process:
                futures_wait(calls, timeout=wait_s, return_when=FIRST_COMPLETED)
            else:
                import ray

                ray.wait(calls, num_returns=1, timeout=wait_s)
        if not calls:
            answered: set[int] = set()
        elif self.cfg.in_process:
            answered = {id(c) for c in calls if c.done()}
        else:
            import ray

            answered = {id(c) for c in ray.wait(calls, num_returns=len(calls), timeout=0)[0]}
        now = time.monotonic()
        return [all(id(c) in answered or now >= deadline for c, _, _, deadline in p.calls.values())
                for p in pendings]

    def collect(self, pending: PendingCall) -> list[Any]:
        """The results of a submitted call, in slot order, waiting up to its deadline. A call
        past it fails its episodes (timeout) and restarts the actor; a dead actor fails its
        episodes (env_error) and is replaced, once, whichever call finds it."""
        import ray

        results = pending.results
        # The actor died, or an in-process worker raised out of its per-replica guards.
        died = Exception if self.cfg.in_process else ray.exceptions.RayActorError
        for a, (call, idx, epoch, deadline) in pending.calls.items():
            try:
                got = self._result(call, max(0.0, deadline - time.monotonic()))
            except (ray.exceptions.GetTimeoutError, FutureTimeout):
                got = [EnvError("timeout", f"{pending.method} passed its deadline")] * len(idx)
                self._restart(a, kill=True, epoch=epoch)
            except died as exc:
                got = [EnvError("env_error", f"env actor died: {type(exc).__name__}")] * len(idx)
                self._restart(a, kill=False, epoch=epoch)
            for i, r in zip(idx, got):
                results[i] = r
        self.calls[pending.method] += len(results)
        self.call_seconds += time.perf_counter() - pending.t_start
        for r in results:
            if isinstance(r, EnvError):
                self.errors[r.kind] = self.errors.get(r.kind, 0) + 1
        return results

    def _submit(self, actor: int, method: str, batch: list[tuple]) -> Any:
        """Start one batched call: a Ray ref, or a future on the in-process thread pool."""
        if not self.cfg.in_process:
            return getattr(self.actors[actor], method).remote(batch)
        if self._threads is None:
            self._threads = ThreadPoolExecutor(self.cfg.num_actors * self.concurrency,
                                               thread_name_prefix=self.name)
        return self._threads.submit(getattr(self.actors[actor], method), batch)

    def _result(self, call: Any, timeout: float) -> Any:
        import ray

        return call.result(timeout=timeout) if self.cfg.in_process else ray.get(
            call, timeout=timeout)

    def _restart(self, actor: int, *, kill: bool, epoch: int | None = None) -> None:
        """Replace `actor`; with `epoch`, only if no other call has replaced it since."""
        import ray

        if epoch is not None and epoch != self.epochs[actor]:
            return
        if kill and self.cfg.in_process:
            # A hung in-process env cannot be killed: its thread is abandoned (a fresh pool
            # takes the next calls) and the replicas rebuilt. Calls already queued on the old
            # pool still run there (or meet their own deadline). Two actors timed out in one
            # call: the first restart already dropped the pool.
            if self._threads is not None:
                self._threads.shutdown(wait=False)
                self._threads = None
        elif kill:
            ray.kill(self.actors[actor], no_restart=True)
        self.actors[actor] = self._spawn(actor)
        self.epochs[actor] += 1
        self.restarts += 1

    def heal(self, timeout_s: float | None = None) -> int:
        """Health-check every actor (a `ready` ping under a deadline) and replace the ones that
        are dead or hung, so an idle actor that died between rollouts fails no episode.
        Returns how many were replaced. Call it only while no slot is lent out."""
        import ray

        if self.cfg.in_process:
            return 0  # the replicas live in this process: alive as long as it is
        base = time.monotonic() + (timeout_s or self.cfg.call_timeout_s)
        deadlines = [base + self._start_allowance(i) for i in range(len(self.actors))]
        refs = [a.ready.remote() for a in self.actors]
        replaced = 0
        for i, (ref, deadline) in enumerate(zip(refs, deadlines)):
            try:
                ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
                self._restart(i, kill=True)
                replaced += 1
        return replaced

    def health(self) -> list[dict[str, Any] | str]:
        import ray

        out: list[dict[str, Any] | str] = []
        if self.cfg.in_process:
            return [a.health() for a in self.actors]
        for a in self.actors:
            try:
                out.append(ray.get(a.health.remote(), timeout=self.cfg.call_timeout_s))
            except Exception as exc:
                out.append(f"unhealthy: {type(exc).__name__}")
        return out
