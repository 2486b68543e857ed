"""Async training's data phase: generators never wait for the learner.

Every generator always has one rollout in flight (`generator.rollout_steps` steps' worth of
tasks); when one ends the generator is handed the newest weights (if the learner moved on)
and its next rollout at once: the reload is queued on the actor ahead of the rollout, so
generation stops only for the reload itself. Trajectories wait in a `GroupBuffer`; the learner
takes the oldest `tasks_per_step` complete groups, drops trajectories more than
`max_staleness` versions behind (and counts them), and trains with the decoupled loss
(learner.decoupled_loss), whose truncated importance weights correct for the lag. Which
trajectories land in which update depends on timing, so an async run is not bit-for-bit
reproducible.

Without partial rollouts episodes never change weights mid-way (their `policy_version`
produced every token) and a rollout's trajectories enter the buffer when its report does.
With `generator.partial_rollouts`:
- each update is posted to a `PolicyBoard` (actors/policy_board.py) and the episodes in flight
  take it at their next turn (the generator finishes the generations it has running, reloads,
  and samples every later turn with the new version; each turn records its version in
  `Trajectory.turn_versions`; `policy_version` is the oldest, so the staleness bound applies
  to the oldest turn). The curriculum's horizon is posted at the start of each step, and an
  episode in flight takes it at its next turn, never below the turns it has taken plus one.
- the long tail is cut: trajectories enter the buffer as they reach the ingest, so the
  learner trains as soon as `tasks_per_step` groups are complete, never waiting for the last
  straggler of a rollout (its group waits in the buffer, the other groups go on).

Generation runs at most `max_staleness` updates ahead of the learner (AReaL's bound): a
rollout is issued only once its first step is within `max_staleness` of the steps done, and
with partial rollouts each of its episodes starts only once the board's frontier reaches the
episode's own step (later steps of a rollout wait while earlier ones run). So what is generated
is not thrown away as stale for being made too early; the frontier moves on by one for every
step's worth of groups lost with a dead generator, so the learner never waits on groups that
will not come.

A checkpoint holds the phase (`state`): the rollout counter, the buffer, and for each rollout
in flight the groups not yet complete. `--resume` puts the buffer back and issues those
groups again with their own task seeds and group ids before any new rollout; their episodes
(half-finished ones included: env and KV state are not saved) are generated again from the
first turn and counted in the ledger as resampled, so nothing is lost or trained twice across
a stop or a kill. A generator that dies mid-rollout loses the groups it had not completed
(their delivered episodes are dropped as `generator_lost`); its complete groups are kept.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from horizonrl.cluster.rollout.iteration import Gathered, sample_tasks
from horizonrl.cluster.train.group_buffer import GroupBuffer
from horizonrl.learner.weights import SyncStats
from horizonrl.protos.trajectory import Trajectory

if TYPE_CHECKING:
    from horizonrl.actors.generator import Task
    from horizonrl.cluster.train.driver import Trainer

_POLL_S = 0.2  # streaming: how long one wait for arrivals lasts before reports are checked


def split_stale(trajs: list[Trajectory], version: int,
                max_staleness: int) -> tuple[list[Trajectory], list[Trajectory]]:
    """(fresh, stale): stale ones are more than `max_staleness` versions behind `version`."""
    fresh = [t for t in trajs if version - t.policy_version <= max_staleness]
    stale = [t for t in trajs if version - t.policy_version > max_staleness]
    return fresh, stale


class AsyncPhase:
    """One rollout always in flight per generator; the learner trains on the oldest complete
    groups of a buffer; weights are handed off as each generator starts its next rollout."""

    def __init__(self, trainer: Trainer) -> None:
        self.t = trainer
        g = trainer.cfg.generator
        # ObjectRef of a rollout -> (its generator's index, the rollout's index: seeds its
        # tasks), in the order issued. Streaming queues a second rollout on each generator
        # behind the running one, so it starts the moment the first ends.
        self.inflight: dict[Any, tuple[int, int]] = {}
        self.buffer = GroupBuffer(g.group_size)
        self.open: dict[int, set[str]] = {}  # rollout -> its groups not yet taken
        self.lost: set[str] = set()  # groups of rollouts whose generator died
        self.rollouts = 0  # rollout calls issued: seeds the task draw of each
        # Rollouts in flight at the checkpoint, issued first: (index, the groups still owed,
        # None for all of them).
        self.pending: list[tuple[int, set[str] | None]] = []
        self._reload_seconds: list[Any] = []  # ObjectRefs of hand-offs not yet reported
        self.streaming = g.partial_rollouts
        self.board = None  # partial rollouts: where new versions reach rollouts in flight
        if g.partial_rollouts:
            import ray

            from horizonrl.actors.policy_board import PolicyBoard

            self.board = ray.remote(num_cpus=0)(PolicyBoard).remote()
        if trainer.resume_phase is not None:
            self._restore(*trainer.resume_phase)

    # -- checkpoint --------------------------------------------------------------------------
    def state(self) -> tuple[dict[str, Any], list[Trajectory]]:
        """Rollouts in flight owe their groups not yet complete; those groups' episodes that
        arrived are left out of the buffer (they are generated again on resume)."""
        owed = {r: self._owed(r) for _, r in self.inflight.values()}
        owed.update({r: {task.group for task in self.tasks(r)} if groups is None else groups
                     for r, groups in self.pending})
        partial = {gid for groups in owed.values() for gid in groups}
        keep = [t for t in self.buffer.trajectories() if t.group_id not in partial]
        return ({"rollouts": self.rollouts,
                 "in_flight": sorted([r for _, r in self.inflight.values()]
                                     + [r for r, _ in self.pending]),
                 "in_flight_groups": {str(r): sorted(g) for r, g in owed.items()}},
                keep)

    def _owed(self, r: int) -> set[str]:
        return {gid for gid in self.open.get(r, ())
                if self.buffer.members(gid) < self.buffer.group_size}

    def _restore(self, state: dict[str, Any], buffer: list[Trajectory]) -> None:
        """Continue the checkpoint's phase: its buffer back (the ledger had not settled it),
        the groups its rollouts in flight owed issued first, counted as resampled."""
        t = self.t
        groups = state.get("in_flight_groups")  # absent in checkpoints of older versions
        self.rollouts = int(state["rollouts"])
        owed = [(int(r), None if groups is None else set(groups.get(str(r), [])))
                for r in state["in_flight"]]
        self.pending = [(r, gs) for r, gs in owed if gs is None or gs]  # [] owes nothing
        self.buffer.add(buffer)
        t.ledger.add_generated(tr.trajectory_id for tr in buffer)
        g = t.cfg.generator
        per_rollout = g.rollout_steps * g.tasks_per_step
        t.ledger.add_resampled(sum(per_rollout if gs is None else len(gs)
                                   for _, gs in self.pending) * g.group_size, t.step_count)

    # -- rollouts ----------------------------------------------------------------------------
    def tasks(self, r: int) -> list[Task]:
        """Rollout r's tasks: those of steps r*k .. r*k+k-1 (k = rollout_steps), each with the
        group id of its step."""
        k = self.t.cfg.generator.rollout_steps
        return [replace(task, group=task.group or f"s{s}-{task.task_id}", step=s)
                for s in range(r * k, r * k + k) for task in sample_tasks(self.t.cfg, s)]

    def frontier(self) -> int:
        """The last step whose episodes may start: `max_staleness` past the step being
        gathered, plus a step for each step's worth of groups lost with dead generators."""
        t = self.t
        short = -(-len(self.lost) // t.cfg.generator.tasks_per_step)
        return t.step_count + t.cfg.max_staleness + short

    def _admissible(self) -> bool:
        """Whether the next rollout may be issued now: one owed since a checkpoint always is
        (its steps are behind), a new one once its first step is within the frontier."""
        return bool(self.pending) or (
            self.rollouts * self.t.cfg.generator.rollout_steps <= self.frontier())

    def _submit(self, i: int) -> None:
        """Give generator i the newest weights (if it lags) and its next rollout, which
        carries the horizon in force now."""
        import ray

        t = self.t
        # Streaming takes new weights from the board, between turns of the rollout.
        if self.board is None and (ref := t.fleet.hand_off(i)) is not None:
            self._reload_seconds.append(ref)
        if self.pending:  # in flight at the checkpoint: the groups it owed, again
            r, owed = self.pending.pop(0)
        else:
            (r, owed), self.rollouts = (self.rollouts, None), self.rollouts + 1
        tasks = [task for task in self.tasks(r) if owed is None or task.group in owed]
        self.open[r] = {task.group for task in tasks}
        partial = {} if self.board is None else {"board": self.board}
        ref = t.generators[i].rollout.remote(
            tasks, step=r, group_size=t.cfg.generator.group_size,
            setting=ray.get(t.curriculum.setting.remote()), **partial)
        self.inflight[ref] = (i, r)

    def _fill(self, i: int) -> None:
        """Generator i's queue topped up (one rollout, two when streaming) with what the
        frontier admits."""
        depth = 2 if self.streaming else 1
        while sum(gi == i for gi, _ in self.inflight.values()) < depth and self._admissible():
            self._submit(i)

    def gather(self, step: int) -> Gathered:
        """Wait until the buffer holds `tasks_per_step` complete groups; take the oldest."""
        import ray

        t = self.t
        if self.board is not None:  # the curriculum ticked after the last update's post
            self.board.post.remote(t.policy_version, [], ray.get(t.curriculum.setting.remote()))
            self.board.admit.remote(self.frontier())
        for i in range(len(t.generators)):
            self._fill(i)
        g = Gathered(outs=[], trajs=[], arrived=[] if self.streaming else None,
                     dropped={"generator_lost": []})
        want = t.cfg.generator.tasks_per_step
        if self.streaming:
            self._stream(g, want)
        else:
            while self.buffer.complete() < want:
                self._next_report(g, timeout=t.cfg.learner.ingest.collect_timeout_s)
        taken = self.buffer.take(want)
        done = {tr.group_id for tr in taken}  # a rollout's groups, once all taken, owe nothing
        for gids in self.open.values():
            gids -= done
        self.open = {r: gids for r, gids in self.open.items()
                     if gids or r in {r2 for _, r2 in self.inflight.values()}}
        fresh, stale = split_stale(taken, t.policy_version, t.cfg.max_staleness)
        lag = [t.policy_version - tr.policy_version for tr in taken]
        g.trajs, g.dropped["stale"] = fresh, [tr.trajectory_id for tr in stale]
        g.metrics = {"async": {
            "dropped_stale": float(len(stale)), "buffered": float(len(self.buffer)),
            "lag_mean": sum(lag) / max(len(lag), 1),
            # partial rollouts: reloads between turns, episodes they split
            "weight_loads_mid_rollout": float(sum(o.weight_loads for o in g.outs)),
            "multi_version_share": sum(bool(tr.turn_versions) for tr in taken)
            / max(len(taken), 1)}}
        return g

    def _stream(self, g: Gathered, want: int) -> None:
        """Buffer trajectories as they arrive and hand out new rollouts as reports come,
        until `want` groups are complete."""
        import ray

        limit = self.t.cfg.learner.ingest.collect_timeout_s
        deadline = time.monotonic() + limit
        while self.buffer.complete() < want:
            got = self.t.arrivals(_POLL_S)
            if got:
                deadline = time.monotonic() + limit
                g.arrived += [tr.trajectory_id for tr in got]
                # Sent before its generator died, drained after: its group is gone.
                g.dropped["generator_lost"] += [tr.trajectory_id for tr in got
                                                if tr.group_id in self.lost]
                self.buffer.add(tr for tr in got if tr.group_id not in self.lost)
            refs = list(self.inflight)
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in ready:
                if ref in self.inflight:  # not taken with a generator that died
                    self._report(ref, g)
            if time.monotonic() > deadline:
                raise RuntimeError(f"no trajectory arrived within {limit}s "
                                   "(learner.ingest.collect_timeout_s)")

    def _next_report(self, g: Gathered, timeout: float) -> None:
        """Take the report of the next rollout to finish (its generator gets the next one at
        once); without streaming its trajectories enter the buffer now. A generator that died
        is restarted: the groups its running rollout had not completed are lost, a rollout
        queued behind it is issued again."""
        import ray

        ready, _ = ray.wait(list(self.inflight), num_returns=1, timeout=timeout)
        if not ready:
            raise RuntimeError(f"no generator finished a rollout within {timeout}s")
        self._report(ready[0], g)

    def _report(self, ref: Any, g: Gathered) -> None:
        import ray

        t = self.t
        i, r = self.inflight.pop(ref)
        try:
            out = ray.get(ref)
            # Partial rollouts: the generator may have taken newer weights mid-rollout.
            t.fleet.loaded(i, out.end_policy_version)
        except ray.exceptions.RayActorError:
            self._lose(i, r, g)
        else:
            g.outs.append(out)
            if not self.streaming:
                got, lost = t.collect(list(out.trajectory_ids))
                self.buffer.add(got)
                g.orphans += lost
        self._fill(i)

    def _lose(self, i: int, r: int, g: Gathered) -> None:
        """Generator i died in rollout r: its complete groups stay, the rest is lost; rollouts
        queued behind r never started and go out again first."""
        t = self.t
        queued = [(ref, r2) for ref, (gi, r2) in self.inflight.items() if gi == i]
        for ref, _ in queued:
            del self.inflight[ref]
        self.pending[:0] = [(r2, self.open.pop(r2)) for _, r2 in queued]
        owed = self._owed(r)
        size = self.buffer.group_size
        missing = sum(size - self.buffer.members(gid) for gid in owed)
        g.dropped["generator_lost"] += [tr.trajectory_id for tr in self.buffer.drop(owed)]
        self.open[r] -= owed
        self.lost |= owed
        t.replace_dead_generator(i, lost_episodes=missing, step=t.step_count, when="mid-rollout")

    def publish(self, learn: dict[str, float]) -> SyncStats:
        """Nothing to wait for: each generator picks the new weights up when its rollout ends
        (or at its next turn, with partial rollouts). Reports the reloads finished since the
        last step."""
        import ray

        # An update that trained nothing leaves the weights as they were: a new version would
        # only make the data in flight look staler than it is.
        if learn.get("skipped_update", 0.0) == 0.0:
            fleet = self.t.fleet
            version = fleet.advance()
            if self.board is not None:  # rollouts in flight take it at their next turn
                self.board.post.remote(version, [fleet.weights.state(version)], None)
        if self.board is not None:  # this step is done (the driver counts it next)
            self.board.admit.remote(self.frontier() + 1)
        done, self._reload_seconds = ray.wait(self._reload_seconds,
                                              num_returns=len(self._reload_seconds), timeout=0)
        secs = ray.get(done)
        return SyncStats(seconds=0.0, reload_seconds=max(secs) if secs else 0.0)

    def close(self) -> None:
        import ray

        if self.board is not None:  # episodes not started yet never start: nothing waits
            from horizonrl.actors.policy_board import CLOSED

            ray.get(self.board.admit.remote(CLOSED))
        for ref in self.inflight:  # let in-flight rollouts end before the teardown
            try:
                ray.get(ref, timeout=60)
            except Exception:  # a rollout failing now loses nothing that was trained on
                pass
        # Buffered trajectories were generated (and counted) but never trained on. Without
        # streaming, rollouts still in flight were never collected, so they never entered the
        # ledger; with streaming what they sent since the last step is taken in now, so every
        # group of theirs meets its fate whole.
        if self.streaming:
            while late := self.t.arrivals(0.5):
                self.t.ledger.add_generated(tr.trajectory_id for tr in late)
                self.buffer.add(late)
        self.t.ledger.add_dropped([tr.trajectory_id for tr in self.buffer.trajectories()],
                                  "in_flight", self.t.step_count)
