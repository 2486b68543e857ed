"""The driver: builds the actors, runs the iteration loop, writes the run directory.

One iteration (sync mode, AgentGym-RL's): curriculum horizon -> generators roll out whole GRPO
groups and stream them over gRPC -> the learner takes exactly those trajectories -> one policy
update -> weights pushed to the generators (policy_version + 1) -> the curriculum ticks.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from actors.chat import load_tokenizer
from actors.curriculum import CurriculumActor
from actors.generator import GeneratorActor, Task
from cluster.config import RunConfig, dump_config
from cluster.metrics import MetricsLogger, progress_line
from cluster.models import ensure_model
from envpool.pool import EnvPool
from learner.group import LearnerGroup
from learner.ingest import TrajectoryIngest
from learner.weights import ObjectStoreWeightSync
from protos.trajectory import Failure, Trajectory


def make_run_dir(cfg: RunConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(cfg.run_root) / f"{cfg.name}__{cfg.seed}__{stamp}"
    run_dir.mkdir(parents=True, exist_ok=False)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    return run_dir


def sample_tasks(cfg: RunConfig, step: int) -> list[Task]:
    """Training tasks for `step`: seeds below the eval split, reproducible from (seed, step)."""
    rng = np.random.default_rng([cfg.seed, step])
    seeds = rng.integers(0, cfg.env.eval_seed_offset, size=cfg.generator.tasks_per_step)
    return [Task(task_id=f"{cfg.env.name}-{int(s)}", seed=int(s)) for s in seeds]


def rollout_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    ok = [t for t in trajs if t.failure is Failure.NONE]
    turns = sum(t.num_turns for t in ok)
    return {
        "reward_mean": float(np.mean([t.reward for t in ok])) if ok else 0.0,
        "success_rate": float(np.mean([t.info.get("success", False) for t in ok])) if ok else 0.0,
        "turns_mean": turns / len(ok) if ok else 0.0,
        "invalid_action_rate": sum(t.info.get("invalid_actions", 0) for t in ok) / max(turns, 1),
        "truncated_rate": float(np.mean([t.truncated for t in ok])) if ok else 0.0,
        "failed_episodes": float(len(trajs) - len(ok)),
        "max_turns": float(max((t.num_turns for t in trajs), default=0)),
    }


class Trainer:
    """Owns the actors of one run. Use as a context manager inside a Ray session."""

    def __init__(self, cfg: RunConfig, *, run_dir: Path) -> None:
        import ray
        
        self.cfg, self.run_dir = cfg, run_dir
        self.model_path = str(ensure_model(cfg.model, env=cfg.env))
        pad_id = load_tokenizer(self.model_path).pad_token_id
        ing = cfg.learner.ingest
        self.ingest = TrajectoryIngest(host=ing.host, port=ing.port, capacity=ing.capacity,
                                       max_message_bytes=ing.max_message_bytes).start()
        self.curriculum = ray.remote(num_cpus=0)(CurriculumActor).remote(cfg.curriculum)
        gen_remote = ray.remote(num_cpus=cfg.generator.num_cpus,
                                num_gpus=cfg.generator.num_gpus)(GeneratorActor)
        self.generators = [
            gen_remote.remote(name=f"gen{i}", cfg=cfg.generator, model_path=self.model_path,
                              env_pool=EnvPool(cfg.env, name=f"gen{i}-envpool"),
                              ingest_address=self.ingest.address, seed=cfg.seed * 1000 + i)
            for i in range(cfg.generator.num_generators)
        ]
        ray.get([g.ready.remote() for g in self.generators])
        ray.get([self.curriculum.register.remote(f"gen{i}", g)
                 for i, g in enumerate(self.generators)])
        self.learner = LearnerGroup(cfg.learner, model_path=self.model_path, pad_id=pad_id,
                                    seed=cfg.seed)
        self.weights = ObjectStoreWeightSync(self.learner, self.generators)
        self.metrics = MetricsLogger(run_dir)
        self.step_count = 0
        self.policy_version = 0
        self.last_trajectories: list[Trajectory] = []

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def step(self) -> dict[str, Any]:
        """One full iteration; returns (and logs) its metrics."""
        import ray

        cfg, step = self.cfg, self.step_count
        t_start = time.perf_counter()
        horizon, _ = ray.get(self.curriculum.current.remote())
        tasks = sample_tasks(cfg, step)
        shares = np.array_split(np.arange(len(tasks)), len(self.generators))
        outs = ray.get([g.rollout.remote([tasks[i] for i in idx], step=step,
                                         group_size=cfg.generator.group_size)
                        for g, idx in zip(self.generators, shares)])
        t_rollout = time.perf_counter() - t_start
        ids = [tid for o in outs for tid in o["trajectory_ids"]]
        trajs = self.ingest.take(len(ids), timeout=cfg.learner.ingest.collect_timeout_s)
        got = [t.trajectory_id for t in trajs]
        if sorted(got) != sorted(ids):
            raise RuntimeError(f"step {step}: generators sent {len(ids)} trajectories, ingest "
                               f"delivered {len(got)} ({len(set(ids) - set(got))} missing)")
        t0 = time.perf_counter()
        learn = self.learner.train(trajs)
        t_learn = time.perf_counter() - t0
        self.policy_version += 1
        sync = self.weights.push(self.policy_version)
        self.step_count += 1
        new_horizon, _ = ray.get(self.curriculum.tick.remote(self.step_count))
        secs = {k: float(sum(o["seconds"][k] for o in outs)) for k in ("generate", "env",
                                                                          "transport")}
        secs.update(rollout=t_rollout, learn=t_learn, weight_sync=sync["weight_sync_seconds"],
                    iteration=time.perf_counter() - t_start)
        tokens = sum(o["generated_tokens"] for o in outs)
        env_steps = sum(o["env_steps"] for o in outs)
        m = {"step": step, "horizon": horizon, "next_horizon": new_horizon,
             "policy_version": self.policy_version, **rollout_metrics(trajs),
             "trajectories_generated": len(ids), "trajectories_ingested": len(trajs),
             "ingest_duplicates": self.ingest.stats()["duplicates"],
             "tokens_per_s": tokens / max(secs["generate"], 1e-9),
             "env_steps_per_s": env_steps / max(secs["env"], 1e-9),
             "generated_tokens": tokens, "env_steps": env_steps, "seconds": secs,
             "learner": learn, "weight_reload_seconds": sync["weight_reload_seconds"]}
        self.metrics.log(step, _flatten(m))
        self.last_trajectories = trajs
        return m

    def save_checkpoint(self) -> Path:
        """HF model + tokenizer + driver/curriculum state under checkpoints/step_N."""
        import ray

        path = self.run_dir / "checkpoints" / f"step_{self.step_count:06d}"
        tmp = path.with_name(path.name + ".tmp")
        self.learner.save_hf(tmp)
        for f in Path(self.model_path).glob("tokenizer*"):
            shutil.copy(f, tmp / f.name)
        state = {"step": self.step_count, "policy_version": self.policy_version,
                 "curriculum": ray.get(self.curriculum.get_state.remote())}
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2))
        tmp.rename(path)  # a checkpoint folder without .tmp is complete
        return path

    def close(self) -> None:
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


def train(cfg: RunConfig) -> Path:
    """The whole run: `horizonrl train`. Returns the run directory."""
    from cluster.runtime import ray_session

    run_dir = make_run_dir(cfg)
    print(f"[horizonrl] run dir {run_dir}", flush=True)
    t0 = time.perf_counter()
    ensure_model(cfg.model, env=cfg.env)  # a first-use build gets the cores before Ray starts
    with ray_session(cfg.ray), Trainer(cfg, run_dir=run_dir) as trainer:
        print(f"[horizonrl] actors ready in {time.perf_counter() - t0:.0f}s; training "
              f"{cfg.iterations} iterations", flush=True)
        for _ in range(cfg.iterations):
            m = trainer.step()
            print(progress_line(m, cfg.iterations), flush=True)
            every = cfg.checkpoint_every
            if every and trainer.step_count % every == 0 and trainer.step_count < cfg.iterations:
                trainer.save_checkpoint()
        ckpt = trainer.save_checkpoint()
        print(f"[horizonrl] done in {time.perf_counter() - t0:.0f}s; final checkpoint {ckpt}",
              flush=True)
    return run_dir
