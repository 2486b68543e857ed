"""The driver: builds the actors, runs the iteration loop, writes the run directory.

One iteration: curriculum horizon -> the rollout phase gathers whole GRPO groups, streamed over
gRPC (sync, AgentGym-RL's: exactly this step's trajectories; async: the oldest buffered groups)
-> one policy update -> the phase publishes the weights (policy_version + 1) -> the curriculum
ticks. The modes differ only in their phase (cluster/train/phases.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from horizonrl.actors.curriculum import CurriculumActor
from horizonrl.cluster.config import RunConfig
from horizonrl.cluster.model.load import ensure_model
from horizonrl.cluster.ops.checkpoints import (
    ResumeState,
    learner_identity,
    restore_learner,
    write_checkpoint,
)
from horizonrl.cluster.ops.multinode import record_placement
from horizonrl.cluster.ops.prometheus import PrometheusExporter
from horizonrl.cluster.rollout.fleet import Fleet, GeneratorLost
from horizonrl.cluster.rollout.iteration import (
    Gathered,
    collect_trajectories,
    env_metrics,
    flatten,
    open_ingest,
    resolved_learner,
    rollout_metrics,
)
from horizonrl.cluster.train.ledger import Ledger
from horizonrl.cluster.train.metrics import MetricsLogger
from horizonrl.cluster.train.phases import make_phase
from horizonrl.cluster.warm_start.recipe import DemoReplay
from horizonrl.learner.batch import apply_overlong
from horizonrl.learner.group import LearnerGroup
from horizonrl.learner.weights import SyncStats
from horizonrl.protos.chat import load_tokenizer
from horizonrl.protos.codec import to_json_line
from horizonrl.protos.precision import emulated_bf16_warning
from horizonrl.protos.reports import RolloutSeconds
from horizonrl.protos.trajectory import Trajectory


class LearnerLost(RuntimeError):
    """A learner rank died: the run cannot go on without a restart from a checkpoint."""




class Trainer:
    """Owns the actors of one run. Use as a context manager inside a Ray session."""

    def __init__(self, cfg: RunConfig, *, run_dir: Path, resume: ResumeState | None = None):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.cfg, self.run_dir = cfg, run_dir
        base = str(ensure_model(cfg.model, env=cfg.env))
        # The KL reference is always the base model; a resumed policy starts from its checkpoint.
        self.base_model_path = resume.base_model_path if resume else base
        self.model_path = str(resume.checkpoint) if resume else base
        self.step_count = resume.step if resume else 0
        self.resume_phase = resume.phase if resume else None  # read by the rollout phase
        self._context_warned = False
        self.ingest, self.ingest_address, self.ingest_token = open_ingest(cfg.learner.ingest)
        # On the driver's node: the schedule's state must not die with a rollout node.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.curriculum = ray.remote(num_cpus=0)(CurriculumActor).options(
            scheduling_strategy=here).remote(cfg.curriculum)
        if resume:
            ray.get(self.curriculum.set_state.remote(resume.curriculum))
        # The generators and the one policy version (a resume's, or 0). Their engines load
        # while the learner ranks start, rather than one after the other.
        self.fleet = Fleet(cfg, model_path=self.model_path,
                           ingest=(self.ingest_address, self.ingest_token),
                           curriculum=self.curriculum,
                           version=resume.policy_version if resume else 0)
        self.learner = LearnerGroup(resolved_learner(cfg), model_path=self.model_path,
                                    ref_model_path=self.base_model_path,
                                    pad_id=load_tokenizer(base).pad_token_id, seed=cfg.seed,
                                    temperature=cfg.generator.temperature)
        self.fleet.wait_ready()
        # What `auto` precisions became on the roles' devices, beside the config that asked.
        self.precision = {"learner": self.learner.dtype, "generator": "+".join(sorted(set(
            ray.get([g.precision.remote() for g in self.generators]))))}
        (run_dir / "precision.json").write_text(json.dumps(self.precision))
        if warning := emulated_bf16_warning("generator.dtype", [
                d for d in ray.get([g.emulated_bf16.remote() for g in self.generators]) if d]):
            print(warning, flush=True)
        record_placement(run_dir, self.generators, self.learner.workers)
        if resume:
            restore_learner(self.learner, resume, learner_identity(cfg.learner))
        self.fleet.connect(self.learner)
        self.replay = DemoReplay.for_run(cfg, run_dir) if cfg.init.replay_batch else None
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
        # Training trajectories an eval's collection took while async rollouts were in
        # flight: the training side takes them from here before the ingest.
        self.strays: list[Trajectory] = []
        self.ledger = Ledger.resume(run_dir, self.step_count)
        self.phase = make_phase(self)  # sync or async: where data comes from, how weights go

    def __enter__(self) -> Trainer:
        return self

    @property
    def policy_version(self) -> int:
        """The run's policy version: the fleet's (the one place it changes)."""
        return self.fleet.version

    @property
    def generators(self) -> list[Any]:
        return self.fleet.generators

    def __exit__(self, *exc: object) -> None:
        self.close()

    def replace_dead_generator(self, i: int, *, lost_episodes: int, step: int, when: str) -> None:
        """The one recovery path for a dead generator (sync rollout, async rollout, weight
        push): say so, restart it, and count the episodes that died with it (they never got an
        id; anything it had pushed is dropped by id as `generator_lost`)."""
        print(f"[horizonrl] generator gen{i} died {when}; restarting it", flush=True)
        self.ledger.add_generator_error(lost_episodes, step)
        self.fleet.restart(i)

    def collect(self, ids: list[str]) -> tuple[list[Trajectory], list[str]]:
        """Exactly the trajectories with `ids` from the ingest (overlong rule applied), and the
        ids of others that arrived meanwhile."""
        got, orphans = collect_trajectories(self.ingest, ids,
                                            self.cfg.learner.ingest.collect_timeout_s,
                                            strays=self.strays)
        lc = self.cfg.learner
        return apply_overlong(got, lc.overlong, lc.overlong_penalty), orphans

    def arrivals(self, timeout: float) -> list[Trajectory]:
        """Whatever reached the ingest (waiting up to `timeout` for the first), overlong rule
        applied: the streaming async phase takes trajectories as they come."""
        got, self.strays = self.strays, []
        got += self.ingest.take(1, timeout=0 if got else timeout)
        if not got:
            return []
        lc = self.cfg.learner
        return apply_overlong(got + self.ingest.drain(), lc.overlong, lc.overlong_penalty)

    def _warn_context(self, trajs: list[Trajectory]) -> None:
        """Once per run (it would repeat every step): an episode the context limit ended."""
        err = next((t.info["context_error"] for t in trajs if "context_error" in t.info), "")
        if err and not self._context_warned:
            self._context_warned = True
            print(f"[horizonrl] an episode ended because {err}; raise "
                  "generator.max_context_tokens or lower max_tokens_per_turn", flush=True)

    def step(self) -> dict[str, Any]:
        """One full iteration; returns (and logs) its metrics."""
        import ray

        step, t_start = self.step_count, time.perf_counter()
        horizon, _ = ray.get(self.curriculum.current.remote())
        g = self.phase.gather(step)
        outs, trajs = g.outs, g.trajs
        t_rollout = time.perf_counter() - t_start
        staleness = max((self.policy_version - t.policy_version for t in trajs), default=0)
        t0 = time.perf_counter()
        learn = self._learner_call(self.learner.train, trajs)
        if self.replay is not None:  # behaviour-cloning replay: after the RL update, one SFT step
            sft = self._learner_call(self.learner.train_sft, self.replay.draw(step))
            learn = {**learn, **{f"replay_{k}": v for k, v in sft.items()}}
        t_learn = time.perf_counter() - t0
        trained = self._account(step, g, trajs)
        sync, lost = self._publish(learn)
        self.step_count += 1
        roll = rollout_metrics(trajs)
        new_horizon, _ = ray.get(self.curriculum.tick.remote(self.step_count, roll))
        decision = ray.get(self.curriculum.last_decision.remote())
        secs = asdict(sum((o.seconds for o in outs), RolloutSeconds()))
        secs.update(rollout=t_rollout, learn=t_learn, weight_sync=sync.seconds,
                    iteration=time.perf_counter() - t_start)
        tokens = sum(o.generated_tokens for o in outs)
        prompt_tokens = sum(o.prompt_tokens for o in outs)
        cached = sum(o.cached_tokens for o in outs)
        env_steps = sum(o.env_steps for o in outs)
        m = {"step": step, "horizon": horizon, "next_horizon": new_horizon,
             "policy_version": self.policy_version, **roll,
             "trajectories_generated": len(g.generated), "trajectories_orphaned": len(g.orphans),
             "trajectories_trained": trained, **g.metrics,
             "ledger": self.ledger.flush(),
             "ingest_duplicates": self.ingest.stats()["duplicates"],
             "generator_restarts": self.fleet.restarts,
             "generator_rss_max_bytes": max((o.rss_bytes for o in outs), default=0),
             "env_restarts": sum(o.env_restarts for o in outs),
             "queue_depth": self.ingest.stats()["queue_depth"], "staleness_max": staleness,
             "tokens_per_s": tokens / max(secs["generate"], 1e-9),
             # 0 where no env time was measured (outside agents step their envs themselves).
             "env_steps_per_s": env_steps / secs["env"] if secs["env"] > 1e-3 else 0.0,
             "generated_tokens": tokens, "env_steps": env_steps, "seconds": secs,
             # Prompt tokens the engine read per step, and the share its prefix cache served.
             "prompt_tokens": prompt_tokens,
             "prefix_cache_hit_rate": cached / max(prompt_tokens, 1),
             "learner": learn, "weight_reload_seconds": sync.reload_seconds,
             "weight_sync": {k: v for k, v in sync.metrics().items()  # seconds: in seconds/
                             if k not in ("weight_sync_seconds", "weight_reload_seconds")}}
        m["env"] = env_metrics(self.cfg, trajs, outs)
        every = self.cfg.eval.every
        # Without all its generators there is no eval; the resumed run does not repeat it.
        if every and lost is None and (self.step_count % every == 0
                                       or self.step_count == self.cfg.iterations):
            m.update(self.evaluate())
        if decision is not None:
            m["curriculum_decision"] = decision["reason"]
        flat = flatten(m)
        self.metrics.log(step, flat)
        if self.exporter is not None:
            self.exporter.observe(flat, trajs)
        self.last_trajectories = trajs
        self._warn_context(trajs)
        if self.cfg.save_trajectories:
            log = self.run_dir / "trajectories"
            log.mkdir(exist_ok=True)
            (log / f"step_{step:06d}.jsonl").write_text(
                "".join(to_json_line(t) + "\n" for t in trajs))
        if lost is not None:
            raise lost
        return m

    def _publish(self, learn: dict[str, float]) -> tuple[SyncStats, GeneratorLost | None]:
        """The phase's weight push, and the generator lost for good during it (if any). The
        update is applied and the version moved on by then, so the step is finished (counted,
        ticked, logged) before the loss is raised: the checkpoint the run then saves is of this
        step done. Saved as this step's own number it would replace the clean checkpoint
        before the step, and a resume would apply the update a second time."""
        try:
            return self.phase.publish(learn), None
        except GeneratorLost as exc:
            return SyncStats(seconds=0.0, reload_seconds=0.0), exc

    def _learner_call(self, update: Callable[[Any], dict[str, float]],
                      data: Any) -> dict[str, float]:
        """One learner update; a dead learner rank ends the run with what to do next."""
        import ray

        try:
            return update(data)
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
            # A rank that died takes the collective down: the survivors fail inside gloo (a
            # RayTaskError), the dead one with RayActorError. Anything else is a real bug.
            dead = self.learner.dead_ranks()
            if not dead:
                raise
            raise LearnerLost(
                f"learner rank(s) {dead} died during the update of step {self.step_count} "
                f"({type(exc).__name__}); the run stops here. Continue it with `horizonrl "
                f"train --config ... --resume auto` (from the last checkpoint)") from None

    def _account(self, step: int, g: Gathered, trajs: list[Trajectory]) -> int:
        """Every id of this step into the ledger: generated, then trained or dropped. Returns
        how many were trained."""
        led = self.ledger
        led.add_generated(g.generated + g.orphans)
        led.add_dropped(g.orphans, "generator_lost", step)
        for reason, ids in g.dropped.items():
            led.add_dropped(ids, reason, step)
        fates = self.learner.fates(trajs)
        for fate, idx in fates.items():
            ids = [trajs[i].trajectory_id for i in idx]
            if fate == "trained":
                led.add_trained(ids, step)
            else:
                led.add_dropped(ids, fate, step)
        return len(fates.get("trained", []))

    def evaluate(self) -> dict[str, float]:
        """Eval-split accuracy (and pass@samples) per env and turn budget with the current
        policy, as eval/<env>/h<H>/... keys."""
        import ray

        from horizonrl.cluster.eval.evaluate import run_sweep
        from horizonrl.cluster.eval.metrics import summarise

        e = self.cfg.eval
        turns = e.horizons or [ray.get(self.curriculum.current.remote())[0]]
        # Raw trajectories: the eval reports the env's rewards, not a training rule (overlong).
        timeout_s = self.cfg.learner.ingest.collect_timeout_s
        # Async: rollouts in flight push into the same ingest; training takes theirs later.
        keep = self.cfg.mode == "async"
        records = run_sweep(self.generators,
                            lambda ids: collect_trajectories(self.ingest, ids, timeout_s,
                                                             self.strays, keep_strays=keep)[0],
                            model="policy",
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
                flat[f"eval/{env}/h{h}/mean_reward"] = cell["mean_reward"]
        return {k: v for k, v in flat.items() if v is not None}

    def save_checkpoint(self) -> Path:
        """checkpoints/step_N of the steps done so far (cluster/ops/checkpoints.py)."""
        import ray

        phase, buffer = self.phase.state() or (None, None)
        return write_checkpoint(
            self.run_dir, self.learner, base_model_path=self.base_model_path,
            keep=self.cfg.keep_checkpoints, buffer=buffer,
            state={"step": self.step_count, "policy_version": self.policy_version,
                   "curriculum": ray.get(self.curriculum.get_state.remote()),
                   "base_model_path": self.base_model_path,
                   "learner": learner_identity(self.cfg.learner), "phase": phase})

    def close(self) -> None:
        self.phase.close()
        summary = self.ledger.close()
        print(f"[horizonrl] ledger: {summary['generated']} generated, {summary['trained']} "
              f"trained, dropped {summary['dropped'] or 'none'}, "
              f"{'reconciled' if summary['reconciled'] else 'NOT RECONCILED'}", flush=True)
        if self.exporter is not None:
            self.exporter.close()
        self.metrics.close()
        self.fleet.close()  # a broadcast group is left before its learner rank goes
        self.learner.shutdown()
        self.ingest.stop()
        # The rollout side goes too: a driver that runs several trainings in one Ray session
        # (bench/horizon_experiment.py runs 12) would otherwise keep every run's generators,
        # and the env actors they own, holding CPUs until the next run's pool cannot start.
        import ray

        for actor in (*self.generators, self.curriculum):
            ray.kill(actor)
