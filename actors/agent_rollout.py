"""A generator's side of outside agents: its endpoint, and a rollout of their episodes.

`AgentRollout` belongs to one `GeneratorActor` (agent.callable set): it starts the endpoint over
the generator's engine at construction and runs each rollout's episodes with `AgentEpisodes`,
pushing every finished one the way the generator pushes its own (gRPC, ledger, async).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from horizonrl.actors.agent_episodes import AgentEpisode, AgentEpisodes, episode_info
from horizonrl.actors.agent_sessions import AgentSession, AgentSessions
from horizonrl.actors.config import AgentConfig
from horizonrl.actors.episodes import Tally
from horizonrl.actors.openai_server import AgentEndpoint, RequestQueue
from horizonrl.actors.tool_calls import tool_parser
from horizonrl.protos.messages import Renderer
from horizonrl.protos.placement import is_wildcard, node_ip

if TYPE_CHECKING:
    from horizonrl.actors.generator import GeneratorActor, Task


class AgentRollout:
    """The endpoint and the agent episodes of one generator."""

    def __init__(self, cfg: AgentConfig, gen: GeneratorActor) -> None:
        self.cfg, self.gen = cfg, gen
        self.renderer = Renderer(gen.chat.tokenizer)
        self.parser = tool_parser(cfg.tool_parser)
        self.sessions, self.requests = AgentSessions(), RequestQueue()
        self.endpoint = AgentEndpoint(
            self.sessions, self.requests, host=cfg.host, port=cfg.port,
            model=cfg.served_model_name, max_request_bytes=cfg.max_request_bytes,
            request_timeout_s=cfg.request_timeout_s)
        # Bound to every interface: agents on other nodes reach it at this node's IP.
        self.base_url = self.endpoint.base_url(node_ip() if is_wildcard(cfg.host) else None)

    def run(self, tasks: Sequence[Task], group_size: int, step: int,
            per_env: dict[str, int], horizon: int, tally: Tally) -> list[str]:
        """Every episode of `tasks` (group_size each) played by the user's agent; returns the
        ids pushed."""
        gen = self.gen
        tasks_of = [task for task in tasks for _ in range(group_size)]
        keys = [task.env or gen.default_env for task in tasks_of]
        episodes = [AgentEpisode(i, key, task.seed, task.task_id,
                                 self._session(per_env.get(key, horizon)), step=task.step)
                    for i, (task, key) in enumerate(zip(tasks_of, keys))]
        sent: list[str] = []
        feed = gen._feed
        runner = AgentEpisodes(
            gen.engine, gen.pools, self.sessions, self.requests, base_url=self.base_url,
            model=self.cfg.served_model_name, temperature=gen.cfg.temperature,
            timeout_s=self.cfg.episode_timeout_s,
            on_done=lambda eps: sent.extend(self._push(eps, tasks_of, group_size, step, tally)),
            news=None if feed is None else feed.pending,
            admit=None if feed is None else feed.admits,
            closed=None if feed is None else (lambda: feed.closed),
            take_news=lambda: self._take_news(episodes))
        tally.add(runner.run(episodes))
        return sent

    def _session(self, horizon: int) -> AgentSession:
        g = self.gen
        return AgentSession(renderer=self.renderer, parser=self.parser, horizon=horizon,
                            max_context_tokens=g.cfg.max_context_tokens,
                            max_tokens=g.cfg.max_tokens_per_turn, version=g.policy_version,
                            end_id=g.chat.im_end_id, model=self.cfg.served_model_name)

    def _take_news(self, episodes: Sequence[AgentEpisode]) -> None:
        """Partial rollouts: the newer weights (and horizon) for the turns still to come."""
        gen = self.gen
        gen._take_news([], [])
        for ep in episodes:
            ep.session.version = gen.policy_version
            h = gen.env_horizons.get(ep.key, gen.horizon)
            if h is not None:
                ep.session.horizon = max(int(h), len(ep.session.turns) + 1)

    def _push(self, eps: Sequence[AgentEpisode], tasks_of: Sequence[Task], group_size: int,
              step: int, tally: Tally) -> list[str]:
        gen = self.gen
        trajs = []
        for ep in eps:
            task = tasks_of[ep.index]
            k = ep.index % group_size
            trajs.append(ep.session.trajectory(
                ep.outcome, ep.failure,
                trajectory_id=f"{gen.name}-s{step}-{task.task_id}-{k}-{uuid.uuid4().hex[:8]}",
                group_id=task.group or f"s{step}-{task.task_id}", task_id=task.task_id,
                env_name=ep.key, info={"generator": gen.name, "seed": task.seed,
                                       **episode_info(ep)}))
        t0 = time.perf_counter()
        gen._sends.append(gen.sender.send_async(trajs))  # rollout() waits for them
        tally.transport += time.perf_counter() - t0
        return [t.trajectory_id for t in trajs]
