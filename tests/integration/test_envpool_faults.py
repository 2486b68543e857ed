"""EnvPool against real Ray actors: a killed env actor fails only its episodes (env_error) and
the next acquire gets a healthy replica."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from horizonrl.envpool.config import EnvConfig
from horizonrl.envpool.pool import EnvPool
from horizonrl.envpool.replicas import EnvError

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]


def _sigkill(pid: int) -> None:
    """Kill a process and wait (bounded) until it is gone, so later calls cannot race it."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while psutil.pid_exists(pid) and time.monotonic() < deadline:
        time.sleep(0.1)


def test_killed_replica_actor_fails_its_episode_then_heals():
    import ray

    from horizonrl.cluster.config import RayConfig
    from horizonrl.cluster.ops.runtime import ray_session

    with ray_session(RayConfig(num_cpus=2)):
        pool = EnvPool(EnvConfig(num_actors=2, replicas_per_actor=1, call_timeout_s=30))
        pool.wait_ready()
        a, b = pool.acquire(2)
        assert {a.actor, b.actor} == {0, 1}
        assert all(not isinstance(r, EnvError) for r in pool.reset([a, b], [1, 2]))

        # The replica's process dies mid-episode (SIGKILL, then wait until it is gone, so the
        # step below cannot race the kill).
        _sigkill(ray.get(pool.actors[a.actor].health.remote())["pid"])
        ra, rb = pool.step([a, b], ["turn left", "turn left"])
        assert isinstance(ra, EnvError) and ra.kind == "env_error"
        assert not isinstance(rb, EnvError) and not rb.info["invalid_action"]
        assert pool.restarts == 1
        # A stale slot keeps failing rather than talking to the new actor's fresh env.
        (again,) = pool.step([a], ["turn left"])
        assert isinstance(again, EnvError) and "restarted" in again.message

        pool.release([a, b])
        fresh = pool.acquire(2)
        results = pool.reset(fresh, [3, 4])
        assert all(not isinstance(r, EnvError) for r in results)
        assert all(not isinstance(r, EnvError) for r in pool.step(fresh, ["turn right"] * 2))
        assert all(isinstance(h, dict) for h in pool.health())
        pool.release(fresh)

        # An idle actor that dies between rollouts is found by the health check and replaced
        # before any episode is lent to it.
        _sigkill(ray.get(pool.actors[0].health.remote())["pid"])
        assert pool.heal() == 1 and pool.heal() == 0
        slots = pool.acquire(2)
        assert all(not isinstance(r, EnvError) for r in pool.reset(slots, [7, 8]))
        assert pool.stats()["errors_env_error"] == 2  # only the two episodes hit earlier


def test_hung_step_is_cut_by_the_timeout():
    import ray

    from horizonrl.cluster.config import RayConfig
    from horizonrl.cluster.ops.runtime import ray_session

    with ray_session(RayConfig(num_cpus=2)):
        pool = EnvPool(EnvConfig(num_actors=1, replicas_per_actor=1, call_timeout_s=3))
        pool.wait_ready()
        (slot,) = pool.acquire(1)
        pool.reset([slot], [5])
        pid = ray.get(pool.actors[0].health.remote())["pid"]
        os.kill(pid, signal.SIGSTOP)  # the replica's process stops answering: a hung step
        t0 = time.monotonic()
        (res,) = pool.step([slot], ["move forward"])
        waited = time.monotonic() - t0
        assert isinstance(res, EnvError) and res.kind == "timeout"
        assert 2.5 < waited < 30, waited
        assert pool.restarts == 1
        pool.release([slot])
        (fresh,) = pool.acquire(1)
        assert not isinstance(pool.reset([fresh], [6])[0], EnvError)


def test_a_restarted_actors_slow_start_is_not_taken_for_a_hang(tmp_path):
    """The replacement of a hung actor takes longer to start than one call may take (a JVM or
    browser on a loaded node): its first call waits env.start_timeout_s on top of the call's
    deadline instead of timing out and restarting it again; a start past that is still cut."""
    from horizonrl.cluster.config import RayConfig
    from horizonrl.cluster.ops.runtime import ray_session

    def pool_with(start_timeout_s: float, drill: str) -> EnvPool:
        kwargs = {"env": "babyai", "fault": "sleep", "at_step": 1, "sleep_s": 20,
                  "once_file": str(tmp_path / drill), "start_s": 4}
        return EnvPool(EnvConfig(name="faulty", kwargs=kwargs, num_actors=1,
                                 replicas_per_actor=1, call_timeout_s=2,
                                 start_timeout_s=start_timeout_s))

    with ray_session(RayConfig(num_cpus=2)):
        for start_timeout_s, fresh_reset_ok in ((60, True), (0.5, False)):
            pool = pool_with(start_timeout_s, f"drill-{start_timeout_s}")
            pool.wait_ready(timeout_s=60)  # the first start is setup, not under test
            (slot,) = pool.acquire(1)
            assert not isinstance(pool.reset([slot], [5])[0], EnvError)
            (res,) = pool.step([slot], ["move forward"])  # hangs 20 s: cut at 2 s
            assert isinstance(res, EnvError) and res.kind == "timeout"
            pool.release([slot])
            (fresh,) = pool.acquire(1)
            (got,) = pool.reset([fresh], [6])  # the replacement needs ~4 s to start
            assert isinstance(got, EnvError) is not fresh_reset_ok, got
            assert pool.restarts == (1 if fresh_reset_ok else 2)
            pool.close()
