"""Async with partial rollouts cuts the long tail (issue "Partial rollouts"): trajectories
enter the driver's buffer as they reach the real gRPC ingest, so the learner trains as soon as
`tasks_per_step` groups are complete, never waiting for a rollout's last straggler; a second
rollout waits queued on each generator; a checkpoint taken meanwhile owes exactly the groups
not yet complete."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from horizonrl.cluster.config import load_config
from horizonrl.protos.reports import RolloutReport
from horizonrl.protos.trajectory import Trajectory

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]
ROOT = Path(__file__).resolve().parents[2]
STRAGGLE_S = 4.0


class _TailGenerator:
    """Stands in for GeneratorActor as a Ray actor: pushes every episode of its rollout over
    gRPC at once, except the last episode of the rollout's second group, which comes
    `STRAGGLE_S` later (a straggler)."""

    def __init__(self, address: str) -> None:
        from horizonrl.actors.transport import TrajectorySender

        self.sender = TrajectorySender(address, deadline_s=30.0)

    def ready(self) -> bool:
        return True

    def rollout(self, tasks, *, group_size, step, setting=None, board=None) -> RolloutReport:
        trajs = [_trajectory(f"s{step}-{task.group}-{k}", task.group)
                 for task in tasks for k in range(group_size)]
        straggler = trajs.pop(2 * group_size - 1)
        self.sender.send(trajs)
        time.sleep(STRAGGLE_S)
        self.sender.send([straggler])
        return RolloutReport(trajectory_ids=tuple(t.trajectory_id for t in [*trajs, straggler]),
                             policy_version=0, horizon=4, end_policy_version=0)


def _trajectory(tid: str, group: str) -> Trajectory:
    return Trajectory(trajectory_id=tid, group_id=group, task_id=group, env_name="babyai",
                      policy_version=0, horizon=4, prompt_ids=(1,), response_ids=(2,),
                      response_mask=(1,), response_logprobs=(0.0,), rewards=(0.0,), reward=0.0,
                      num_turns=1, terminated=True, truncated=False)


def test_the_learner_takes_complete_groups_past_a_straggler(tmp_path, fleet_of):
    import ray

    from horizonrl.actors.curriculum import CurriculumActor
    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.train.async_phase import AsyncPhase
    from horizonrl.cluster.train.ledger import Ledger
    from horizonrl.learner.ingest import TrajectoryIngest

    cfg = load_config(ROOT / "configs/babyai-local.yaml", [
        "mode=async", f"run_root={tmp_path}", "generator.partial_rollouts=true",
        "generator.rollout_steps=2", "generator.tasks_per_step=2", "generator.group_size=2",
        "generator.num_generators=1", "curriculum.horizons=[4]",
        # Rollout 1 (steps 2-3) is within 2 steps of step 0, so it may wait queued.
        "max_staleness=2"])
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with ray_session(cfg.ray), TrajectoryIngest() as ingest:
        curriculum = ray.remote(num_cpus=0)(CurriculumActor).remote(cfg.curriculum)
        gen = ray.remote(num_cpus=0)(_TailGenerator).remote(ingest.address)
        ledger = Ledger()

        def arrivals(timeout):
            got = ingest.take(1, timeout=timeout)
            return got + ingest.drain() if got else []

        trainer = SimpleNamespace(cfg=cfg, generators=[gen], curriculum=curriculum,
                                  policy_version=0, step_count=0, resume_phase=None,
                                  fleet=fleet_of([gen]),
                                  ledger=ledger, arrivals=arrivals)
        phase = AsyncPhase(trainer)
        first = phase.gather(0)
        # The straggler is pushed STRAGGLE_S after the rest: the ingest has not seen it yet.
        received_at_first = ingest.stats()["received"]
        # Rollout 0 carries steps 0 and 1: groups s0-a, s0-b (its straggler), s1-c, s1-d.
        groups = [t.group for t in phase.tasks(0)]
        assert [t.group_id for t in first.trajs] == [groups[0]] * 2 + [groups[2]] * 2
        assert sorted(first.generated) == sorted(
            f"s0-{g}-{k}" for g in groups for k in range(2) if (g, k) != (groups[1], 1))
        assert len(phase.inflight) == 2  # rollout 0 running, rollout 1 queued behind it
        state, buffer = phase.state()
        assert state["in_flight"] == [0, 1]
        # Rollout 0 owes only its straggling group; s1-d is complete and stays in the buffer.
        assert state["in_flight_groups"] == {"0": [groups[1]],
                                             "1": sorted(t.group for t in phase.tasks(1))}
        assert {t.group_id for t in buffer} == {groups[3]}
        trainer.step_count = 1  # as the driver counts its steps (the phase's frontier)
        second = phase.gather(1)  # the straggler's group completes with it
        assert [t.group_id for t in second.trajs] == [groups[3]] * 2 + [groups[1]] * 2
        ledger.add_generated(first.generated + second.generated)
        ledger.add_trained([t.trajectory_id for t in first.trajs + second.trajs], 0)
        # Rollout 1: close waits for it, takes in what it sent, drops it as in flight. Rollout
        # 2 (steps 4-5) is never issued: at step 1 the frontier is step 3.
        issued = phase.rollouts
        phase.close()
    assert received_at_first == 7, "the first update waited for the straggler"
    summary = ledger.summary()
    assert summary["reconciled"], summary
    assert issued == 2
    assert summary["trained"] == 8 and summary["dropped"] == {"in_flight": 8}


def test_an_eval_keeps_the_trajectories_of_rollouts_in_flight_for_training():
    """An eval collects its own ids while async rollouts push theirs into the same ingest:
    the others are kept as strays and the training side takes them later, by id or as
    arrivals, instead of losing them."""
    from horizonrl.actors.transport import TrajectorySender
    from horizonrl.cluster.rollout.iteration import collect_trajectories
    from horizonrl.learner.ingest import TrajectoryIngest

    strays: list[Trajectory] = []
    with TrajectoryIngest() as ingest, TrajectorySender(ingest.address) as sender:
        sender.send([_trajectory("train-0", "g"), _trajectory("eval-0", "e"),
                     _trajectory("train-1", "g")])
        got, orphans = collect_trajectories(ingest, ["eval-0"], 10.0, strays, keep_strays=True)
        assert [t.trajectory_id for t in got] == ["eval-0"] and orphans == []
        # The stray trajectory that arrived with the eval's is kept, and asked for by id
        # it comes from there; the rest still comes from the ingest.
        kept = {t.trajectory_id for t in strays}
        assert kept and kept <= {"train-0", "train-1"}
        got, orphans = collect_trajectories(ingest, ["train-0", "train-1"], 10.0, strays)
        assert [t.trajectory_id for t in got] == ["train-0", "train-1"]
        assert strays == [] and orphans == []
