"""`horizonrl eval` and periodic evaluation: eval-split tasks through the same generator actors
and env pools as training, turned into per-episode records and a report.

Deterministic: the tasks are the first `tasks` seeds of each env's eval split (or of the
`train-new` split: training tasks in instances training never drew), and each model's
generator uses the run seed, so the same command gives the same numbers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from horizonrl.actors.generator import GeneratorActor, Task
from horizonrl.cluster.config import RunConfig
from horizonrl.cluster.eval.metrics import EpisodeRecord
from horizonrl.cluster.ops.checkpoints import STATE_FILE, latest_checkpoint
from horizonrl.envpool.base import split_seeds
from horizonrl.envpool.config import EnvConfig
from horizonrl.envpool.pool import EnvPool
from horizonrl.protos.reports import all_ids
from horizonrl.protos.trajectory import Trajectory


def eval_tasks(envs: Sequence[EnvConfig], tasks: int, tag: str,
               split: str = "eval") -> list[Task]:
    """The first `tasks` seeds of `split` (envpool.base.split_seeds) for every env (group ids
    tagged with `tag`)."""
    return [Task(task_id=f"{e.key}-{s}", seed=s, env=e.key, group=f"{tag}-{e.key}-{i}")
            for e in envs for i, s in enumerate(split_seeds(split, tasks))]


def to_records(model: str, trajs: Sequence[Trajectory], max_turns: int) -> list[EpisodeRecord]:
    """One record per episode; samples numbered within each task in arrival order. The reward
    is the env's: the in-training eval collects through the training path, where
    `learner.overlong=penalty` lowered cut episodes' rewards (keeping the env's in info)."""
    seen: dict[str, int] = {}
    out = []
    for t in trajs:
        k = seen.get(t.group_id, 0)
        seen[t.group_id] = k + 1
        actions = tuple(t.info.get("actions", ()))[: t.num_turns]
        out.append(EpisodeRecord(
            model=model, env=t.env_name, task_id=t.task_id, seed=int(t.info.get("seed", -1)),
            sample=k, max_turns=max_turns, success=bool(t.info.get("success", False)),
            reward=float(t.info.get("env_reward", t.reward)), num_turns=len(actions),
            actions=actions, invalid_actions=min(int(t.info.get("invalid_actions", 0)),
                                                 len(actions)),
            failure="" if t.failure.value == "none" else t.failure.value, goal_turn=None))
    return out


def run_sweep(generators: Sequence[Any], collect: Any, *, model: str, envs: Sequence[EnvConfig],
              tasks: int, samples: int, max_turns: Sequence[int], step: int,
              split: str = "eval") -> list[EpisodeRecord]:
    """Every (env task, max_turns) with `samples` episodes each, tasks split over generators.
    `collect(ids)` returns the trajectories with those ids from the ingest."""
    import ray

    from horizonrl.cluster.rollout.iteration import split_evenly

    records: list[EpisodeRecord] = []
    for h in max_turns:
        todo = eval_tasks(envs, tasks, f"eval-s{step}-h{h}", split)
        shares = split_evenly(todo, len(generators))
        outs = ray.get([g.rollout.remote(s, group_size=samples, step=step, horizon=h)
                        for g, s in zip(generators, shares) if s])
        ids = all_ids(outs)
        records += to_records(model, collect(ids), h)
    return records


def resolve_model(spec: str, cfg: RunConfig) -> str:
    """`base` (the config's starting model), a run folder (its newest checkpoint), a checkpoint
    folder, or any save_pretrained folder."""
    from horizonrl.cluster.model.load import ensure_model

    if spec == "base":
        return str(cfg.model.path or ensure_model(cfg.model, env=cfg.env))
    path = Path(spec)
    if (path / "checkpoints").is_dir():
        found = latest_checkpoint(path)
        if found is None:
            raise FileNotFoundError(f"{spec}: the run has no complete checkpoint")
        return str(found)
    if not (path / "config.json").exists() and not (path / STATE_FILE).exists():
        raise FileNotFoundError(f"{spec}: not a model folder (no config.json), run folder or "
                                "'base'")
    return str(path)


def evaluate(cfg: RunConfig, models: dict[str, str], *, envs: Sequence[EnvConfig], tasks: int,
             samples: int, max_turns: Sequence[int], out: str | Path,
             split: str = "eval") -> dict[str, Any]:
    """Evaluate each labelled model; write the report to `out`; return the summary."""
    from horizonrl.cluster.ops.runtime import ray_session

    with ray_session(cfg.ray):
        return evaluate_in_session(cfg, models, envs=envs, tasks=tasks, samples=samples,
                                   max_turns=max_turns, out=out, split=split)


def eval_env_configs(envs: Sequence[EnvConfig], episodes: int) -> list[EnvConfig]:
    """Each env sized for a sweep of `episodes`: one replica per episode on each actor, or
    the env's `eval_replicas_per_actor` (heavy replicas; the generator then runs waves)."""
    return [e.model_copy(update={"replicas_per_actor": e.eval_replicas_per_actor or episodes})
            for e in envs]


def evaluate_in_session(cfg: RunConfig, models: dict[str, str], *, envs: Sequence[EnvConfig],
                        tasks: int, samples: int, max_turns: Sequence[int],
                        out: str | Path, split: str = "eval") -> dict[str, Any]:
    """`evaluate` inside a Ray session the caller holds (the warm start's, for one). Each env's
    pool gets one replica per episode of a sweep (`tasks` x `samples`), or
    its `eval_replicas_per_actor`."""
    import ray

    from horizonrl.cluster.eval.metrics import summarise
    from horizonrl.cluster.eval.report import write_report
    from horizonrl.cluster.ops.plan import placement_plan, wait_started
    from horizonrl.cluster.rollout.iteration import collect_trajectories, open_ingest

    records: list[EpisodeRecord] = []
    g = cfg.generator
    envs = eval_env_configs(envs, tasks * samples)
    # The run's own ingest settings (host, token, TLS), but never the run's fixed port: an
    # evaluation may run beside the training that owns it.
    ingest, address, token = open_ingest(cfg.learner.ingest.model_copy(update={"port": 0}))
    try:
        for label, path in models.items():
            t0 = time.perf_counter()
            remote = ray.remote(num_cpus=g.num_cpus, num_gpus=g.num_gpus,
                                resources=g.resources or None)(GeneratorActor)
            gen = remote.remote(name=f"eval-{label}", cfg=g, model_path=path,
                                env_pools=[EnvPool(e, name=f"eval-{label}-{e.key}",
                                                   agent=cfg.agent.callable) for e in envs],
                                agent=cfg.agent if cfg.agent.callable else None,
                                ingest_address=address, ingest_token=token,
                                ingest_tls_ca=cfg.learner.ingest.tls_ca_path, seed=cfg.seed)
            wait_started({f"generator eval-{label}": gen}, timeout_s=g.restart_timeout_s,
                         needs=placement_plan(cfg)[0][2], knob="generator.restart_timeout_s")
            records += run_sweep(
                [gen], lambda ids: collect_trajectories(
                    ingest, ids, cfg.learner.ingest.collect_timeout_s)[0],
                model=label, envs=envs, tasks=tasks, samples=samples, max_turns=max_turns,
                step=0, split=split)
            ray.kill(gen)
            print(f"[horizonrl] eval {label} ({path}): {len(records)} episodes so far "
                  f"({time.perf_counter() - t0:.0f}s)", flush=True)
    finally:
        ingest.stop()
    ks = sorted({k for k in (1, 2, 4, 8, 16, 32, 64) if k <= samples} | {samples})
    results = summarise(records, ks)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "episodes.jsonl").write_text("".join(_record_line(r) for r in records))
    write_report(results, out)
    return results


def _record_line(r: EpisodeRecord) -> str:
    import dataclasses
    import json

    return json.dumps(dataclasses.asdict(r)) + "\n"
