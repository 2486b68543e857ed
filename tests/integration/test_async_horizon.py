"""Async mode and a changing horizon (issue 41, defect 10): a stepwise change never waits on
the rollout a generator is busy with, even one longer than the curriculum's acknowledgement
timeout; the rollouts started after the change carry the new horizon."""

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
STEPWISE = ["mode=async", "curriculum.horizons=[2, 3]", "curriculum.boundaries=[1]"]


class _SlowGenerator:
    """Stands in for GeneratorActor as a Ray actor (one call at a time): every rollout takes
    `seconds` and names the horizon it ran with in its trajectory ids."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.horizon, self.version = seconds, None, -1

    def ready(self) -> bool:
        return True

    def set_horizon(self, horizon, version, env_horizons=None) -> None:
        if version >= self.version:
            self.horizon, self.version = horizon, version

    def rollout(self, tasks, *, group_size, step, horizon=None, setting=None) -> RolloutReport:
        if setting is not None:  # as GeneratorActor.rollout: the call's horizon, if newer
            self.set_horizon(setting.horizon, setting.version, setting.env_horizons)
        time.sleep(self.seconds)
        ids = tuple(f"h{self.horizon}/s{step}-{t.task_id}/{k}" for t in tasks
                    for k in range(group_size))
        return RolloutReport(trajectory_ids=ids, policy_version=0, horizon=self.horizon)


def _trajectory(tid: str) -> Trajectory:
    h, group, _ = tid.split("/")
    return Trajectory(trajectory_id=tid, group_id=group, task_id=group, env_name="babyai",
                      policy_version=0, horizon=int(h[1:]), prompt_ids=(1,), response_ids=(2,),
                      response_mask=(1,), response_logprobs=(0.0,), rewards=(0.0,), reward=0.0,
                      num_turns=1, terminated=True, truncated=False)


def test_async_phase_survives_a_change_during_a_rollout_longer_than_the_timeout(tmp_path, fleet_of):
    """The real AsyncPhase and CurriculumActor, with generators that are stand-ins whose
    rollouts last 4x the curriculum's timeout: the tick returns at once, and each rollout
    submitted after it runs with the new horizon."""
    import ray

    from horizonrl.actors.curriculum import CurriculumActor
    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.train.async_phase import AsyncPhase

    cfg = load_config(ROOT / "configs/babyai-local.yaml", [
        *STEPWISE, f"run_root={tmp_path}", "generator.tasks_per_step=2",
        "generator.group_size=2", "generator.num_generators=1"])
    timeout_s, rollout_s = 0.5, 2.0
    # The stand-in travels by value: Ray's workers cannot import a test module.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with ray_session(cfg.ray):
        curriculum = ray.remote(num_cpus=0)(CurriculumActor).remote(
            cfg.curriculum, broadcast_timeout_s=timeout_s)
        gen = ray.remote(num_cpus=0)(_SlowGenerator).remote(rollout_s)
        # Running before it registers, as the fleet does (Fleet.wait_ready): register waits
        # only the 0.5 s timeout, which a new actor's process start can take on a loaded machine.
        ray.get(gen.ready.remote())
        ray.get(curriculum.register.remote("gen0", gen))
        trainer = SimpleNamespace(
            cfg=cfg, generators=[gen], curriculum=curriculum, policy_version=0, step_count=0,
            resume_phase=None, fleet=fleet_of([gen]),
            collect=lambda ids: ([_trajectory(i) for i in ids], []),
            ledger=SimpleNamespace(add_dropped=lambda *a: None))
        phase = AsyncPhase(trainer)
        seen = [{t.horizon for t in phase.gather(0).trajs}]
        t0 = time.monotonic()  # the generator is now 0-2 s into its second rollout
        assert ray.get(curriculum.tick.remote(1)) == (3, 1)
        waited = time.monotonic() - t0
        for step in (1, 2):
            trainer.step_count = step  # as the driver counts its steps (the phase's frontier)
            seen.append({t.horizon for t in phase.gather(step).trajs})
        phase.close()
    assert waited < timeout_s, f"the tick waited {waited:.2f}s on a rollout"
    # The rollout in flight at the change keeps its horizon; the next one has the new.
    assert seen == [{2}, {2}, {3}]


@pytest.mark.slow  # a real async run (~40 s); the test above is the fast check
def test_stepwise_change_in_async_training_never_stalls_the_driver(tmp_path, tiny_model_path):
    """Real async training at a stage boundary: slow env steps (0.4 s each) make every
    rollout last several seconds; the step that ticks the horizon takes no longer than its
    rollout, update and weight hand-off (the old tick waited out the rollout in flight)."""
    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.rollout.iteration import make_run_dir
    from horizonrl.cluster.train.driver import Trainer

    slow = ("env.kwargs={env: babyai, env_kwargs: {level: BabyAI-GoToRedBall-v0, reward: "
            "binary}, fault: latency, sleep_s: 0.4}")
    cfg = load_config(ROOT / "configs/babyai-local.yaml", [
        *STEPWISE, "name=async-h", "iterations=3", "metrics.port=0", f"run_root={tmp_path}",
        f"model.path={tiny_model_path}", "env.name=faulty", slow, "env.replicas_per_actor=4",
        "generator.tasks_per_step=2", "generator.group_size=2", "max_staleness=2",
        "learner.minibatches=1", "learner.skip_zero_variance_groups=false"])
    steps = []
    with ray_session(cfg.ray), Trainer(cfg, run_dir=make_run_dir(cfg)) as trainer:
        for _ in range(3):
            t0 = time.monotonic()
            m = trainer.step()
            steps.append((m, time.monotonic() - t0,
                          {t.horizon for t in trainer.last_trajectories}))
    (m0, wall0, _), _, _ = steps
    s = m0["seconds"]
    stall = wall0 - s["rollout"] - s["learn"] - s["weight_sync"]
    print(f"\nstep 0: {wall0:.1f}s wall, {s['rollout']:.1f}s rollout, {s['learn']:.1f}s learn, "
          f"{stall:.2f}s else; horizons per step {[h for *_, h in steps]}")
    assert (m0["horizon"], m0["next_horizon"]) == (2, 3)
    assert stall < 1.5, f"the horizon change stalled the driver {stall:.1f}s"
    # Step 1 trains the rollout that was in flight at the change, step 2 one started after.
    assert [h for *_, h in steps] == [{2}, {2}, {3}]
    assert all(t.num_turns <= 3 for t in trainer.last_trajectories)


def test_a_resumed_phase_trains_its_buffer_and_reissues_the_rollout_in_flight(tmp_path,
                                                                          fleet_of):
    """AsyncPhase restored from a checkpoint's phase state: the buffered trajectories come back
    (and re-enter the ledger as generated), the rollout that was in flight is issued again
    with its own step (so its task seeds and group ids), before the counter goes on."""
    import ray

    from horizonrl.actors.curriculum import CurriculumActor
    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.rollout.iteration import sample_tasks
    from horizonrl.cluster.train.async_phase import AsyncPhase
    from horizonrl.cluster.train.ledger import Ledger

    cfg = load_config(ROOT / "configs/babyai-local.yaml", [
        "mode=async", f"run_root={tmp_path}", "generator.tasks_per_step=2",
        "generator.group_size=2", "generator.num_generators=1", "curriculum.horizons=[2]"])
    buffered = [_trajectory(f"h2/s4-{t.task_id}/{k}") for t in sample_tasks(cfg, 4)
                for k in range(2)]
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ledger = Ledger()
    with ray_session(cfg.ray):
        gen = ray.remote(num_cpus=0)(_SlowGenerator).remote(0.0)
        trainer = SimpleNamespace(
            cfg=cfg, generators=[gen], policy_version=0, step_count=3, ledger=ledger,
            fleet=fleet_of([gen]),
            curriculum=ray.remote(num_cpus=0)(CurriculumActor).remote(cfg.curriculum),
            resume_phase=({"rollouts": 5, "in_flight": [3]}, buffered),
            collect=lambda ids: ([_trajectory(i) for i in ids], []))
        phase = AsyncPhase(trainer)
        first = phase.gather(3).trajs   # the buffer's two groups, oldest first
        trainer.step_count = 4
        second = phase.gather(4).trajs  # then rollout 3 again, same tasks
        state, _ = phase.state()
        phase.close()
    assert [t.trajectory_id for t in first] == [t.trajectory_id for t in buffered]
    assert {t.group_id for t in second} == {f"s3-{t.task_id}" for t in sample_tasks(cfg, 3)}
    assert state["rollouts"] == 6 and state["in_flight"] == [5]  # then the counter went on
    assert {t.trajectory_id for t in buffered} <= ledger.generated
    assert ledger.summary()["resampled_episodes"] == 4
