"""The curriculum actor with 2 real generator actors: a horizon change, a restart, the bound."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ONE_RANK, SUITE_MODEL

from horizonrl.cluster.config import load_config

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]
ROOT = Path(__file__).resolve().parents[2]


def test_horizon_reaches_both_generators_and_a_restarted_one(tmp_path, capsys):
    import ray

    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.rollout.iteration import make_run_dir
    from horizonrl.cluster.train.driver import Trainer

    cfg = load_config(ROOT / "configs/babyai-local.yaml", [
        *SUITE_MODEL, ONE_RANK,
        "name=bcast", "iterations=3", "metrics.port=0",
        f"run_root={tmp_path}", "generator.num_generators=2",
        "generator.tasks_per_step=4", "generator.group_size=2", "env.replicas_per_actor=8",
        "curriculum.horizons=[2, 4]", "curriculum.boundaries=[1]", "learner.minibatches=1",
    ])
    from horizonrl.cluster.cli import main as cli

    run_dir = make_run_dir(cfg)
    with ray_session(cfg.ray), Trainer(cfg, run_dir=run_dir) as trainer:
        horizons = lambda: [ray.get(g.health.remote())["horizon"]  # noqa: E731
                            for g in trainer.generators]
        assert horizons() == [2, 2]
        m0 = trainer.step()
        assert (m0["horizon"], m0["next_horizon"]) == (2, 4)
        # The tick called no generator; the new horizon rides with each one's next rollout.
        assert horizons() == [2, 2]
        assert ray.get(trainer.curriculum.setting.remote()).horizon == 4
        trainer.step()
        assert horizons() == [4, 4]
        step1 = trainer.last_trajectories
        assert {t.horizon for t in step1} == {4}
        assert {t.info["generator"] for t in step1} == {"gen0", "gen1"}

        ray.kill(trainer.generators[1], no_restart=True)
        m2 = trainer.step()  # finds gen1 dead, restarts it, re-runs its share
        assert m2["generator_restarts"] == 1
        assert horizons() == [4, 4]
        assert ray.get(trainer.generators[1].get_policy_version.remote()) == 3
        # The replacement holds the fleet's version, as the generator that lived on does.
        assert trainer.fleet.versions() == trainer.fleet.held == [trainer.policy_version] * 2
        step2 = trainer.last_trajectories
        assert len(step2) == 8 and {t.info["generator"] for t in step2} == {"gen0", "gen1"}
        for t in step1 + step2:
            assert t.num_turns <= t.horizon == 4

        # `horizonrl status` against the live run reads the figures the driver exports.
        capsys.readouterr()
        assert cli(["status", str(run_dir)]) == 0
        out = capsys.readouterr().out
        assert "step 3 | horizon 4 | policy_version 3" in out
        assert "generator restarts 1" in out


def test_per_env_horizons_reach_the_generator_and_bound_each_env(tmp_path):
    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.rollout.iteration import make_run_dir
    from horizonrl.cluster.train.driver import Trainer

    cfg = load_config(ROOT / "configs/babyai-local.yaml", [
        *SUITE_MODEL, ONE_RANK,
        "name=envh", "iterations=2", "metrics.port=0", f"run_root={tmp_path}",
        "generator.tasks_per_step=6", "generator.group_size=2", "env.replicas_per_actor=12",
        'extra_envs=[{name: deepsearch, kwargs: {hops: [2]}, replicas_per_actor: 12}]',
        "curriculum.horizons=[3, 5]", "curriculum.boundaries=[1]",
        "curriculum.env_horizons={deepsearch: [1, 2]}", "learner.minibatches=1"])
    with ray_session(cfg.ray), Trainer(cfg, run_dir=make_run_dir(cfg)) as trainer:
        seen = []
        for _ in range(2):
            m = trainer.step()
            by_env = {}
            for t in trainer.last_trajectories:
                by_env.setdefault(t.env_name, set()).add(t.horizon)
                assert t.num_turns <= t.horizon
            seen.append((m["horizon"], by_env, m["env"]["deepsearch"]["horizon"]))
    (h0, envs0, ds0), (h1, envs1, ds1) = seen
    assert h0 == 3 and envs0.get("babyai", {3}) == {3} and envs0.get("deepsearch", {1}) == {1}
    assert h1 == 5 and envs1.get("babyai", {5}) == {5} and envs1.get("deepsearch", {2}) == {2}
    assert "deepsearch" in envs0 | envs1 and "babyai" in envs0 | envs1
    assert ds0 in (0, 1) and ds1 in (0, 2)


@pytest.mark.slow  # a whole training for the split that tests/unit/test_generator_waves.py checks
def test_more_episodes_than_replicas_run_in_waves(tmp_path):
    """An env pool smaller than a step's episodes (a weighted draw can give one env most of a
    step's groups) runs them in consecutive waves instead of failing; every episode arrives."""
    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.rollout.iteration import make_run_dir
    from horizonrl.cluster.train.driver import Trainer

    cfg = load_config(ROOT / "configs/babyai-local.yaml", [
        *SUITE_MODEL, ONE_RANK,
        "name=waves", "iterations=1", "metrics.port=0", f"run_root={tmp_path}",
        "generator.tasks_per_step=5", "generator.group_size=2", "env.replicas_per_actor=4",
        "curriculum.horizons=[3]", "learner.minibatches=1"])
    with ray_session(cfg.ray), Trainer(cfg, run_dir=make_run_dir(cfg)) as trainer:
        trainer.step()
        trajs = trainer.last_trajectories
    groups: dict[str, int] = {}
    for t in trajs:
        groups[t.group_id] = groups.get(t.group_id, 0) + 1
    assert len(trajs) == 10 and len(groups) == 5 and set(groups.values()) == {2}
    assert len({t.trajectory_id for t in trajs}) == 10
