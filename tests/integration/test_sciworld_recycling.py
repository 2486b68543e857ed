"""SciWorld's JVMs grow over episodes; pool recycling keeps their memory bounded.

A soak (`make test-soak`, not in CI's slow set): 200 episodes through a real pool (2 replicas
in one Ray actor), sampling the RSS of the actor's child processes (the JVMs) as it goes; the
target runs with `-s`, which prints the numbers.
"""

from __future__ import annotations

import os
import random

import pytest

from horizonrl.envpool.config import EnvConfig
from horizonrl.envpool.pool import EnvPool
from horizonrl.envpool.registry import env_spec
from horizonrl.envpool.replicas import EnvError

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.soak,
              pytest.mark.usefixtures("shared_ray")]

EPISODES = int(os.environ.get("HORIZONRL_SCIWORLD_EPISODES", "200"))
STEPS = 4  # random actions per episode after reset
RECYCLE = 20


def _run(pool: EnvPool, episodes: int) -> list[float]:
    """RSS of the actor's children (MB) sampled after every 10 episodes per replica."""
    import ray

    spec, rng = env_spec("sciworld"), random.Random(0)
    slots = pool.acquire(2)
    samples = []
    for ep in range(0, episodes, 2):
        firsts = pool.reset(slots, [ep, ep + 1])
        assert not any(isinstance(r, EnvError) for r in firsts), firsts
        infos = [info for _, info in firsts]
        for _ in range(STEPS):
            results = pool.step(slots, [spec.random_action(i, rng) for i in infos])
            assert not any(isinstance(r, EnvError) for r in results), results
            infos = [r.info for r in results]
        if (ep // 2) % 10 == 9:
            health = ray.get(pool.actors[0].health.remote())
            samples.append(health["children_rss_bytes"] / 2**20)
            print(f"  episode {ep + 2}: JVM RSS {samples[-1]:.0f} MB "
                  f"({health['children']} processes, {health['recycles']} recycles)", flush=True)
    pool.release(slots)
    return samples


def test_recycling_bounds_jvm_memory():
    from horizonrl.cluster.config import RayConfig
    from horizonrl.cluster.ops.runtime import ray_session

    kwargs = {"tasks": ["find-animal", "use-thermometer"], "jvm_heap_mb": 512}
    with ray_session(RayConfig(num_cpus=2)):
        pool = EnvPool(EnvConfig(name="sciworld", kwargs=kwargs, num_actors=1,
                                 replicas_per_actor=2, recycle_every_episodes=RECYCLE,
                                 call_timeout_s=300))
        pool.wait_ready(timeout_s=300)
        print(f"\nSciWorld, 2 replicas, recycle every {RECYCLE} episodes, {EPISODES} episodes:")
        samples = _run(pool, EPISODES)
    assert len(samples) >= 4
    first, peak = samples[0], max(samples)
    quarter = max(1, len(samples) // 4)
    early = sum(samples[:quarter]) / quarter
    late = sum(samples[-quarter:]) / quarter
    print(f"  first {first:.0f} MB, peak {peak:.0f} MB, early mean {early:.0f} MB, "
          f"late mean {late:.0f} MB")
    # Bounded: the late samples are no higher than the early ones beyond noise, and nothing ever
    # approaches two full 512 MB heaps plus JVM overhead.
    assert late <= early * 1.25 + 50
    assert peak < 2 * (512 + 400)
