"""GeneratorActor: a vLLM engine driving many agent loops, streaming to the learner.

Plain class (made remote at the edge by the driver). By default (`generator.loop=lockstep`)
each turn sends every live episode's context to the engine in one batched `generate` call and
the parsed actions to the env pool in one call per env actor. With `generator.loop=independent`
every episode runs as its own loop over the engine's continuous batching (actors/episodes.py).
Either way every episode that finished is pushed to the learner's ingest over gRPC.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil

from horizonrl.actors.agent_rollout import AgentRollout
from horizonrl.actors.config import AgentConfig, GeneratorConfig
from horizonrl.actors.curriculum import HorizonSetting
from horizonrl.actors.episodes import Tally
from horizonrl.actors.heap import trim_heap
from horizonrl.actors.policy_board import PolicyFeed
from horizonrl.actors.rollout import AgentLoop, Engine
from horizonrl.actors.weight_receiver import GeneratorWeightSync
from horizonrl.envpool.pool import EnvPool
from horizonrl.envpool.registry import env_spec
from horizonrl.envpool.replicas import EnvError
from horizonrl.protos.chat import ChatFormat, load_tokenizer
from horizonrl.protos.placement import node_ip
from horizonrl.protos.precision import bf16_native, emulated_bf16, engine_dtype
from horizonrl.protos.reports import RolloutReport
from horizonrl.protos.trajectory import Failure

POLL_S = 0.1  # partial rollouts, independent loop: at most one board query per POLL_S


@dataclass(frozen=True, slots=True)
class Task:
    """One environment task: a GRPO group runs `group_size` episodes of it."""

    task_id: str
    seed: int
    env: str | None = None  # the env label (EnvConfig.key); None: the generator's first env
    group: str | None = None  # the GRPO group id; None: s<step>-<task_id>
    # Async: the training step the task is drawn for; with partial rollouts its episodes
    # start only once the board's frontier reaches it. None: no bound (sync, evaluation).
    step: int | None = None


class GeneratorActor(GeneratorWeightSync):
    """Rollout worker: engine + env pool + gRPC sender. Thin; the logic is in AgentLoop."""

    def __init__(self, *, name: str, cfg: GeneratorConfig, model_path: str,
                 env_pools: Sequence[EnvPool], ingest_address: str, seed: int,
                 policy_version: int = 0, ingest_token: str | None = None,
                 ingest_tls_ca: str | None = None, engine: Engine | None = None,
                 agent: AgentConfig | None = None) -> None:
        from horizonrl.actors.transport import TrajectorySender

        self.name = name
        self.cfg = cfg
        # One pool per env of the run, by label; the first is the default for unlabelled tasks.
        self.pools = {p.cfg.key: p for p in env_pools}
        self.specs = {key: env_spec(p.cfg.name) for key, p in self.pools.items()}
        self.default_env = next(iter(self.pools))
        self.chat = ChatFormat(load_tokenizer(model_path))
        # vLLM runs on the GPUs Ray reserved for this actor, on CPU when it reserved none.
        self.dtype = engine_dtype(cfg.dtype, native_bf16=bf16_native(
            "cuda" if self._gpu_ids() else "cpu"))
        if engine is None:
            from horizonrl.actors.engine import VLLMEngine

            engine = VLLMEngine(model_path, seed=seed, max_model_len=cfg.max_context_tokens,
                                stop_token_ids=[self.chat.im_end_id],
                                kv_cache_gib=cfg.kv_cache_gib, dtype=self.dtype,
                                gpu_memory_utilization=cfg.gpu_memory_utilization,
                                tensor_parallel_size=cfg.tensor_parallel_size,
                                enforce_eager=cfg.enforce_eager,
                                prefix_caching=cfg.prefix_caching)
        self.engine = engine
        self.sender = TrajectorySender(ingest_address, deadline_s=cfg.send_deadline_s,
                                       auth_token=ingest_token, tls_ca_path=ingest_tls_ca)
        self.seed = seed
        self.policy_version = policy_version  # of the weights at model_path
        self.horizon: int | None = None
        self.env_horizons: dict[str, int] = {}
        self.horizon_version = -1
        self._sends: list[Future] = []  # this rollout's pushes in flight
        self._feed: PolicyFeed | None = None  # the rollout's board (partial rollouts)
        self._loads = 0  # weight loads during the rollout
        self._weights_dir = tempfile.mkdtemp(prefix=f"horizonrl-{name}-weights-")
        for pool in self.pools.values():
            pool.wait_ready()
        # Outside agents (agent.callable): they play through this generator's endpoint.
        self.agents = None if agent is None else AgentRollout(agent, self)

    # -- control -----------------------------------------------------------------------------
    def ready(self) -> bool:
        return True

    def placement(self) -> dict[str, Any]:
        """Where this generator and its env actors run (node IPs), for the run's placement.json."""
        return {"generator": node_ip(),
                "env_actors": [ip for p in self.pools.values() for ip in p.node_ips()]}

    def health(self) -> dict[str, Any]:
        return {"name": self.name, "pid": os.getpid(), "policy_version": self.policy_version,
                "horizon": self.horizon, "env_restarts": self.env_restarts()}

    def assigned_gpu(self) -> tuple[list[str], str | None]:
        """The GPU ids Ray reserved for this actor and the CUDA_VISIBLE_DEVICES Ray set from
        them: vLLM builds its engine on the first visible device, which is then the assigned
        one (a check for device placement; [] and whatever the process had on CPU runs)."""
        return self._gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES")

    def precision(self) -> str:
        """The engine's dtype (`generator.dtype` with `auto` resolved on this actor's device)."""
        return self.dtype

    def emulated_bf16(self) -> str | None:
        """This actor's device, where its engine runs bf16 without native support (else None)."""
        return emulated_bf16(self.dtype, "cuda" if self._gpu_ids() else "cpu")

    @staticmethod
    def _gpu_ids() -> list[str]:
        import ray

        return [str(i) for i in ray.get_gpu_ids()] if ray.is_initialized() else []

    def env_restarts(self) -> int:
        return sum(p.restarts for p in self.pools.values())

    def env_stats(self) -> dict[str, dict[str, float]]:
        """Pool counters per env label (steps, latency, restarts, errors)."""
        return {key: p.stats() for key, p in self.pools.items()}

    def set_horizon(self, horizon: int, version: int,
                    env_horizons: dict[str, int] | None = None) -> None:
        """Applies from the next episode on; a stale broadcast (older version) is ignored.
        `env_horizons` gives env labels a horizon of their own."""
        if version >= self.horizon_version:
            self.horizon, self.horizon_version = int(horizon), int(version)
            self.env_horizons = {k: int(v) for k, v in (env_horizons or {}).items()}

    def get_policy_version(self) -> int:
        return self.policy_version

    def update_weights(self, state: dict[str, np.ndarray], version: int) -> float:
        """Load a full HF state dict (lm_head included even when tied); returns seconds."""
        from safetensors.numpy import save_file

        t0 = time.perf_counter()
        save_file(state, os.path.join(self._weights_dir, "model.safetensors"))
        self.engine.load_weights(self._weights_dir)
        self.policy_version = int(version)
        return time.perf_counter() - t0

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """The engine's logprob of every token of each sequence (for sync checks)."""
        return self.engine.score(sequences)

    # -- rollout -----------------------------------------------------------------------------
    def rollout(self, tasks: Sequence[Task], *, group_size: int, step: int,
                horizon: int | None = None, setting: HorizonSetting | None = None,
                board: Any | None = None) -> RolloutReport:
        """Run `group_size` episodes of each task to the end; push each as it finishes.
        `setting` is the curriculum's horizon in force when the call was made; it is kept for
        later calls (a stale one is ignored, as by `set_horizon`). `horizon` overrides the
        curriculum's (every env's) for this call only (evaluation sweeps). With a `board`
        (actors/policy_board.py; partial rollouts) the episodes in flight take each newer
        policy version and horizon posted there at their next turn."""
        if setting is not None:
            self.set_horizon(setting.horizon, setting.version, setting.env_horizons)
        per_env = {} if horizon else self.env_horizons
        horizon = horizon or self.horizon
        if horizon is None:
            raise RuntimeError(f"{self.name}: no horizon yet; register with the curriculum first")
        version = self.policy_version
        for pool in self.pools.values():  # replace env actors that died since the last rollout
            pool.heal()
        tally = Tally()
        sent: list[str] = []
        self._sends = []
        self._feed = None if board is None else PolicyFeed(
            board, version=self.policy_version, horizon_version=self.horizon_version,
            poll_s=0.0 if self.cfg.loop == "lockstep" and self.agents is None else POLL_S)
        self._loads = 0
        try:
            if self.agents is not None:
                sent = self.agents.run(tasks, group_size, step, per_env, horizon, tally)
            elif self.cfg.loop == "independent":
                sent = self._independent(tasks, group_size, step, version, per_env, horizon,
                                         tally)
            else:
                for wave in self._waves(tasks, group_size):
                    if not self._admitted(wave):
                        break  # the run is ending: later waves never start
                    sent += self._wave(wave, group_size, step, version, per_env, horizon,
                                       tally)
            t0 = time.perf_counter()
            for f in self._sends:  # pipelined pushes: a failed one fails the rollout
                f.result()
            tally.transport += time.perf_counter() - t0
        finally:
            self._feed = None
            if self.cfg.trim_heap:  # fragmentation, not a leak: see actors/heap.py
                trim_heap()
        return RolloutReport(
            trajectory_ids=tuple(sent), policy_version=version, horizon=horizon,
            end_policy_version=self.policy_version, weight_loads=self._loads,
            seconds=tally.seconds(), env_restarts=self.env_restarts(),
            env_stats=self.env_stats(), rss_bytes=psutil.Process().memory_info().rss,
            **tally.counts())

    def _waves(self, tasks: Sequence[Task], group_size: int) -> list[list[Task]]:
        """Tasks in consecutive waves whose episodes fit each env's replicas (a run's draw of
        tasks by env weight can give one env more groups than its pool holds); one wave when
        everything fits, so the usual rollout is one lock-step loop."""
        waves: list[list[Task]] = []
        used: list[dict[str, int]] = []
        for task in tasks:
            key = task.env or self.default_env
            cap = self.pools[key].capacity
            if group_size > cap:
                raise ValueError(f"{self.name}: a group of {group_size} episodes needs that many "
                                 f"{key} replicas, the pool has {cap}; raise "
                                 "env.replicas_per_actor or env.num_actors")
            k = next((i for i, n in enumerate(used) if n.get(key, 0) + group_size <= cap), None)
            if k is None:  # no wave has room for this group: open one
                waves.append([])
                used.append({})
                k = len(waves) - 1
            waves[k].append(task)
            used[k][key] = used[k].get(key, 0) + group_size
        return waves

    def _admitted(self, wave: Sequence[Task]) -> bool:
        """Partial rollouts, lock-step: wait until the board's frontier reaches the wave's
        last step (taking the weights posted meanwhile); False once the run is closing."""
        steps = [task.step for task in wave if task.step is not None]
        if self._feed is None or not steps:
            return True
        while True:
            if self._feed.pending():
                self._take_news([], [])
            if self._feed.closed:
                return False
            if self._feed.admits(max(steps)):
                return True
            time.sleep(POLL_S)

    def _wave(self, tasks: Sequence[Task], group_size: int, step: int, version: int,
              per_env: dict[str, int], horizon: int, tally: Tally) -> list[str]:
        """One lock-step rollout of `tasks`, every episode holding a replica; returns the ids
        pushed."""
        meta = [(task, k) for task in tasks for k in range(group_size)]
        loops = [self._new_loop(task, per_env, horizon) for task, _ in meta]
        envs = [task.env or self.default_env for task, _ in meta]
        slots: list[Any] = [None] * len(loops)
        sent: list[str] = []
        try:
            for key, idx in _by_env(envs, range(len(loops))).items():
                for i, slot in zip(idx, self.pools[key].acquire(len(idx))):
                    slots[i] = slot
            t0 = time.perf_counter()
            firsts = self._pool_call("reset", envs, slots, range(len(loops)),
                                     [task.seed for task, _ in meta])
            tally.env += time.perf_counter() - t0
            for loop, first in zip(loops, firsts):
                if isinstance(first, EnvError):
                    loop.fail(Failure(first.kind))
                else:
                    loop.start(*first)
            # Episodes whose reset failed are done already: account for them now.
            sent += self._push(loops, meta, range(len(loops)), step, version, tally)
            turn = 0
            # Bounded by the longest horizon, which partial rollouts may raise mid-way.
            while any(not loop.done for loop in loops) and turn < max(
                    loop.horizon for loop in loops):
                live = [i for i in range(len(loops)) if not loops[i].done]
                if self._feed is not None and self._feed.pending():
                    self._take_news([loops[i] for i in live], [envs[i] for i in live])
                self._turn(loops, envs, slots, live, tally)
                sent += self._push(loops, meta, live, step, version, tally)
                turn += 1
        finally:
            for key, idx in _by_env(envs, range(len(loops))).items():
                self.pools[key].release([slots[i] for i in idx if slots[i] is not None])
        return sent

    def _new_loop(self, task: Task, per_env: dict[str, int], horizon: int) -> AgentLoop:
        key = task.env or self.default_env
        spec = self.specs[key]
        loop = AgentLoop(chat=self.chat, system_prompt=spec.system_prompt,
                         parse_action=spec.parse_action, horizon=per_env.get(key, horizon),
                         max_context_tokens=self.cfg.max_context_tokens,
                         max_tokens_per_turn=self.cfg.max_tokens_per_turn,
                         keep_turns=self.cfg.context.keep_turns
                         if self.cfg.context.mode == "window" else None)
        loop.new_policy(self.policy_version)
        return loop

    def _take_news(self, loops: Sequence[AgentLoop], envs: Sequence[str]) -> None:
        """Partial rollouts, between turns (no generation in flight): load the newer weights
        and horizon the board posted; the unfinished `loops` take them from their next turn."""
        version, state, setting = self._feed.take()
        if state is not None and version > self.policy_version:
            self.update_weights(state, version)
            self._loads += 1
        if setting is not None:
            self.set_horizon(setting.horizon, setting.version, setting.env_horizons)
        for loop, key in zip(loops, envs):
            loop.new_policy(self.policy_version, None if setting is None
                            else self.env_horizons.get(key, self.horizon))

    def _independent(self, tasks: Sequence[Task], group_size: int, step: int, version: int,
                     per_env: dict[str, int], horizon: int, tally: Tally) -> list[str]:
        """Every episode as its own loop (actors/episodes.py); each pushed as it finishes."""
        from horizonrl.actors.episodes import Episode, IndependentEpisodes

        meta = [(task, k) for task in tasks for k in range(group_size)]
        episodes = [Episode(i, task.env or self.default_env, task.seed,
                            self._new_loop(task, per_env, horizon), step=task.step)
                    for i, (task, _) in enumerate(meta)]
        loops = [ep.loop for ep in episodes]
        sent: list[str] = []
        feed = self._feed
        runner = IndependentEpisodes(
            self.engine, self.pools, max_tokens=self.cfg.max_tokens_per_turn,
            temperature=self.cfg.temperature,
            max_in_flight=self.cfg.max_episodes_in_flight or max(len(episodes), 1),
            on_done=lambda eps: sent.extend(self._push(
                loops, meta, [ep.index for ep in eps], step, version, tally)),
            news=None if feed is None else feed.pending,
            admit=None if feed is None else feed.admits,
            closed=None if feed is None else (lambda: feed.closed),
            take_news=lambda: self._take_news(
                [ep.loop for ep in episodes if not ep.loop.done],
                [ep.key for ep in episodes if not ep.loop.done]))
        tally.add(runner.run(episodes))
        return sent

    def _pool_call(self, method: str, envs: list[str], slots: list, idx: Sequence[int],
                   args: Sequence[Any]) -> list[Any]:
        """`pool.<method>(slots, args)` for episodes `idx`, one call per env; results in order."""
        out: list[Any] = [None] * len(idx)
        pos = {i: n for n, i in enumerate(idx)}
        for key, sub in _by_env(envs, idx).items():
            got = getattr(self.pools[key], method)([slots[i] for i in sub],
                                                   [args[pos[i]] for i in sub])
            for i, r in zip(sub, got):
                out[pos[i]] = r
        return out

    def _turn(self, loops: list[AgentLoop], envs: list[str], slots: list, live: list[int],
              tally: Tally) -> None:
        """One lock-step turn for the live episodes: batched generate, then batched env step."""
        t0 = time.perf_counter()
        prompts = [loops[i].context_ids for i in live]
        completions = self.engine.generate(prompts, max_tokens=self.cfg.max_tokens_per_turn,
                                           temperature=self.cfg.temperature)
        tally.prompt_tokens += sum(map(len, prompts))
        tally.cached_tokens += sum(c.cached_tokens for c in completions)
        actions = [loops[i].add_model_turn(c) for i, c in zip(live, completions)]
        tally.generated_tokens += sum(len(c.token_ids) for c in completions)
        t1 = time.perf_counter()
        results = self._pool_call("step", envs, slots, live, actions)
        tally.generate += t1 - t0
        tally.env += time.perf_counter() - t1
        tally.env_steps += len(live)
        for i, res in zip(live, results):
            if isinstance(res, EnvError):
                loops[i].fail(Failure(res.kind))
            else:
                loops[i].add_env_result(res)

    def _push(self, loops: list[AgentLoop], meta: list, candidates: Sequence[int], step: int,
              version: int, tally: Tally) -> list[str]:
        """Send the episodes among `candidates` that are done; return their ids."""
        done = [i for i in candidates if loops[i].done]
        if not done:
            return []
        trajs = []
        for i in done:
            task, k = meta[i]
            trajs.append(loops[i].to_trajectory(
                trajectory_id=f"{self.name}-s{step}-{task.task_id}-{k}-{uuid.uuid4().hex[:8]}",
                group_id=task.group or f"s{step}-{task.task_id}", task_id=task.task_id,
                env_name=task.env or self.default_env, policy_version=version,
                info={"generator": self.name, "seed": task.seed}))
        t0 = time.perf_counter()
        self._sends.append(self.sender.send_async(trajs))  # rollout() waits for them
        tally.transport += time.perf_counter() - t0
        return [t.trajectory_id for t in trajs]


def _by_env(envs: Sequence[str], idx: Sequence[int]) -> dict[str, list[int]]:
    """Episode indices grouped by env label, in order."""
    out: dict[str, list[int]] = {}
    for i in idx:
        out.setdefault(envs[i], []).append(i)
    return out
