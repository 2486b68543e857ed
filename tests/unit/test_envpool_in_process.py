"""`env.in_process`: the pool's EnvWorkers live in the calling process (no Ray), with the same
results as the envs driven directly, the same per-episode failure marking, and the same deadline
on a hung step."""

from __future__ import annotations

import time

from horizonrl.envpool.config import EnvConfig
from horizonrl.envpool.pool import EnvPool
from horizonrl.envpool.registry import make_env
from horizonrl.envpool.replicas import EnvError

BABYAI = {"level": "BabyAI-GoToRedBall-v0", "reward": "binary"}


def test_same_observations_as_the_envs_driven_directly():
    pool = EnvPool(EnvConfig(kwargs=BABYAI, num_actors=2, replicas_per_actor=2, in_process=True))
    pool.wait_ready()
    slots = pool.acquire(4)
    assert sorted({s.actor for s in slots}) == [0, 1]
    seeds, actions = [11, 12, 13, 14], ["turn left", "go forward", "turn right", "turn left"]
    got_reset = pool.reset(slots, seeds)
    got_step = pool.step(slots, actions)
    for seed, action, (obs, _), res in zip(seeds, actions, got_reset, got_step):
        env = make_env("babyai", **BABYAI)
        want_obs, _ = env.reset(seed=seed)
        want = env.step(action)
        assert obs == want_obs and res.observation == want.observation
        assert res.reward == want.reward and res.terminated == want.terminated
    assert pool.node_ips() == ["127.0.0.1", "127.0.0.1"]  # outside Ray
    assert pool.heal() == 0 and all(isinstance(h, dict) for h in pool.health())
    assert pool.stats()["steps"] == 4 and pool.stats()["restarts"] == 0
    pool.release(slots)
    pool.close()


def test_a_hung_step_fails_only_its_episode_by_the_deadline(tmp_path):
    # Two workers, one replica each; the first step in this process sleeps 3 s (once).
    faulty = {"env": "babyai", "env_kwargs": BABYAI, "fault": "sleep", "at_step": 1,
              "sleep_s": 3.0, "once_file": str(tmp_path / "fired")}
    pool = EnvPool(EnvConfig(name="faulty", kwargs=faulty, num_actors=2, replicas_per_actor=1,
                             call_timeout_s=1.0, in_process=True))
    a, b = pool.acquire(2)
    assert all(not isinstance(r, EnvError) for r in pool.reset([a, b], [1, 2]))
    t0 = time.monotonic()
    results = pool.step([a, b], ["turn left", "turn left"])  # on two threads at once
    assert time.monotonic() - t0 < 2.5  # cut at the 1 s deadline, not the 3 s sleep
    failed = [slot for slot, r in zip([a, b], results) if isinstance(r, EnvError)]
    assert len(failed) == 1, results  # whichever stepped first hung; the other finished
    assert next(r for r in results if isinstance(r, EnvError)).kind == "timeout"
    assert pool.restarts == 1
    (again,) = pool.step(failed, ["turn left"])  # its replica was rebuilt: the slot is stale
    assert isinstance(again, EnvError) and "restarted" in again.message
    pool.release([a, b])
    fresh = pool.acquire(2)
    assert all(not isinstance(r, EnvError) for r in pool.reset(fresh, [3, 4]))
    assert all(not isinstance(r, EnvError) for r in pool.step(fresh, ["turn right"] * 2))
    assert pool.stats()["errors_timeout"] == 1
    pool.close()


def test_two_workers_hung_in_one_call_are_both_rebuilt():
    # Without a once_file every step sleeps: both workers pass the deadline in the same call,
    # as two slow steps do on a loaded machine. Each is rebuilt once, and the pool goes on.
    hung = {"env": "babyai", "env_kwargs": BABYAI, "fault": "sleep", "at_step": 1,
            "sleep_s": 3.0}
    pool = EnvPool(EnvConfig(name="faulty", kwargs=hung, num_actors=2, replicas_per_actor=1,
                             call_timeout_s=0.5, in_process=True))
    slots = pool.acquire(2)
    assert all(not isinstance(r, EnvError) for r in pool.reset(slots, [1, 2]))
    results = pool.step(slots, ["turn left", "turn left"])
    assert [r.kind for r in results if isinstance(r, EnvError)] == ["timeout", "timeout"]
    assert pool.restarts == 2 and pool.stats()["errors_timeout"] == 2
    pool.release(slots)
    fresh = pool.acquire(2)
    assert all(not isinstance(r, EnvError) for r in pool.reset(fresh, [3, 4]))
    pool.release(fresh)
    pool.close()


def test_an_env_that_raises_fails_only_its_episode():
    faulty = {"env": "babyai", "env_kwargs": BABYAI, "fault": "raise", "at_step": 1}
    pool = EnvPool(EnvConfig(name="faulty", kwargs=faulty, num_actors=1, replicas_per_actor=1,
                             in_process=True))
    good = EnvPool(EnvConfig(kwargs=BABYAI, num_actors=1, replicas_per_actor=1, in_process=True))
    (s,), (g,) = pool.acquire(1), good.acquire(1)
    pool.reset([s], [1])
    good.reset([g], [1])
    (bad,) = pool.step([s], ["turn left"])
    (ok,) = good.step([g], ["turn left"])
    assert isinstance(bad, EnvError) and bad.kind == "env_error" and "injected" in bad.message
    assert not isinstance(ok, EnvError)
