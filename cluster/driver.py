"""The driver: builds the actors, runs the iteration loop, writes the run directory.

One iteration (sync mode, AgentGym-RL's): curriculum horizon -> generators roll out whole GRPO
groups and stream them over gRPC -> the learner takes exactly those trajectories -> one policy
update -> weights pushed to the generators (policy_version + 1) -> the curriculum ticks.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from actors.chat import load_tokenizer
from actors.curriculum import CurriculumActor
from actors.generator import GeneratorActor, Task
from cluster.checkpoints import (
    LEARNER_DIR,
    PROBE_IDS,
    ResumeState,
    prune_checkpoints,
    write_probe,
    write_state,
)
from cluster.config import RunConfig, dump_config
from cluster.metrics import MetricsLogger
from cluster.models import ensure_model
from cluster.prometheus import PrometheusExporter, repeated_action_rate
from envpool.base import EVAL_SEED_OFFSET
from envpool.pool import EnvPool
from learner.config import LearnerConfig
from learner.group import LearnerGroup, groups_with_signal
from learner.ingest import TrajectoryIngest, is_wildcard
from learner.weights import ObjectStoreWeightSync
from protos.codec import to_json_line
from protos.trajectory import Failure, Trajectory


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
        w = np.array([e.weight for e in envs], dtype=float)
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
        "reward_mean": sum(t.reward for t in ok) / n,
        "success_rate": sum(bool(t.info.get("success", False)) for t in ok) / n,
        "turns_mean": turns / n,
        "invalid_action_rate": sum(t.info.get("invalid_actions", 0) for t in ok) / max(turns, 1),
        "truncated_rate": sum(t.truncated for t in ok) / n,
        # Episodes that ran out of turns: what the adaptive curriculum watches.
        "truncated_at_horizon_rate": sum(t.truncated and t.num_turns >= t.horizon
                                         for t in ok) / n,
        "repeated_action_rate": repeated_action_rate(ok),
        "failed_episodes": float(len(trajs) - len(ok)),
        "max_turns": float(max((t.num_turns for t in trajs), default=0)),
    }


def env_metrics(cfg: RunConfig, trajs: Sequence[Trajectory],
                outs: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per env label: pool counters summed over generators, and (in multi-env runs) the rollout
    metrics of that env's episodes."""
    out: dict[str, dict[str, float]] = {}
    for e in cfg.envs:
        stats = [o["env_stats"][e.key] for o in outs if e.key in o.get("env_stats", {})]
        pool = {k: float(sum(st[k] for st in stats)) for k in stats[0]} if stats else {}
        if pool:
            pool["call_latency_mean_s"] = pool["call_seconds"] / max(pool["calls"], 1.0)
        out[e.key] = {f"pool_{k}": v for k, v in pool.items()}
        if len(cfg.envs) > 1:
            out[e.key].update(rollout_metrics([t for t in trajs if t.env_name == e.key]))
    return out


def resolved_learner(cfg: RunConfig) -> LearnerConfig:
    """The learner config with mode-dependent defaults filled in (the decoupled loss is on in
    async mode unless set explicitly)."""
    if cfg.learner.decoupled_loss is None:
        return cfg.learner.model_copy(update={"decoupled_loss": cfg.mode == "async"})
    return cfg.learner


def collect_trajectories(ingest: TrajectoryIngest, ids: list[str],
                         timeout_s: float) -> tuple[list[Trajectory], int]:
    """Exactly the trajectories with `ids` from the ingest, in that order; others (from a
    generator that died mid-step) are counted and dropped."""
    want, got, orphans = set(ids), {}, 0
    deadline = time.monotonic() + timeout_s
    while len(got) < len(want) and time.monotonic() < deadline:
        for t in ingest.take(len(want) - len(got), timeout=max(0.1, deadline - time.monotonic())):
            if t.trajectory_id in want:
                got[t.trajectory_id] = t
            else:
                orphans += 1
    if len(got) != len(want):
        raise RuntimeError(f"generators sent {len(want)} trajectories, the ingest delivered "
                           f"{len(got)} of them within {timeout_s}s")
    return [got[i] for i in ids], orphans


class Trainer:
    """Owns the actors of one run. Use as a context manager inside a Ray session."""

    def __init__(self, cfg: RunConfig, *, run_dir: Path, resume: ResumeState | None = None):
        import ray

        self.cfg, self.run_dir = cfg, run_dir
        base = str(ensure_model(cfg.model, env=cfg.env))
        # The KL reference is always the base model; a resumed policy starts from its checkpoint.
        self.base_model_path = resume.base_model_path if resume else base
        self.model_path = str(resume.checkpoint) if resume else base
        self.step_count = resume.step if resume else 0
        self.policy_version = resume.policy_version if resume else 0
        self.generator_restarts = 0
        ing = cfg.learner.ingest
        self.ingest_token = os.environ.get(ing.auth_token_env) or None
        self.ingest = TrajectoryIngest(host=ing.host, port=ing.port, capacity=ing.capacity,
                                       max_message_bytes=ing.max_message_bytes,
                                       auth_token=self.ingest_token).start()
        self.ingest_address = self.ingest.address
        if is_wildcard(ing.host):  # bound to every interface: advertise this node's IP
            self.ingest_address = f"{ray.util.get_node_ip_address()}:{self.ingest.port}"
        self.curriculum = ray.remote(num_cpus=0)(CurriculumActor).remote(cfg.curriculum)
        if resume:
            ray.get(self.curriculum.set_state.remote(resume.curriculum))
        self.generators = [self._spawn_generator(i)
                           for i in range(cfg.generator.num_generators)]
        ray.get([g.ready.remote() for g in self.generators])
        ray.get([self.curriculum.register.remote(f"gen{i}", g)
                 for i, g in enumerate(self.generators)])
        self.learner = LearnerGroup(resolved_learner(cfg), model_path=self.model_path,
                                    ref_model_path=self.base_model_path,
                                    pad_id=load_tokenizer(base).pad_token_id, seed=cfg.seed)
        if resume:
            self._restore_learner(resume)
        self.weights = ObjectStoreWeightSync(self.learner, self.generators)
        self.metrics = MetricsLogger(
            run_dir, wandb_config=cfg.model_dump(mode="json") if cfg.metrics.wandb else None)
        self.exporter = None
        if cfg.metrics.enabled:
            self.exporter = PrometheusExporter(host=cfg.metrics.host, port=cfg.metrics.port,
                                               run=cfg.name, env="+".join(e.key for e in cfg.envs))
            (run_dir / "status.json").write_text(
                json.dumps({"metrics_address": self.exporter.address}))
            print(f"[horizonrl] Prometheus metrics on http://{self.exporter.address}/metrics",
                  flush=True)
        self.last_trajectories: list[Trajectory] = []

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spawn_generator(self, i: int) -> Any:
        import ray

        g = self.cfg.generator
        remote = ray.remote(num_cpus=g.num_cpus, num_gpus=g.num_gpus)(GeneratorActor)
        return remote.remote(name=f"gen{i}", cfg=g, model_path=self.model_path,
                             env_pools=[EnvPool(e, name=f"gen{i}-{e.key}")
                                        for e in self.cfg.envs],
                             ingest_address=self.ingest_address,
                             ingest_token=self.ingest_token, seed=self.cfg.seed * 1000 + i,
                             policy_version=self.policy_version)

    def restart_generator(self, i: int) -> None:
        """Replace a dead generator: current weights, then the curriculum's current horizon."""
        import ray

        new = self._spawn_generator(i)
        ray.get(new.ready.remote())
        ray.get(new.update_weights.remote(self.learner.state_dict_ref(), self.policy_version))
        ray.get(self.curriculum.register.remote(f"gen{i}", new))
        self.generators[i] = new  # the weight sync holds this same list
        self.generator_restarts += 1

    def _rollout(self, tasks: list[Task], step: int) -> list[dict[str, Any]]:
        """Each generator rolls out its share; a generator that dies is restarted and its
        share re-run under new trajectory ids (what it had sent is discarded by id)."""
        import ray

        shares = [[tasks[i] for i in idx]
                  for idx in np.array_split(np.arange(len(tasks)), len(self.generators))]
        group = self.cfg.generator.group_size
        refs = [g.rollout.remote(s, step=step, group_size=group)
                for g, s in zip(self.generators, shares)]
        outs = []
        for i, (ref, share) in enumerate(zip(refs, shares)):
            try:
                outs.append(ray.get(ref))
            except ray.exceptions.RayActorError:
                print(f"[horizonrl] generator gen{i} died in step {step}; restarting it and "
                      f"re-running its {len(share)} tasks", flush=True)
                self.restart_generator(i)
                outs.append(ray.get(self.generators[i].rollout.remote(
                    share, step=step, group_size=group)))
        return outs

    def _fill_with_signal(self, trajs: list[Trajectory], outs: list[dict[str, Any]],
                          step: int) -> tuple[list[Trajectory], dict[str, float]]:
        """Dynamic sampling (DAPO): roll out fresh tasks until tasks_per_step groups have
        reward variance or max_sampling_rounds is reached; keep the first tasks_per_step such
        groups. Extends `outs` in place; the dropped groups are counted."""
        want = self.cfg.generator.tasks_per_step
        rounds = 1
        while (len(groups_with_signal(trajs)) < want
               and rounds < self.cfg.learner.max_sampling_rounds):
            more = self._rollout(sample_tasks(self.cfg, step, rounds), step)
            outs.extend(more)
            trajs = trajs + self._collect([t for o in more for t in o["trajectory_ids"]])[0]
            rounds += 1
        keep = set(groups_with_signal(trajs)[:want])
        kept = [t for t in trajs if t.group_id in keep]
        groups = len({t.group_id for t in trajs})
        return kept, {"rounds": float(rounds), "groups_with_signal": float(len(keep)),
                      "groups_dropped": float(groups - len(keep)),
                      "trajectories_dropped": float(len(trajs) - len(kept))}

    def _collect(self, ids: list[str]) -> tuple[list[Trajectory], int]:
        return collect_trajectories(self.ingest, ids, self.cfg.learner.ingest.collect_timeout_s)

    def step(self) -> dict[str, Any]:
        """One full iteration; returns (and logs) its metrics."""
        import ray

        step, t_start = self.step_count, time.perf_counter()
        horizon, _ = ray.get(self.curriculum.current.remote())
        outs, ids, trajs, orphans, extra = self._gather(step)
        t_rollout = time.perf_counter() - t_start
        staleness = max((self.policy_version - t.policy_version for t in trajs), default=0)
        t0 = time.perf_counter()
        learn = self.learner.train(trajs)
        t_learn = time.perf_counter() - t0
        if self._bumps_version(learn):
            self.policy_version += 1
        sync = self._push_weights()
        self.step_count += 1
        roll = rollout_metrics(trajs)
        new_horizon, _ = ray.get(self.curriculum.tick.remote(self.step_count, roll))
        decision = ray.get(self.curriculum.last_decision.remote())
        secs = {k: float(sum(o["seconds"][k] for o in outs))
                for k in ("generate", "env", "transport")}
        secs.update(rollout=t_rollout, learn=t_learn, weight_sync=sync["weight_sync_seconds"],
                    iteration=time.perf_counter() - t_start)
        tokens = sum(o["generated_tokens"] for o in outs)
        env_steps = sum(o["env_steps"] for o in outs)
        m = {"step": step, "horizon": horizon, "next_horizon": new_horizon,
             "policy_version": self.policy_version, **roll,
             "trajectories_generated": len(ids), "trajectories_ingested": len(ids),
             "trajectories_trained": len(trajs),
             "trajectories_orphaned": orphans, **extra,
             "ingest_duplicates": self.ingest.stats()["duplicates"],
             "generator_restarts": self.generator_restarts,
             "env_restarts": sum(o["env_restarts"] for o in outs),
             "queue_depth": self.ingest.stats()["queue_depth"], "staleness_max": staleness,
             "tokens_per_s": tokens / max(secs["generate"], 1e-9),
             "env_steps_per_s": env_steps / max(secs["env"], 1e-9),
             "generated_tokens": tokens, "env_steps": env_steps, "seconds": secs,
             "learner": learn, "weight_reload_seconds": sync["weight_reload_seconds"]}
        m["env"] = env_metrics(self.cfg, trajs, outs)
        every = self.cfg.eval.every
        if every and (self.step_count % every == 0 or self.step_count == self.cfg.iterations):
            m.update(self.evaluate())
        if decision is not None:
            m["curriculum_decision"] = decision["reason"]
        flat = _flatten(m)
        self.metrics.log(step, flat)
        if self.exporter is not None:
            self.exporter.observe(flat, trajs)
        self.last_trajectories = trajs
        if self.cfg.save_trajectories:
            log = self.run_dir / "trajectories"
            log.mkdir(exist_ok=True)
            (log / f"step_{step:06d}.jsonl").write_text(
                "".join(to_json_line(t) + "\n" for t in trajs))
        return m

    def _gather(self, step: int) -> tuple[list[dict[str, Any]], list[str], list[Trajectory],
                                          int, dict[str, Any]]:
        """Sync mode: roll out this step's tasks (more with dynamic sampling) and collect
        exactly those trajectories. Returns (rollout outputs, ids generated, trajectories to
        train on, orphans, extra metrics)."""
        outs = self._rollout(sample_tasks(self.cfg, step), step)
        ids = [tid for o in outs for tid in o["trajectory_ids"]]
        trajs, orphans = self._collect(ids)
        sampling = {"rounds": 1.0, "groups_dropped": 0.0}
        if self.cfg.learner.dynamic_sampling:
            trajs, sampling = self._fill_with_signal(trajs, outs, step)
            ids = [tid for o in outs for tid in o["trajectory_ids"]]
        return outs, ids, trajs, orphans, {"sampling": sampling}

    def _bumps_version(self, learn: dict[str, float]) -> bool:
        return True  # sync: every iteration is a version (generators reload in lock-step)

    def _push_weights(self) -> dict[str, float]:
        """Sync mode: every generator reloads the new weights before the next rollout."""
        return self.weights.push(self.policy_version)

    def evaluate(self) -> dict[str, float]:
        """Eval-split accuracy (and pass@samples) per env and turn budget with the current
        policy, as eval/<env>/h<H>/... keys."""
        import ray

        from cluster.eval_metrics import summarise
        from cluster.evaluate import run_sweep

        e = self.cfg.eval
        turns = e.max_turns or [ray.get(self.curriculum.current.remote())[0]]
        records = run_sweep(self.generators, lambda ids: self._collect(ids)[0], model="policy",
                            envs=self.cfg.envs, tasks=e.tasks, samples=e.samples,
                            max_turns=turns, step=self.step_count)
        summary = summarise(records, [e.samples])["policy"]
        flat = {}
        for env, by_turns in summary.items():
            for h, cell in by_turns.items():
                flat[f"eval/{env}/h{h}/accuracy"] = cell["accuracy"]
                flat[f"eval/{env}/h{h}/pass@{e.samples}"] = cell["pass_at_k"][str(e.samples)][
                    "value"]
                flat[f"eval/{env}/h{h}/mean_turns"] = cell["mean_turns"]
        return {k: v for k, v in flat.items() if v is not None}

    def save_checkpoint(self) -> Path:
        """HF model + tokenizer, the learner's optimizer/scheduler/RNG state, the driver and
        curriculum state and a logprob probe, under checkpoints/step_N (renamed into place only
        when complete); then only the newest `keep_checkpoints` are kept."""
        import ray

        path = self.run_dir / "checkpoints" / f"step_{self.step_count:06d}"
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self.learner.save_hf(tmp)
        self.learner.save_checkpoint(tmp / LEARNER_DIR)
        for f in Path(self.base_model_path).glob("tokenizer*"):
            shutil.copy(f, tmp / f.name)
        write_probe(tmp, PROBE_IDS, self.learner.score([PROBE_IDS])[0])
        write_state(tmp, {"step": self.step_count, "policy_version": self.policy_version,
                          "curriculum": ray.get(self.curriculum.get_state.remote()),
                          "base_model_path": self.base_model_path,
                          "learner": {"world_size": self.cfg.learner.world_size,
                                      "zero_stage": self.cfg.learner.zero_stage,
                                      "algorithm": self.cfg.learner.algorithm}})
        if path.exists():  # the same step saved again (a resumed run that had finished)
            shutil.rmtree(path)
        tmp.rename(path)  # a checkpoint folder without .tmp is complete
        prune_checkpoints(self.run_dir, keep=self.cfg.keep_checkpoints)
        return path

    def _restore_learner(self, resume: ResumeState) -> None:
        """Optimizer, scheduler and RNG from the checkpoint; a checkpoint from another world
        size, ZeRO stage or algorithm (or one without learner state) resumes weights only."""
        saved = resume.learner
        want = {"world_size": self.cfg.learner.world_size,
                "zero_stage": self.cfg.learner.zero_stage,
                "algorithm": self.cfg.learner.algorithm}
        state_dir = resume.checkpoint / LEARNER_DIR
        if saved != want or not state_dir.is_dir():
            print(f"[horizonrl] WARNING: {resume.checkpoint} has learner state {saved}, this run "
                  f"is {want}: resuming the weights with a fresh optimizer", flush=True)
            return
        self.learner.load_checkpoint(state_dir)

    def close(self) -> None:
        if self.exporter is not None:
            self.exporter.close()
        self.metrics.close()
        self.learner.shutdown()
        self.ingest.stop()


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out
