"""EnvWorker without Ray: recycling every K episodes, per-replica errors, oracle, counters."""

from __future__ import annotations

from horizonrl.envpool.replicas import EnvError, EnvWorker


def test_replica_is_rebuilt_every_k_episodes_and_keeps_its_behaviour():
    worker = EnvWorker("babyai", {"level": "BabyAI-GoToRedBall-v0"}, num_replicas=2,
                       recycle_every=2)
    first = worker.envs[0]
    (obs_a, _), = worker.reset([(0, 7)])
    worker.reset([(0, 8)])
    assert worker.envs[0] is first and worker.stats["recycles"] == 0
    (obs_b, _), = worker.reset([(0, 7)])  # third episode: the replica was rebuilt first
    assert worker.envs[0] is not first and worker.stats["recycles"] == 1
    assert obs_b == obs_a  # a rebuilt replica gives the same task for the same seed
    assert worker.envs[1] is not None and worker.episodes == [1, 0]
    worker.close()


def test_no_recycling_by_default_and_counters_and_oracle():
    worker = EnvWorker("babyai", {}, num_replicas=1)
    env = worker.envs[0]
    for seed in range(5):
        worker.reset([(0, seed)])
    assert worker.envs[0] is env and worker.stats["resets"] == 5
    (action,) = worker.oracle([(0, None)])
    (res,) = worker.step([(0, action)])
    assert not isinstance(res, EnvError) and not res.info["invalid_action"]
    health = worker.health()
    assert health["steps"] == 1 and health["rss_bytes"] > 0 and health["errors"] == 0
    worker.close()


def test_a_broken_replica_fails_alone():
    worker = EnvWorker("babyai", {}, num_replicas=2)
    worker.reset([(0, 1), (1, 2)])
    worker.envs[0].step = None  # this replica now raises on step
    bad, good = worker.step([(0, "turn left"), (1, "turn left")])
    assert isinstance(bad, EnvError) and bad.kind == "env_error"
    assert not isinstance(good, EnvError)
    assert worker.stats["errors"] == 1


def test_a_replica_that_raised_is_rebuilt_before_its_next_reset():
    worker = EnvWorker("babyai", {}, num_replicas=2)
    worker.reset([(0, 1), (1, 2)])
    broken, other = worker.envs
    broken.step = None  # raises on step, as an env whose JVM or browser died does
    bad, _ = worker.step([(0, "turn left"), (1, "turn left")])
    assert isinstance(bad, EnvError)
    first, second = worker.reset([(0, 3), (1, 4)])
    assert not isinstance(first, EnvError) and not isinstance(second, EnvError)
    assert worker.envs[0] is not broken and worker.envs[1] is other
    assert worker.stats["rebuilds"] == 1 and worker.stats["recycles"] == 0
    (res,) = worker.step([(0, "turn left")])
    assert not isinstance(res, EnvError)
    worker.close()
