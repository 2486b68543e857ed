"""Pieces of one training iteration that need no actors: the run directory, task sampling,
rollout and per-env metrics, collecting exactly the trajectories a rollout produced.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from horizonrl.actors.curriculum import env_weights_at
from horizonrl.actors.generator import Task
from horizonrl.cluster.config import RunConfig, dump_config
from horizonrl.cluster.ops.prometheus import repeated_action_rate
from horizonrl.envpool.base import EVAL_SEED_OFFSET
from horizonrl.learner.config import IngestConfig, LearnerConfig
from horizonrl.learner.ingest import TrajectoryIngest
from horizonrl.protos.placement import is_wildcard
from horizonrl.protos.reports import RolloutReport, all_ids
from horizonrl.protos.trajectory import Failure, Trajectory


@dataclass
class Gathered:
    """What one iteration's data phase produced, for training, metrics and the ledger."""

    outs: list[RolloutReport]  # the generators' rollout reports
    trajs: list[Trajectory]  # to train on
    orphans: list[str] = field(default_factory=list)  # delivered by generators that died
    dropped: dict[str, list[str]] = field(default_factory=dict)  # reason -> ids not trained
    metrics: dict[str, Any] = field(default_factory=dict)
    # Streaming (async with partial rollouts): the ids that reached the buffer this phase,
    # whichever rollout sent them; None: the ids of the reports in `outs`.
    arrived: list[str] | None = None

    @property
    def generated(self) -> list[str]:
        """The ids generated in this phase: those that arrived, or the reports' ids."""
        return all_ids(self.outs) if self.arrived is None else self.arrived


def make_run_dir(cfg: RunConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(cfg.run_root) / f"{cfg.name}__{cfg.seed}__{stamp}"
    run_dir.mkdir(parents=True, exist_ok=False)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    return run_dir


def sample_tasks(cfg: RunConfig, step: int, sampling_round: int = 0) -> list[Task]:
    """Training tasks for `step`: train-split seeds, each task's env drawn by the env weights;
    reproducible from (seed, step, round). Rounds after the first (dynamic sampling) draw fresh
    tasks whose group ids carry the round."""
    rng = np.random.default_rng([cfg.seed, step] + ([2, sampling_round] if sampling_round else []))
    seeds = rng.integers(0, EVAL_SEED_OFFSET, size=cfg.generator.tasks_per_step)
    envs = cfg.envs
    if len(envs) == 1:
        picks = np.zeros(len(seeds), dtype=int)
    else:
        # A task-difficulty schedule (curriculum.env_weights) overrides env.weight by stage.
        stage_w = env_weights_at(cfg.curriculum, step)
        w = np.array([stage_w.get(e.key, e.weight) for e in envs], dtype=float)
        pick_rng = np.random.default_rng([cfg.seed, step, 1])
        picks = pick_rng.choice(len(envs), len(seeds), p=w / w.sum())
    tasks = [Task(task_id=f"{envs[k].key}-{int(s)}", seed=int(s), env=envs[k].key)
             for s, k in zip(seeds, picks)]
    if sampling_round:
        tasks = [replace(t, group=f"s{step}r{sampling_round}-{t.task_id}") for t in tasks]
    return tasks


def rollout_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    ok = [t for t in trajs if t.failure is Failure.NONE]
    turns = sum(t.num_turns for t in ok)
    n = max(len(ok), 1)
    return {
        # The env's reward: learner.overlong=penalty lowers `reward` for training only.
        "reward_mean": sum(t.info.get("env_reward", t.reward) for t in ok) / n,
        "success_rate": sum(bool(t.info.get("success", False)) for t in ok) / n,
        "turns_mean": turns / n,
        "invalid_action_rate": sum(t.info.get("invalid_actions", 0) for t in ok) / max(turns, 1),
        "truncated_rate": sum(t.truncated for t in ok) / n,
        # Episodes that ran out of turns: what the adaptive curriculum watches.
        "truncated_at_horizon_rate": sum(t.truncated and t.num_turns >= t.horizon
                                         for t in ok) / n,
        # Episodes the context limit ended (full mode; in window mode only a turn too big for
        # any window): the horizon the curriculum asks for is capped by these.
        "cut_by_context_rate": sum(t.cut == "context" for t in ok) / n,
        "rows_per_episode": sum(t.rows for t in ok) / n,
        "repeated_action_rate": repeated_action_rate(ok),
        # Outside agents (agent.callable): episodes whose agent edited its history, so some
        # turns were re-tokenised and train as rows of their own (actors/agent_sessions.py).
        "edited_history_rate": sum(bool(t.info.get("edited_history")) for t in ok) / n,
        "failed_episodes": float(len(trajs) - len(ok)),
        "max_turns": float(max((t.num_turns for t in trajs), default=0)),
    }


def env_metrics(cfg: RunConfig, trajs: Sequence[Trajectory],
                outs: Sequence[RolloutReport]) -> dict[str, dict[str, float]]:
    """Per env label: pool counters summed over generators, and (in multi-env runs) the rollout
    metrics of that env's episodes."""
    out: dict[str, dict[str, float]] = {}
    for e in cfg.envs:
        stats = [o.env_stats[e.key] for o in outs if e.key in o.env_stats]
        pool = {k: float(sum(st[k] for st in stats)) for k in stats[0]} if stats else {}
        if pool:
            pool["call_latency_mean_s"] = pool["call_seconds"] / max(pool["calls"], 1.0)
        out[e.key] = {f"pool_{k}": v for k, v in pool.items()}
        if len(cfg.envs) > 1:
            mine = [t for t in trajs if t.env_name == e.key]
            out[e.key].update(rollout_metrics(mine))
            out[e.key]["horizon"] = float(max((t.horizon for t in mine), default=0))
    return out


def resolved_learner(cfg: RunConfig) -> LearnerConfig:
    """The learner config with mode-dependent defaults filled in (the decoupled loss is on in
    async mode unless set explicitly)."""
    if cfg.learner.decoupled_loss is None:
        return cfg.learner.model_copy(update={"decoupled_loss": cfg.mode == "async"})
    return cfg.learner


def collect_trajectories(ingest: TrajectoryIngest, ids: list[str], timeout_s: float,
                         strays: list[Trajectory] | None = None,
                         keep_strays: bool = False) -> tuple[list[Trajectory], list[str]]:
    """Exactly the trajectories with `ids`, in that order, and the ids of the others that
    arrived meanwhile (from a generator that died mid-step: not trained on). `strays` holds
    trajectories an earlier call took that were not its own: those with `ids` come from
    there first (and leave it); with `keep_strays` what arrives unasked goes there instead of
    being orphaned (an eval while async rollouts are in flight keeps their trajectories)."""
    want, got, orphans = set(ids), {}, []
    if strays:
        got = {t.trajectory_id: t for t in strays if t.trajectory_id in want}
        strays[:] = [t for t in strays if t.trajectory_id not in got]
    deadline = time.monotonic() + timeout_s
    while len(got) < len(want) and time.monotonic() < deadline:
        for t in ingest.take(len(want) - len(got), timeout=max(0.1, deadline - time.monotonic())):
            if t.trajectory_id in want:
                got[t.trajectory_id] = t
            elif keep_strays and strays is not None:
                strays.append(t)
            else:
                orphans.append(t.trajectory_id)
    if len(got) != len(want):
        raise RuntimeError(f"generators sent {len(want)} trajectories, the ingest delivered "
                           f"{len(got)} of them within {timeout_s}s")
    return [got[i] for i in ids], orphans


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out


def dead_actors(actors: Sequence[Any], timeout_s: float) -> list[int]:
    """Indices of the actors (with a `ready()` method) whose process is gone; each live one
    gets `timeout_s` to answer (a busy actor answers when its current call ends)."""
    import ray

    refs = [a.ready.remote() for a in actors]
    ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    dead = []
    for i, ref in enumerate(refs):
        try:
            ray.get(ref, timeout=0)
        except ray.exceptions.RayActorError:
            dead.append(i)
        except ray.exceptions.GetTimeoutError:
            pass  # alive but still busy: not something a restart fixes
    return dead


def split_evenly(items: Sequence[Any], parts: int) -> list[list[Any]]:
    """`items` in `parts` consecutive shares whose sizes differ by at most one (the first
    shares take the remainder): how a step's or an eval's tasks go to the generators."""
    size, extra = divmod(len(items), parts)
    bounds = [k * size + min(k, extra) for k in range(parts + 1)]
    return [list(items[a:b]) for a, b in pairwise(bounds)]


def open_ingest(cfg: IngestConfig) -> tuple[TrajectoryIngest, str, str | None]:
    """A trajectory ingest started as `learner.ingest` says, for training and evaluation alike:
    (the ingest, the address generators dial, the token they send). Bound to every interface,
    it advertises this node's IP, which generators on other nodes can reach."""
    import ray

    token = os.environ.get(cfg.auth_token_env) or None
    ingest = TrajectoryIngest.from_config(cfg, auth_token=token).start()
    address = ingest.address
    if is_wildcard(cfg.host):
        address = f"{ray.util.get_node_ip_address()}:{ingest.port}"
    return ingest, address, token
