"""A rollout of user agents: each episode's agent runs its own loop in an env replica and asks
the generator's endpoint for every reply.

One thread drives it (as in actors/episodes.py): it starts agents while replicas are free and
the admission bound allows, turns queued endpoint requests into prompts (the session's
exact-token rule), steps the engine over whatever is queued (vLLM batches the episodes'
requests as they come), answers each request as its reply finishes, and when an agent's call
returns, closes its session into a Trajectory. An agent that raises, times out or dies fails
its episode (masked out by the learner, counted by the ledger); a request for a finished
episode gets a clear error.

Partial rollouts: when a newer policy is posted, requests are held, the generations in flight
finish, the weights load, and the held requests go out under the new version.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from horizonrl.actors.agent_sessions import AgentRequestError, AgentSession, AgentSessions
from horizonrl.actors.episodes import StepEngine, Tally, step_engine, take_startable
from horizonrl.actors.openai_server import Call, RequestQueue
from horizonrl.actors.rollout import Engine
from horizonrl.envpool.agent_worker import AgentCall, AgentOutcome
from horizonrl.envpool.pool import EnvPool, PendingCall, Slot
from horizonrl.envpool.replicas import EnvError
from horizonrl.protos.trajectory import Failure

_WAIT_S = 0.01  # nothing for the engine: wait up to this long for a request, then check agents


@dataclass(slots=True)
class AgentEpisode:
    """One episode: its session, env label, task seed and (once started) replica and call."""

    index: int
    key: str
    seed: int
    task_id: str
    session: AgentSession
    step: int | None = None
    slot: Slot | None = None
    call: PendingCall | None = None
    outcome: AgentOutcome | None = None
    failure: Failure = Failure.NONE
    error: str = ""


class AgentEpisodes:
    """Runs a rollout's agent episodes to the end; `on_done(episodes)` gets those that ended
    together. `base_url` is where the agents reach the endpoint."""

    def __init__(self, engine: Engine | StepEngine, pools: dict[str, EnvPool],
                 sessions: AgentSessions, requests: RequestQueue, *, base_url: str, model: str,
                 temperature: float, timeout_s: float,
                 on_done: Callable[[list[AgentEpisode]], None],
                 news: Callable[[], bool] | None = None,
                 take_news: Callable[[], None] | None = None,
                 admit: Callable[[int | None], bool] | None = None,
                 closed: Callable[[], bool] | None = None) -> None:
        self.engine = step_engine(engine)
        self.pools, self.sessions, self.requests = pools, sessions, requests
        self.base_url, self.model = base_url, model
        self.temperature, self.timeout_s = temperature, timeout_s
        self.on_done = on_done
        self.news, self.take_news = news, take_news
        self.admit = admit or (lambda step: True)
        self.closed = closed or (lambda: False)
        self.tally = Tally()
        self._waiting: deque[AgentEpisode] = deque()
        self._running: dict[str, AgentEpisode] = {}  # by session key
        self._inflight: dict[str, tuple[AgentEpisode, Call]] = {}  # engine request id ->
        self._held: list[Call] | None = None  # requests held while the engine drains
        self._rid = 0

    def run(self, episodes: Sequence[AgentEpisode]) -> Tally:
        self._waiting.extend(episodes)
        try:
            while self._waiting or self._running:
                self._switch_policy()
                if self.closed():
                    self._waiting.clear()
                self._start_waiting()
                self._serve(self.requests.drain(0.0 if self.engine.busy() else _WAIT_S))
                if self.engine.busy():
                    t0 = time.perf_counter()
                    self._engine_step()
                    self.tally.generate += time.perf_counter() - t0
                self._collect_agents()
        finally:
            self._stop()
        return self.tally

    # -- starting ----------------------------------------------------------------------------
    def _start_waiting(self) -> None:
        for ep in take_startable(self._waiting, self.pools, self.admit, len(self._waiting)):
            self.sessions.open(ep.session)
            self._running[ep.session.key] = ep
            call = AgentCall(ep.seed, ep.task_id, self.base_url, ep.session.key, self.model,
                             ep.session.horizon)
            ep.call = self.pools[ep.key].submit("agent", [ep.slot], [(ep.slot.replica, call)],
                                                self.timeout_s)
        self.tally.peak_in_flight = max(self.tally.peak_in_flight, len(self._running))

    # -- requests and the engine -------------------------------------------------------------
    def _serve(self, calls: list[Call]) -> None:
        for call in calls:
            if self._held is not None:
                self._held.append(call)
                continue
            ep = self._running.get(call.key)
            if ep is None:
                call.reply.set_exception(AgentRequestError(
                    401, "invalid_api_key", "the episode of this key has finished"))
                continue
            try:
                prompt, budget = ep.session.prompt(call.body)
            except AgentRequestError as exc:
                call.reply.set_exception(exc)
                continue
            except Exception as exc:  # one odd request must not stop every episode's rollout
                call.reply.set_exception(AgentRequestError(
                    400, "invalid_request", f"the request could not be read: {exc!r}"))
                continue
            rid = f"agent{ep.index}-r{self._rid}"
            self._rid += 1
            self._inflight[rid] = (ep, call)
            self.tally.prompt_tokens += len(prompt)
            self.engine.submit(rid, prompt, max_tokens=budget, temperature=self.temperature)

    def _engine_step(self) -> None:
        for rid, completion in self.engine.step():
            ep, call = self._inflight.pop(rid)
            self.tally.generated_tokens += len(completion.token_ids)
            self.tally.cached_tokens += completion.cached_tokens
            call.reply.set_result(ep.session.complete(completion))

    def _switch_policy(self) -> None:
        if self.news is None:
            return
        if self._held is None and self.news():
            self._held = []
        if self._held is not None and not self._inflight:
            held, self._held = self._held, None
            self.take_news()
            self._serve(held)

    # -- agents ending -----------------------------------------------------------------------
    def _collect_agents(self) -> None:
        by_pool: dict[str, list[AgentEpisode]] = {}
        for ep in self._running.values():
            by_pool.setdefault(ep.key, []).append(ep)
        finished: list[AgentEpisode] = []
        for key, eps in by_pool.items():
            pool = self.pools[key]
            for ep, ready in zip(eps, pool.ready([ep.call for ep in eps])):
                if not ready:
                    continue
                (result,) = pool.collect(ep.call)
                if isinstance(result, EnvError):
                    ep.failure, ep.error = Failure(result.kind), result.message
                else:
                    ep.outcome = result
                    self.tally.env_steps += result.env_steps
                finished.append(ep)
        if finished:
            for ep in finished:
                self._end(ep)
            self.on_done(finished)

    def _end(self, ep: AgentEpisode) -> None:
        """Close the episode's session and hand back its replica; a request of it still in
        the engine (the agent stopped waiting) is dropped."""
        del self._running[ep.session.key]
        self.sessions.close(ep.session.key)
        self.pools[ep.key].release([ep.slot])
        stale = [rid for rid, (e, _) in self._inflight.items() if e is ep]
        if stale:
            self.engine.abort(stale)
        for rid in stale:
            _, call = self._inflight.pop(rid)
            ep.session.drop_pending()
            call.reply.set_exception(AgentRequestError(409, "episode_finished",
                                                       "the episode finished first"))

    def _stop(self) -> None:
        """An error stopped the run: nothing left queued, lent out or waiting for a reply."""
        if self._inflight:
            self.engine.abort(list(self._inflight))
        gone = AgentRequestError(503, "rollout_stopped", "the rollout stopped")
        for _, call in self._inflight.values():
            call.reply.set_exception(gone)
        for call in (self._held or []) + self.requests.drain():
            if not call.reply.done():
                call.reply.set_exception(gone)
        for ep in self._running.values():
            self.sessions.close(ep.session.key)
            self.pools[ep.key].release([ep.slot])
        self._inflight.clear()


def episode_info(ep: AgentEpisode) -> dict[str, Any]:
    """What the trajectory's info records of how the agent ended."""
    return {"agent_error": ep.error} if ep.error else {}
