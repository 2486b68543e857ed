"""Where an iteration's data comes from and how new weights reach the generators: the one part
that differs between sync and async training. The `Trainer` (cluster/driver.py) runs the same
loop in both modes (gather -> train -> ledger -> publish -> metrics) and holds the shared parts
both phases use: the generators and their one recovery path (`replace_dead_generator`), the
ingest (`collect`), the weight sync and the ledger.

Sync (AgentGym-RL's): every step rolls out its own tasks, trains on exactly those trajectories,
and every generator reloads the new weights before the next rollout.

Async: generators never wait for the learner. Every generator always has one rollout in
flight; when one finishes, its trajectories go into a buffer and the generator is handed the
newest weights (if the learner has moved on) and its next rollout at once: the reload is queued
on the actor ahead of the rollout, so generation stops only for the reload itself. By default
episodes never change weights mid-way (their `policy_version` produced every token). With
`generator.partial_rollouts` each update is posted to a `PolicyBoard` (actors/policy_board.py)
and the episodes in flight take it at their next turn: the generator finishes the generations
it has running, reloads, and samples every later turn with the new version (each turn records
its version in `Trajectory.turn_versions`; `policy_version` is the oldest, so the staleness
bound below applies to the oldest turn). The curriculum's horizon is posted at the start of
each step, and an episode in flight takes it at its next turn, never below the turns it has
taken plus one.
The learner takes the oldest `tasks_per_step` whole groups from the buffer, drops trajectories
more than `max_staleness` versions behind (and counts them), and trains with the decoupled loss
(learner.decoupled_loss), whose truncated importance weights correct for the lag. Which
trajectories land in which update depends on timing, so an async run is not bit-for-bit
reproducible. A checkpoint holds the phase too (`state`): the rollout counter, the buffer and
which rollouts were in flight. `--resume` reloads the buffer and re-issues the rollouts that
were in flight with their own task seeds and group ids before any new one; their episodes
(half-finished ones of partial rollouts included: env and KV state are not saved) are generated
again from the first turn and counted in the ledger as resampled, so nothing is lost or trained
twice across a stop or a kill.

In both modes each rollout call carries the curriculum's horizon in force when it is handed
out (`CurriculumActor.setting`): a change at a tick applies from the next rollout on, and
never waits for a rollout in progress (a generator serves one call at a time).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from horizonrl.cluster.iteration import (
    Gathered,
    dead_actors,
    sample_tasks,
    split_evenly,
)
from horizonrl.learner.credit import make_estimator
from horizonrl.learner.weights import SyncStats
from horizonrl.protos.reports import RolloutReport, all_ids
from horizonrl.protos.trajectory import Trajectory

if TYPE_CHECKING:
    from horizonrl.actors.generator import Task
    from horizonrl.cluster.driver import Trainer


class RolloutPhase(Protocol):
    """The mode-specific half of an iteration."""

    def gather(self, step: int) -> Gathered:
        """The trajectories to train on this step, with what was generated and dropped."""

    def publish(self, learn: dict[str, float]) -> SyncStats:
        """After the update: advance the trainer's policy_version (or not) and get the
        weights to the generators."""

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
        t.policy_version += 1
        try:
            return t.weights.push(t.policy_version)
        except (ray.exceptions.RayError, TimeoutError):
            # Live generators may still be inside the failed collective until its timeout.
            dead = dead_actors(t.generators, t.cfg.learner.weight_sync_timeout_s + 30)
            if not dead:
                raise
        for i in dead:  # its rollout had ended: no episodes lost
            t.replace_dead_generator(i, lost_episodes=0, step=t.step_count,
                                     when="during the weight push")
        return t.weights.push(t.policy_version)

    def close(self) -> None:
        pass  # nothing in flight between steps

    def state(self) -> None:
        return None  # a step's tasks follow from (seed, step): nothing else to keep


def split_stale(trajs: list[Trajectory], version: int,
                max_staleness: int) -> tuple[list[Trajectory], list[Trajectory]]:
    """(fresh, stale): stale ones are more than `max_staleness` versions behind `version`."""
    fresh = [t for t in trajs if version - t.policy_version <= max_staleness]
    stale = [t for t in trajs if version - t.policy_version > max_staleness]
    return fresh, stale


class AsyncPhase:
    """One rollout always in flight per generator; the learner trains on the oldest whole
    groups of a buffer; weights are handed off as each generator starts its next rollout."""

    def __init__(self, trainer: Trainer) -> None:
        self.t = trainer
        # generator index -> (ObjectRef of its rollout, the rollout's index: seeds its tasks)
        self.inflight: dict[int, tuple[Any, int]] = {}
        self.gen_versions = [trainer.policy_version] * len(trainer.generators)
        self.buffer: list[Trajectory] = []
        self.rollouts = 0  # rollout calls issued: seeds the task draw of each
        self.pending: list[int] = []  # rollouts in flight at the checkpoint: issued first
        self._reload_seconds: list[Any] = []  # ObjectRefs of hand-offs not yet reported
        self.board = None  # partial rollouts: where new versions reach rollouts in flight
        if trainer.cfg.generator.partial_rollouts:
            import ray

            from horizonrl.actors.policy_board import PolicyBoard

            self.board = ray.remote(num_cpus=0)(PolicyBoard).remote()
        if trainer.resume_phase is not None:
            self._restore(*trainer.resume_phase)

    def state(self) -> tuple[dict[str, Any], list[Trajectory]]:
        return ({"rollouts": self.rollouts,
                 "in_flight": sorted([r for _, r in self.inflight.values()] + self.pending)},
                list(self.buffer))

    def _restore(self, state: dict[str, Any], buffer: list[Trajectory]) -> None:
        """Continue the checkpoint's phase: its buffer back (the ledger had not settled it),
        its rollouts in flight re-issued first, counted as resampled."""
        t = self.t
        self.rollouts, self.pending = int(state["rollouts"]), list(state["in_flight"])
        self.buffer = list(buffer)
        t.ledger.add_generated(tr.trajectory_id for tr in self.buffer)
        g = t.cfg.generator
        t.ledger.add_resampled(len(self.pending) * g.tasks_per_step * g.group_size,
                               t.step_count)

    def _submit(self, i: int) -> None:
        """Give generator i the newest weights (if it lags) and its next rollout, which
        carries the horizon in force now."""
        import ray

        t = self.t
        if self.gen_versions[i] < t.policy_version:
            self._reload_seconds.append(t.weights.hand_off(i, t.policy_version))
            self.gen_versions[i] = t.policy_version
        if self.pending:  # one that was in flight at the checkpoint: the same tasks again
            r = self.pending.pop(0)
        else:
            r, self.rollouts = self.rollouts, self.rollouts + 1
        partial = {} if self.board is None else {"board": self.board}
        self.inflight[i] = (t.generators[i].rollout.remote(
            sample_tasks(t.cfg, r), step=r, group_size=t.cfg.generator.group_size,
            setting=ray.get(t.curriculum.setting.remote()), **partial), r)

    def gather(self, step: int) -> Gathered:
        """Wait until the buffer holds `tasks_per_step` whole groups; take the oldest."""
        import ray

        t = self.t
        if self.board is not None:  # the curriculum ticked after the last update's post
            self.board.post.remote(t.policy_version, [], ray.get(t.curriculum.setting.remote()))
        for i in range(len(t.generators)):
            if i not in self.inflight:
                self._submit(i)
        outs: list[RolloutReport] = []
        orphans: list[str] = []
        want = t.cfg.generator.tasks_per_step
        while len({tr.group_id for tr in self.buffer}) < want:
            out = self._next_report()
            if out is None:
                continue
            got, lost = t.collect(list(out.trajectory_ids))
            self.buffer += got
            outs.append(out)
            orphans += lost
        keep = set(list(dict.fromkeys(tr.group_id for tr in self.buffer))[:want])
        taken = [tr for tr in self.buffer if tr.group_id in keep]
        self.buffer = [tr for tr in self.buffer if tr.group_id not in keep]
        fresh, stale = split_stale(taken, t.policy_version, t.cfg.max_staleness)
        lag = [t.policy_version - tr.policy_version for tr in taken]
        extra = {"async": {"dropped_stale": float(len(stale)),
                           "buffered": float(len(self.buffer)),
                           "lag_mean": sum(lag) / max(len(lag), 1),
                           # partial rollouts: reloads between turns, episodes they split
                           "weight_loads_mid_rollout": float(sum(o.weight_loads for o in outs)),
                           "multi_version_share": sum(bool(tr.turn_versions) for tr in taken)
                           / max(len(taken), 1)}}
        return Gathered(outs=outs, trajs=fresh, orphans=orphans,
                        dropped={"stale": [tr.trajectory_id for tr in stale]}, metrics=extra)

    def _next_report(self) -> RolloutReport | None:
        """The report of the next rollout to finish (its generator gets the next one at once);
        None when that generator had died (it is restarted and resubmitted)."""
        import ray

        t = self.t
        by_ref = {ref: i for i, (ref, _) in self.inflight.items()}
        limit = t.cfg.learner.ingest.collect_timeout_s
        ready, _ = ray.wait(list(by_ref), num_returns=1, timeout=limit)
        if not ready:
            raise RuntimeError(f"no generator finished a rollout within {limit}s")
        i = by_ref[ready[0]]
        del self.inflight[i]
        try:
            out = ray.get(ready[0])
            # Partial rollouts: the generator may have taken newer weights mid-rollout.
            self.gen_versions[i] = max(self.gen_versions[i], out.end_policy_version)
        except ray.exceptions.RayActorError:
            g = t.cfg.generator  # a rollout is one step's worth of tasks
            t.replace_dead_generator(i, lost_episodes=g.tasks_per_step * g.group_size,
                                     step=t.step_count, when="mid-rollout")
            self.gen_versions[i] = t.policy_version
            out = None
        self._submit(i)
        return out

    def publish(self, learn: dict[str, float]) -> SyncStats:
        """Nothing to wait for: each generator picks the new weights up when its rollout ends.
        Reports the reloads that finished since the last step."""
        import ray

        # An update that trained nothing leaves the weights as they were: a new version would
        # only make the data in flight look staler than it is.
        if learn.get("skipped_update", 0.0) == 0.0:
            self.t.policy_version += 1
            if self.board is not None:  # rollouts in flight take it at their next turn
                t = self.t
                self.board.post.remote(t.policy_version, [t.weights.state(t.policy_version)],
                                       None)
        done, self._reload_seconds = ray.wait(self._reload_seconds,
                                              num_returns=len(self._reload_seconds), timeout=0)
        secs = ray.get(done)
        return SyncStats(seconds=0.0, reload_seconds=max(secs) if secs else 0.0)

    def close(self) -> None:
        import ray

        for ref, _ in self.inflight.values():  # let in-flight rollouts end before the teardown
            try:
                ray.get(ref, timeout=60)
            except Exception:  # a rollout failing now loses nothing that was trained on
                pass
        # Buffered trajectories were generated (and counted) but never trained on. Rollouts
        # still in flight were never collected, so they never entered the ledger.
        self.t.ledger.add_dropped([tr.trajectory_id for tr in self.buffer], "in_flight",
                                  self.t.step_count)
