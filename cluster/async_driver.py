"""Asynchronous training: generators never wait for the learner.

Every generator always has one rollout in flight. When one finishes, its trajectories go into a
buffer and the generator is handed the newest weights (if the learner has moved on) and its next
rollout at once: the reload is queued on the actor ahead of the rollout, so generation stops only
for the reload itself, and episodes never change weights mid-way (their `policy_version` is the
version that produced every token). Meanwhile the learner takes the oldest `tasks_per_step`
whole groups from the buffer, drops trajectories more than `max_staleness` versions behind (and
counts them), and trains with the decoupled loss (learner.decoupled_loss), whose truncated
importance weights correct for the lag.

Unlike sync mode, which trajectories land in which update depends on timing, so an async run is
not bit-for-bit reproducible and `--resume` restores weights, optimizer and curriculum but not the
in-flight rollouts (they are re-generated).
"""

from __future__ import annotations

from typing import Any

from horizonrl.cluster.driver import Trainer
from horizonrl.cluster.iteration import Gathered, sample_tasks
from horizonrl.learner.weights import SyncStats
from horizonrl.protos.reports import RolloutReport
from horizonrl.protos.trajectory import Trajectory


def split_stale(trajs: list[Trajectory], version: int,
                max_staleness: int) -> tuple[list[Trajectory], list[Trajectory]]:
    """(fresh, stale): stale ones are more than `max_staleness` versions behind `version`."""
    fresh = [t for t in trajs if version - t.policy_version <= max_staleness]
    stale = [t for t in trajs if version - t.policy_version > max_staleness]
    return fresh, stale


class AsyncTrainer(Trainer):
    """`Trainer` with the rollout and the weight push replaced by the asynchronous versions."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.inflight: dict[int, Any] = {}  # generator index -> ObjectRef of its rollout
        self.gen_versions = [self.policy_version] * len(self.generators)
        self.buffer: list[Trajectory] = []
        self.rollouts = 0  # rollout calls issued: seeds the task draw of each
        self._reload_seconds: list[Any] = []  # ObjectRefs of hand-offs not yet reported

    def _submit(self, i: int) -> None:
        """Give generator i the newest weights (if it lags) and its next rollout."""
        g = self.generators[i]
        if self.gen_versions[i] < self.policy_version:
            self._reload_seconds.append(self.weights.hand_off(i, self.policy_version))
            self.gen_versions[i] = self.policy_version
        tasks = sample_tasks(self.cfg, self.rollouts)
        self.inflight[i] = g.rollout.remote(tasks, step=self.rollouts,
                                            group_size=self.cfg.generator.group_size)
        self.rollouts += 1

    def _gather(self, step: int) -> Gathered:
        """Wait until the buffer holds `tasks_per_step` whole groups; take the oldest."""
        import ray

        for i in range(len(self.generators)):
            if i not in self.inflight:
                self._submit(i)
        outs: list[RolloutReport] = []
        ids: list[str] = []
        orphans: list[str] = []
        want = self.cfg.generator.tasks_per_step
        while len({t.group_id for t in self.buffer}) < want:
            by_ref = {ref: i for i, ref in self.inflight.items()}
            limit = self.cfg.learner.ingest.collect_timeout_s
            ready, _ = ray.wait(list(by_ref), num_returns=1, timeout=limit)
            if not ready:
                raise RuntimeError(f"no generator finished a rollout within {limit}s")
            i = by_ref[ready[0]]
            del self.inflight[i]
            try:
                out = ray.get(ready[0])
            except ray.exceptions.RayActorError:
                g = self.cfg.generator  # a rollout is one step's worth of tasks
                self.replace_dead_generator(i, lost_episodes=g.tasks_per_step * g.group_size,
                                            step=self.step_count, when="mid-rollout")
                self.gen_versions[i] = self.policy_version
                self._submit(i)
                continue
            got, lost = self._collect(list(out.trajectory_ids))
            self.buffer += got
            outs.append(out)
            ids += out.trajectory_ids
            orphans += lost
            self._submit(i)
        order = list(dict.fromkeys(t.group_id for t in self.buffer))[:want]
        keep = set(order)
        taken = [t for t in self.buffer if t.group_id in keep]
        self.buffer = [t for t in self.buffer if t.group_id not in keep]
        fresh, stale = split_stale(taken, self.policy_version, self.cfg.max_staleness)
        lag = [self.policy_version - t.policy_version for t in taken]
        extra = {"async": {"dropped_stale": float(len(stale)),
                           "buffered": float(len(self.buffer)),
                           "lag_mean": sum(lag) / max(len(lag), 1)}}
        return Gathered(outs=outs, generated=ids, trajs=fresh, orphans=orphans,
                        dropped={"stale": [t.trajectory_id for t in stale]}, metrics=extra)

    def _bumps_version(self, learn: dict[str, float]) -> bool:
        # An update that trained nothing leaves the weights as they were: a new version would
        # only make the data in flight look staler than it is.
        return learn.get("skipped_update", 0.0) == 0.0

    def _push_weights(self) -> SyncStats:
        """Nothing to wait for: each generator picks the new weights up when its rollout ends.
        Reports the reloads that finished since the last step."""
        import ray

        done, self._reload_seconds = ray.wait(self._reload_seconds,
                                              num_returns=len(self._reload_seconds), timeout=0)
        secs = ray.get(done)
        return SyncStats(seconds=0.0, reload_seconds=max(secs) if secs else 0.0)

    def close(self) -> None:
        import ray

        for ref in self.inflight.values():  # let in-flight rollouts end before the teardown
            try:
                ray.get(ref, timeout=60)
            except Exception:  # a rollout failing now loses nothing that was trained on
                pass
        # Buffered trajectories were generated (and counted) but never trained on. Rollouts
        # still in flight were never collected, so they never entered the ledger.
        self.ledger.add_dropped([t.trajectory_id for t in self.buffer], "in_flight",
                                self.step_count)
        super().close()
