"""Where an iteration's data comes from and how new weights reach the generators: the one part
that differs between sync and async training. The `Trainer` (cluster/train/driver.py) runs the same
loop in both modes (gather -> train -> ledger -> publish -> metrics) and holds the shared parts
both phases use: the fleet of generators (cluster/rollout/fleet.py: the one policy version,
the weight sync, restarts) and the driver's recovery path (`replace_dead_generator`), the
ingest (`collect`) and the ledger.

Sync (AgentGym-RL's): every step rolls out its own tasks, trains on exactly those trajectories,
and every generator reloads the new weights before the next rollout.

Async (cluster/train/async_phase.py): generators never wait for the learner; the learner trains
on the oldest complete groups of a buffer, and with partial rollouts episodes in flight take
new weights at their next turn and the learner never waits for a rollout's stragglers.

In both modes each rollout call carries the curriculum's horizon in force when it is handed
out (`CurriculumActor.setting`): a change at a tick applies from the next rollout on, and
never waits for a rollout in progress (a generator serves one call at a time).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from horizonrl.cluster.rollout.iteration import (
    Gathered,
    dead_actors,
    sample_tasks,
    split_evenly,
)
from horizonrl.cluster.train.async_phase import AsyncPhase
from horizonrl.learner.credit import make_estimator
from horizonrl.learner.weights import SyncStats
from horizonrl.protos.reports import RolloutReport, all_ids
from horizonrl.protos.trajectory import Trajectory

if TYPE_CHECKING:
    from horizonrl.actors.generator import Task
    from horizonrl.cluster.train.driver import Trainer


class RolloutPhase(Protocol):
    """The mode-specific half of an iteration."""

    def gather(self, step: int) -> Gathered:
        """The trajectories to train on this step, with what was generated and dropped."""

    def publish(self, learn: dict[str, float]) -> SyncStats:
        """After the update: advance the fleet's policy version (or not) and get the weights
        to the generators."""

    def close(self) -> None:
        """Before the trainer tears its actors down."""

    def state(self) -> tuple[dict[str, Any], list[Trajectory]] | None:
        """What a checkpoint must hold for a resume to lose nothing (None: nothing)."""


def make_phase(trainer: Trainer) -> RolloutPhase:
    return AsyncPhase(trainer) if trainer.cfg.mode == "async" else SyncPhase(trainer)


class SyncPhase:
    """Roll out this step's tasks (more with dynamic sampling), train on exactly those, then
    push the weights to every generator before the next rollout."""

    def __init__(self, trainer: Trainer) -> None:
        self.t = trainer

    def gather(self, step: int) -> Gathered:
        outs = self._rollout(sample_tasks(self.t.cfg, step), step)
        trajs, orphans = self.t.collect(all_ids(outs))
        g = Gathered(outs=outs, trajs=trajs, orphans=orphans,
                     metrics={"sampling": {"rounds": 1.0, "groups_dropped": 0.0}})
        if self.t.cfg.learner.dynamic_sampling:
            self._fill_with_signal(g, step)
        return g

    def _rollout(self, tasks: list[Task], step: int) -> list[RolloutReport]:
        """Each generator rolls out its share; a generator that dies is restarted and its
        share re-run under new trajectory ids (what it had sent is discarded by id)."""
        import ray

        t = self.t
        shares = split_evenly(tasks, len(t.generators))
        group = t.cfg.generator.group_size
        setting = ray.get(t.curriculum.setting.remote())
        refs = [g.rollout.remote(s, step=step, group_size=group, setting=setting)
                for g, s in zip(t.generators, shares)]
        outs = []
        for i, (ref, share) in enumerate(zip(refs, shares)):
            try:
                outs.append(ray.get(ref))
            except ray.exceptions.RayActorError:
                t.replace_dead_generator(i, lost_episodes=len(share) * group, step=step,
                                         when=f"in step {step} (its {len(share)} tasks "
                                         "are re-run)")
                outs.append(ray.get(t.generators[i].rollout.remote(
                    share, step=step, group_size=group, setting=setting)))
        return outs

    def _fill_with_signal(self, g: Gathered, step: int) -> None:
        """Dynamic sampling (DAPO): roll out fresh tasks until tasks_per_step groups have a
        learning signal (the estimator's `signal_groups`) or max_sampling_rounds is reached;
        keep the first tasks_per_step such groups, the rest is dropped as not_selected.
        Updates `g` in place."""
        cfg = self.t.cfg
        want = cfg.generator.tasks_per_step
        # The estimator's notion of signal: reward variance, or for turn-level estimators
        # any non-zero turn advantage.
        groups_with_signal = make_estimator(cfg.learner).signal_groups
        rounds = 1
        while (len(groups_with_signal(g.trajs)) < want
               and rounds < cfg.learner.max_sampling_rounds):
            more = self._rollout(sample_tasks(cfg, step, rounds), step)
            got, orphans = self.t.collect(all_ids(more))
            g.outs += more
            g.orphans += orphans
            g.trajs = g.trajs + got
            rounds += 1
        keep = set(groups_with_signal(g.trajs)[:want])
        groups = len({t.group_id for t in g.trajs})
        g.dropped["not_selected"] = [t.trajectory_id for t in g.trajs if t.group_id not in keep]
        g.trajs = [t for t in g.trajs if t.group_id in keep]
        g.metrics["sampling"] = {"rounds": float(rounds), "groups_with_signal": float(len(keep)),
                                 "groups_dropped": float(groups - len(keep))}

    def publish(self, learn: dict[str, float]) -> SyncStats:
        """Every iteration is a version (generators reload in lock-step). A generator that died
        before or during the push is restarted (and re-synced on its own), and the push is
        repeated over the new list; a broadcast group re-forms for it."""
        import ray

        t = self.t
        t.fleet.advance()
        try:
            return t.fleet.push()
        except (ray.exceptions.RayError, TimeoutError):
            # Live generators may still be inside the failed collective until its timeout.
            dead = dead_actors(t.generators, t.cfg.learner.weight_sync_timeout_s + 30)
            if not dead:
                raise
        for i in dead:  # its rollout had ended: no episodes lost
            t.replace_dead_generator(i, lost_episodes=0, step=t.step_count,
                                     when="during the weight push")
        return t.fleet.push()

    def close(self) -> None:
        pass  # nothing in flight between steps

    def state(self) -> None:
        return None  # a step's tasks follow from (seed, step): nothing else to keep
