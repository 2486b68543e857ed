"""The async phase's checkpoint state without Ray: what a resume owes is the groups the
rollouts in flight had not completed, counted as resampled, and a phase restored from it
writes the same debt back if checkpointed again before it is paid."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from horizonrl.cluster.config import load_config
from horizonrl.cluster.train.async_phase import AsyncPhase
from horizonrl.cluster.train.ledger import Ledger
from horizonrl.protos.trajectory import Trajectory

ROOT = Path(__file__).resolve().parents[2]


def _t(tid: str, group: str) -> Trajectory:
    return Trajectory(trajectory_id=tid, group_id=group, task_id=group, env_name="babyai",
                      policy_version=0, horizon=4, prompt_ids=(1,), response_ids=(2,),
                      response_mask=(1,), response_logprobs=(0.0,), rewards=(0.0,), reward=0.0,
                      num_turns=1, terminated=True, truncated=False)


def _phase(state, buffer, *extra):
    cfg = load_config(ROOT / "configs/babyai-local.yaml", [
        "mode=async", "generator.tasks_per_step=2", "generator.group_size=2",
        "generator.rollout_steps=2", *extra])
    ledger = Ledger()
    trainer = SimpleNamespace(cfg=cfg, generators=[object()], policy_version=3, step_count=5,
                              resume_phase=(state, buffer), ledger=ledger)
    return AsyncPhase(trainer), ledger


def test_a_restored_phase_owes_the_incomplete_groups_and_checkpoints_them_again():
    probe, _ = _phase({"rollouts": 0, "in_flight": []}, [])
    groups = [t.group for t in probe.tasks(7)]  # rollout 7: steps 14 and 15, 2 tasks each
    assert len(groups) == 4 and groups[0].startswith("s14-") and groups[3].startswith("s15-")
    done = [_t("a", "s1-x"), _t("b", "s1-x")]  # a complete group of an earlier rollout
    state = {"rollouts": 9, "in_flight": [7, 8],
             "in_flight_groups": {"7": groups[1:2], "8": []}}
    phase, ledger = _phase(state, done)
    # Rollout 8 owed nothing (its groups were complete): it is not issued again.
    assert phase.pending == [(7, {groups[1]})]
    assert ledger.summary()["resampled_episodes"] == 2  # one group of 2 episodes
    assert ledger.summary()["generated"] == 2 and phase.buffer.complete() == 1
    again, buffer = phase.state()
    assert again == {"rollouts": 9, "in_flight": [7], "in_flight_groups": {"7": [groups[1]]}}
    assert buffer == done


def test_a_checkpoint_of_an_older_version_owes_whole_rollouts():
    phase, ledger = _phase({"rollouts": 4, "in_flight": [3]}, [])
    assert phase.pending == [(3, None)]
    assert ledger.summary()["resampled_episodes"] == 2 * 2 * 2  # 2 steps x 2 tasks x 2
    state, _ = phase.state()  # written again, the debt is every group of rollout 3
    assert state["in_flight_groups"] == {"3": sorted(t.group for t in phase.tasks(3))}


def test_rollouts_are_admitted_only_within_max_staleness_steps_of_the_learner():
    # rollout_steps=2: rollout r covers steps 2r and 2r+1; the learner is gathering step 5.
    phase, _ = _phase({"rollouts": 3, "in_flight": []}, [], "max_staleness=2")
    assert phase.frontier() == 7
    assert all(task.step in (6, 7) for task in phase.tasks(3))  # each task knows its step
    assert phase._admissible()  # rollout 3 starts at step 6 <= 7
    phase.rollouts = 4
    assert not phase._admissible()  # step 8 would run 3 steps ahead
    phase.t.step_count = 6
    assert phase._admissible()
    # A step's worth of groups lost with a dead generator moves the frontier one step on, so
    # the learner does not wait for groups that will never come.
    phase.lost |= {"s6-a", "s6-b"}
    assert phase.frontier() == 9
    phase.pending = [(1, None)]  # owed since a checkpoint: always admitted
    phase.rollouts, phase.t.step_count = 99, 0
    assert phase._admissible()
