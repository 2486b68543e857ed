"""Episodes that run independently: each its own loop over a continuously batching engine.

In the lock-step loop (`GeneratorActor._wave`) every turn waits for the slowest reply and the
slowest env step of all live episodes, and a finished episode's replica idles until the wave
ends. Here each episode moves on as soon as its own reply or env result is in: a reply goes to
the env at once (replies that finished in the same engine step share one call per env actor),
an env result goes back to the engine at once (vLLM adds it to the running batch), and a
finished episode is pushed and frees its replica for the next episode waiting. Env calls are in
flight while the engine steps for the other episodes.

One thread drives it all (no locks around the engine or the AgentLoops): engine steps in
between non-blocking checks of the env calls in flight. A plain class; tests drive it with
in-process env pools and a batch-only engine behind `BatchSteps`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from horizonrl.actors.rollout import AgentLoop, Completion, Engine
from horizonrl.envpool.pool import EnvPool, PendingCall, Slot
from horizonrl.envpool.replicas import EnvError
from horizonrl.protos.reports import RolloutSeconds
from horizonrl.protos.trajectory import Failure

_IDLE_WAIT_S = 0.001  # between checks of several pools while the engine has nothing to do
_ADMIT_WAIT_S = 0.05  # nothing in flight, the next episode not admitted yet: between checks


class StepEngine(Protocol):
    """An engine that batches requests as they come (vLLM's engine step loop)."""

    def submit(self, request_id: str, prompt: Sequence[int], *, max_tokens: int,
               temperature: float) -> None: ...

    def step(self) -> list[tuple[str, Completion]]: ...

    def busy(self) -> bool: ...

    def abort(self, request_ids: list[str]) -> None: ...


class BatchSteps:
    """A batch-only `Engine` as a StepEngine: each step generates every prompt queued since
    the last one, in one `generate` call."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.queue: list[tuple[str, list[int], int, float]] = []

    def submit(self, request_id: str, prompt: Sequence[int], *, max_tokens: int,
               temperature: float) -> None:
        self.queue.append((request_id, list(prompt), max_tokens, temperature))

    def step(self) -> list[tuple[str, Completion]]:
        batch, self.queue = self.queue, []
        out = self.engine.generate([p for _, p, _, _ in batch], max_tokens=batch[0][2],
                                   temperature=batch[0][3]) if batch else []
        return [(rid, c) for (rid, _, _, _), c in zip(batch, out)]

    def busy(self) -> bool:
        return bool(self.queue)

    def abort(self, request_ids: list[str]) -> None:
        drop = set(request_ids)
        self.queue = [q for q in self.queue if q[0] not in drop]


def step_engine(engine: Engine | StepEngine) -> StepEngine:
    """The engine itself when it batches continuously, else `BatchSteps` around it."""
    return engine if hasattr(engine, "submit") else BatchSteps(engine)  # type: ignore[return-value]


@dataclass(slots=True)
class Episode:
    """One episode of the rollout: its loop, env label, task seed and (once started) replica."""

    index: int
    key: str
    seed: int
    loop: AgentLoop
    slot: Slot | None = None
    step: int | None = None  # the training step it is drawn for (the admission bound)


@dataclass(slots=True)
class Tally:
    """What a rollout counted, in either loop (lock-step or independent): seconds by where
    they went, tokens, steps, peak concurrency."""

    generate: float = 0.0
    env: float = 0.0  # waiting on env calls with nothing for the engine to do
    overlap: float = 0.0  # env calls in flight while the engine stepped
    transport: float = 0.0  # handing finished trajectories to the sender
    generated_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    env_steps: int = 0
    peak_in_flight: int = 0

    def add(self, other: Tally) -> None:
        """Count `other`'s figures in too (the peak is the larger one)."""
        for name in self.__slots__:
            if name != "peak_in_flight":
                setattr(self, name, getattr(self, name) + getattr(other, name))
        self.peak_in_flight = max(self.peak_in_flight, other.peak_in_flight)

    def seconds(self) -> RolloutSeconds:
        return RolloutSeconds(generate=self.generate, env=self.env, transport=self.transport,
                              overlap=self.overlap)

    def counts(self) -> dict[str, int]:
        """The token and step counts, as `RolloutReport` names them."""
        return {"generated_tokens": self.generated_tokens, "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens, "env_steps": self.env_steps}


def take_startable(waiting: deque, pools: dict[str, EnvPool], admit: Callable[[int | None], bool],
                   room: int) -> list:
    """Up to `room` episodes from the front of `waiting` that may start now, each given a
    replica (`slot`) of its env: in order, while `admit(step)` allows their step (steps
    ascend, so nothing after a refused one is admitted either); one whose env has no free
    replica stays queued, in its place, for a later call."""
    taken, skipped = [], deque()
    while waiting and len(taken) < room:
        ep = waiting.popleft()
        if not admit(ep.step):
            waiting.appendleft(ep)
            break
        if pools[ep.key].free_replicas() == 0:
            skipped.append(ep)
            continue
        (ep.slot,) = pools[ep.key].acquire(1)
        taken.append(ep)
    waiting.extendleft(reversed(skipped))
    return taken


class IndependentEpisodes:
    """Runs a rollout's episodes to the end, each independently; at most `max_in_flight`
    started and unfinished at once (and never more than its env has replicas).
    `on_done(episodes)` is called with the episodes that finished together (to push them).

    Partial rollouts: when `news()` says a newer policy was posted, no new turn is sent to the
    engine; the generations in flight finish with the weights they started with, and once none
    is left `take_news()` loads the new weights (and horizon) and the held turns go out. So a
    turn is never sampled by two versions, and env calls go on meanwhile. Episodes wait to
    start until `admit(step)` (the board's frontier) allows their step, in the order given
    (steps ascending); once `closed()` says the run is ending, those not started never are."""

    def __init__(self, engine: Engine | StepEngine, pools: dict[str, EnvPool], *,
                 max_tokens: int, temperature: float, max_in_flight: int,
                 on_done: Callable[[list[Episode]], None],
                 news: Callable[[], bool] | None = None,
                 take_news: Callable[[], None] | None = None,
                 admit: Callable[[int | None], bool] | None = None,
                 closed: Callable[[], bool] | None = None) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.engine = step_engine(engine)
        self.pools = pools
        self.max_tokens, self.temperature = max_tokens, temperature
        self.max_in_flight = max_in_flight
        self.on_done = on_done
        self.tally = Tally()
        self._waiting: deque[Episode] = deque()
        self._running: dict[int, Episode] = {}
        self._requests: dict[str, Episode] = {}
        self._calls: list[tuple[PendingCall, list[Episode]]] = []  # env calls in flight
        self._rid = 0
        self.news, self.take_news = news, take_news
        self.admit = admit or (lambda step: True)
        self.closed = closed or (lambda: False)
        self._held: list[Episode] | None = None  # turns held back while the engine drains

    def run(self, episodes: Sequence[Episode]) -> Tally:
        self._waiting.extend(episodes)
        try:
            while self._waiting or self._running:
                self._switch_policy()
                if self.closed():
                    self._waiting.clear()
                self._start_waiting()
                t0 = time.perf_counter()
                if self.engine.busy():
                    self._engine_step()
                    if self._calls:
                        self.tally.overlap += time.perf_counter() - t0
                elif self._calls:
                    self._wait_env()
                    self.tally.env += time.perf_counter() - t0
                elif not self._running and self._waiting:  # held back by the frontier
                    time.sleep(_ADMIT_WAIT_S)
                self._collect_env()
        finally:
            if self._requests:  # an error stopped the run: leave nothing queued or lent out
                self.engine.abort(list(self._requests))
            for ep in self._running.values():
                if ep.slot is not None:
                    self.pools[ep.key].release([ep.slot])
        return self.tally

    # -- starting ----------------------------------------------------------------------------
    def _start_waiting(self) -> None:
        """Start waiting episodes while the bound allows and their env has a free replica; the
        resets of one env go out as one call."""
        starts: dict[str, list[Episode]] = {}
        for ep in take_startable(self._waiting, self.pools, self.admit,
                                 self.max_in_flight - len(self._running)):
            self._running[ep.index] = ep
            starts.setdefault(ep.key, []).append(ep)
        for key, eps in starts.items():
            self._submit_env(key, "reset", eps, [ep.seed for ep in eps])
        self.tally.peak_in_flight = max(self.tally.peak_in_flight, len(self._running))

    # -- the engine --------------------------------------------------------------------------
    def _switch_policy(self) -> None:
        """Partial rollouts: start holding new turns when news arrives; take it once the
        engine has nothing in flight, then send the held turns."""
        if self.news is None:
            return
        if self._held is None and self.news():
            self._held = []
        if self._held is not None and not self._requests:
            held, self._held = self._held, None
            self.take_news()
            for ep in held:
                self._generate(ep)

    def _generate(self, ep: Episode) -> None:
        if self._held is not None:
            self._held.append(ep)
            return
        rid = f"ep{ep.index}-r{self._rid}"
        self._rid += 1
        self._requests[rid] = ep
        prompt = ep.loop.context_ids
        self.tally.prompt_tokens += len(prompt)
        self.engine.submit(rid, prompt, max_tokens=self.max_tokens, temperature=self.temperature)

    def _engine_step(self) -> None:
        t0 = time.perf_counter()
        finished = self.engine.step()
        self.tally.generate += time.perf_counter() - t0
        acting: dict[str, list[tuple[Episode, str]]] = {}
        for rid, completion in finished:
            ep = self._requests.pop(rid)
            self.tally.generated_tokens += len(completion.token_ids)
            self.tally.cached_tokens += completion.cached_tokens
            acting.setdefault(ep.key, []).append((ep, ep.loop.add_model_turn(completion)))
        for key, items in acting.items():
            self._submit_env(key, "step", [ep for ep, _ in items], [a for _, a in items])
            self.tally.env_steps += len(items)

    # -- the envs ----------------------------------------------------------------------------
    def _submit_env(self, key: str, method: str, eps: list[Episode], args: list) -> None:
        """One call per env actor for the episodes ready together; one call per episode where
        the actor serves calls side by side (`env.step_threads` > 1: slow, I/O-bound steps),
        so no episode waits for the slowest step of a batch."""
        pool = self.pools[key]
        pairs = list(zip(eps, args))
        for part in [[p] for p in pairs] if pool.cfg.step_threads > 1 else [pairs]:
            call = pool.submit(method, [ep.slot for ep, _ in part],
                               [(ep.slot.replica, a) for ep, a in part])
            self._calls.append((call, [ep for ep, _ in part]))

    def _wait_env(self) -> None:
        """Nothing to generate: wait until some env call is answered (or past its deadline)."""
        by_pool = self._calls_by_pool()
        wait_s = _IDLE_WAIT_S if len(by_pool) > 1 else 0.05  # one pool: block on it alone
        while not any(any(self.pools[key].ready(calls, wait_s=wait_s))
                      for key, calls in by_pool.items()):
            pass

    def _calls_by_pool(self) -> dict[str, list[PendingCall]]:
        by_pool: dict[str, list[PendingCall]] = {}
        for call, eps in self._calls:
            by_pool.setdefault(eps[0].key, []).append(call)
        return by_pool

    def _collect_env(self) -> None:
        answered: set[int] = set()
        for key, calls in self._calls_by_pool().items():  # one check per pool
            answered |= {id(c) for c, ok in zip(calls, self.pools[key].ready(calls)) if ok}
        if not answered:
            return
        done_calls = [(c, eps) for c, eps in self._calls if id(c) in answered]
        self._calls = [(c, eps) for c, eps in self._calls if id(c) not in answered]
        finished: list[Episode] = []
        for call, eps in done_calls:
            for ep, result in zip(eps, self.pools[eps[0].key].collect(call)):
                if isinstance(result, EnvError):
                    ep.loop.fail(Failure(result.kind))
                elif call.method == "reset":
                    ep.loop.start(*result)
                else:
                    ep.loop.add_env_result(result)
                if ep.loop.done:
                    finished.append(ep)
                else:
                    self._generate(ep)
        if finished:
            for ep in finished:
                del self._running[ep.index]
                self.pools[ep.key].release([ep.slot])
            self.on_done(finished)
