"""GeneratorActor: a vLLM engine driving many agent loops in lock-step, streaming to the learner.

Plain class (made remote at the edge by the driver). Each turn, every live episode's context goes
to the engine in one batched `generate` call, the parsed actions go to the env pool in one call
per env actor, and every episode that finished is pushed to the learner's ingest over gRPC.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from actors.chat import ChatFormat, load_tokenizer
from actors.config import GeneratorConfig
from actors.rollout import AgentLoop, Engine
from envpool.pool import EnvError, EnvPool
from envpool.registry import env_spec
from protos.trajectory import Failure


@dataclass(frozen=True, slots=True)
class Task:
    """One environment task: a GRPO group runs `group_size` episodes of it."""

    task_id: str
    seed: int


class GeneratorActor:
    """Rollout worker: engine + env pool + gRPC sender. Thin; the logic is in AgentLoop."""

    def __init__(self, *, name: str, cfg: GeneratorConfig, model_path: str, env_pool: EnvPool,
                 ingest_address: str, seed: int, policy_version: int = 0,
                 ingest_token: str | None = None, engine: Engine | None = None) -> None:
        
        from actors.transport import TrajectorySender

        self.name = name
        self.cfg = cfg
        self.pool = env_pool
        self.spec = env_spec(env_pool.cfg.name)
        self.chat = ChatFormat(load_tokenizer(model_path))
        if engine is None:
            from actors.engine import VLLMEngine

            engine = VLLMEngine(model_path, seed=seed, max_model_len=cfg.max_context_tokens,
                                stop_token_ids=[self.chat.im_end_id],
                                kv_cache_gib=cfg.kv_cache_gib, dtype=cfg.dtype)
        self.engine = engine
        self.sender = TrajectorySender(ingest_address, deadline_s=cfg.send_deadline_s,
                                       auth_token=ingest_token)
        self.seed = seed
        self.policy_version = policy_version  # of the weights at model_path
        self.horizon: int | None = None
        self.horizon_version = -1
        self._weights_dir = tempfile.mkdtemp(prefix=f"horizonrl-{name}-weights-")
        self.pool.wait_ready()

    # -- control -----------------------------------------------------------------------------
    def ready(self) -> bool:
        return True

    def health(self) -> dict[str, Any]:
        return {"name": self.name, "pid": os.getpid(), "policy_version": self.policy_version,
                "horizon": self.horizon, "env_restarts": self.pool.restarts}

    def set_horizon(self, horizon: int, version: int) -> None:
        """Applies from the next episode on; a stale broadcast (older version) is ignored."""
        if version >= self.horizon_version:
            self.horizon, self.horizon_version = int(horizon), int(version)

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
    def rollout(self, tasks: Sequence[Task], *, group_size: int, step: int) -> dict[str, Any]:
        """Run `group_size` episodes of each task to the end; push each as it finishes."""
        if self.horizon is None:
            raise RuntimeError(f"{self.name}: no horizon yet; register with the curriculum first")
        horizon, version = self.horizon, self.policy_version
        loops, meta = [], []
        for task in tasks:
            for k in range(group_size):
                loops.append(AgentLoop(
                    chat=self.chat, system_prompt=self.spec.system_prompt,
                    parse_action=self.spec.parse_action, horizon=horizon,
                    max_context_tokens=self.cfg.max_context_tokens,
                    max_tokens_per_turn=self.cfg.max_tokens_per_turn))
                meta.append((task, k))
        slots = self.pool.acquire(len(loops))
        timing = {"generate": 0.0, "env": 0.0, "transport": 0.0}
        counts = {"generated_tokens": 0, "env_steps": 0}
        sent: list[str] = []
        try:
            t0 = time.perf_counter()
            firsts = self.pool.reset(slots, [task.seed for task, _ in meta])
            timing["env"] += time.perf_counter() - t0
            for loop, first in zip(loops, firsts):
                if isinstance(first, EnvError):
                    loop.fail(Failure(first.kind))
                else:
                    loop.start(first[0])
            # Episodes whose reset failed are done already: account for them now.
            sent += self._push(loops, meta, range(len(loops)), step, version, timing)
            turn = 0
            while any(not loops[i].done for i in range(len(loops))) and turn < horizon:
                live = [i for i in range(len(loops)) if not loops[i].done]
                self._turn(loops, slots, live, step, turn, timing, counts)
                sent += self._push(loops, meta, live, step, version, timing)
                turn += 1
        finally:
            self.pool.release(slots)
        return {"trajectory_ids": sent, "policy_version": version, "horizon": horizon,
                "seconds": timing, "env_restarts": self.pool.restarts, **counts}

    def _turn(self, loops: list[AgentLoop], slots: list, live: list[int], step: int, turn: int,
              timing: dict[str, float], counts: dict[str, int]) -> None:
        """One lock-step turn for the live episodes: batched generate, then batched env step."""
        t0 = time.perf_counter()
        completions = self.engine.generate(
            [loops[i].context_ids for i in live], max_tokens=self.cfg.max_tokens_per_turn,
            temperature=self.cfg.temperature)
        actions = [loops[i].add_model_turn(c) for i, c in zip(live, completions)]
        counts["generated_tokens"] += sum(len(c.token_ids) for c in completions)
        t1 = time.perf_counter()
        results = self.pool.step([slots[i] for i in live], actions)
        timing["generate"] += t1 - t0
        timing["env"] += time.perf_counter() - t1
        counts["env_steps"] += len(live)
        for i, res in zip(live, results):
            if isinstance(res, EnvError):
                loops[i].fail(Failure(res.kind))
            else:
                loops[i].add_env_result(res)

    def _push(self, loops: list[AgentLoop], meta: list, candidates: Sequence[int], step: int,
              version: int, timing: dict[str, float]) -> list[str]:
        """Send the episodes among `candidates` that are done; return their ids."""
        done = [i for i in candidates if loops[i].done]
        if not done:
            return []
        trajs = []
        for i in done:
            task, k = meta[i]
            trajs.append(loops[i].to_trajectory(
                trajectory_id=f"{self.name}-s{step}-{task.task_id}-{k}-{uuid.uuid4().hex[:8]}",
                group_id=f"s{step}-{task.task_id}", task_id=task.task_id,
                env_name=self.spec.name, policy_version=version,
                info={"generator": self.name, "seed": task.seed}))
        t0 = time.perf_counter()
        self.sender.send(trajs)
        timing["transport"] += time.perf_counter() - t0
        return [t.trajectory_id for t in trajs]
