"""MiniWoB through a real EnvPool (one Ray actor, two replicas, real headless Chromium) and
through `horizonrl env-server` + AgentGymHTTPEnv: a browser killed mid-episode costs one
episode (env_error) and the replica comes back, a hung page is cut by the call timeout with no
browser left behind, experts solve and a random agent mostly fails eval seeds over HTTP; slow:
the same through the pool on 24 eval seeds per task (8 for the random agent); soak (`make
test-soak`, not in CI): 200 episodes with recycling keep the browsers' memory bounded.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from horizonrl.envpool.base import EVAL_SEED_OFFSET
from horizonrl.envpool.config import EnvConfig
from horizonrl.envpool.miniwob import format_action, parse_action, random_action
from horizonrl.envpool.miniwob_tasks import TASKS
from horizonrl.envpool.pool import EnvPool
from horizonrl.envpool.replicas import EnvError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600),
              pytest.mark.usefixtures("shared_ray")]

PER_TASK = 24  # eval instances per task through the pool; one expert failure in 24 passes 0.95
# The random agent's bar is on its mean over all tasks (120 episodes), and its 5-turn episodes
# took 64% of this test's time at 24 a task: 8 a task keep the bar's meaning for a third of it.
RANDOM_PER_TASK = 8
RANDOM_TURNS = 5
HORIZONRL = Path(sys.executable).parent / "horizonrl"


def _pool(**kwargs) -> EnvPool:
    cfg = {"name": "miniwob", "num_actors": 1, "replicas_per_actor": 2, "call_timeout_s": 30,
           "kwargs": {}} | kwargs
    pool = EnvPool(EnvConfig(**cfg))
    pool.wait_ready(timeout_s=120)
    return pool


def _ok(results: list) -> list:
    assert not any(isinstance(r, EnvError) for r in results), results
    return results


def _episodes(pool: EnvPool, seeds: list[int], *, agent: str, max_turns: int) -> list[tuple]:
    """(task, success, turns) per seed, two episodes side by side on the pool's replicas."""
    slots, rng, out = pool.acquire(2), random.Random(0), []
    for i in range(0, len(seeds), 2):
        batch = slots[: len(seeds[i : i + 2])]
        infos = [info for _, info in _ok(pool.reset(batch, seeds[i : i + 2]))]
        live, turns = list(range(len(batch))), [0] * len(batch)
        for _ in range(max_turns):
            if agent == "oracle":
                actions = _ok(pool.oracle([batch[j] for j in live]))
            else:
                actions = [random_action(infos[j], rng) for j in live]
            results = _ok(pool.step([batch[j] for j in live],
                                    [parse_action(format_action(a)) for a in actions]))
            for j, r in zip(live, results):
                infos[j], turns[j] = r.info, turns[j] + 1
            live = [j for j, r in zip(live, results) if not (r.terminated or r.truncated)]
            if not live:
                break
        out += [(infos[j]["task"], infos[j]["success"], turns[j]) for j in range(len(batch))]
    pool.release(slots)
    return out


def _per_task(rows: list[tuple]) -> dict[str, tuple[float, float]]:
    """Per task: (success rate, mean turns)."""
    table = {}
    for task in TASKS:
        mine = [r for r in rows if r[0] == task]
        table[task] = (sum(r[1] for r in mine) / len(mine), sum(r[2] for r in mine) / len(mine))
    return table


def _experts_and_random(per_task: int, random_per_task: int) -> None:
    seeds = [EVAL_SEED_OFFSET + i for i in range(per_task * len(TASKS))]
    pool = _pool()
    try:
        started = time.perf_counter()
        oracle = _per_task(_episodes(pool, seeds, agent="oracle", max_turns=10))
        rand = _per_task(_episodes(pool, seeds[: random_per_task * len(TASKS)], agent="random",
                                   max_turns=RANDOM_TURNS))
        print(f"\n{per_task} eval seeds per task through the pool for the expert, "
              f"{random_per_task} for the random agent ({time.perf_counter() - started:.0f} s):")
        for task in TASKS:
            print(f"  {task:22s} oracle {oracle[task][0]:.2f} in {oracle[task][1]:.1f} turns, "
                  f"random ({RANDOM_TURNS} turns) {rand[task][0]:.2f}")
        mean_rand = sum(r[0] for r in rand.values()) / len(rand)
        print(f"  random agent overall: {mean_rand:.2f}; pool stats {pool.stats()}")
    finally:
        pool.close()
    assert all(success >= 0.95 for success, _ in oracle.values()), oracle
    assert mean_rand <= 0.45  # the 1-element tasks (focus-text, click-dialog) are free wins


# 480 browser episodes (177 s in the slow set on 2 cores; at 720 it took 431 s beside a
# loaded worker): with the slow set. The default suite checks every task's expert and the
# random agent on eval seeds in the env itself (tests/unit/test_miniwob_env.py), and the
# expert through this pool in the killed-browser and hung-page tests below.
@pytest.mark.slow
def test_experts_solve_eval_tasks_and_a_random_agent_does_not():
    _experts_and_random(PER_TASK, RANDOM_PER_TASK)


def _browsers(pool: EnvPool) -> list[psutil.Process]:
    """The actor's chromium main processes (children of its chromedrivers)."""
    import ray

    pid = ray.get(pool.actors[0].health.remote())["pid"]
    return [k for d in psutil.Process(pid).children() if d.name() == "chromedriver"
            for k in d.children() if k.name() == "chromium"]


def _descendants(pool: EnvPool) -> list[psutil.Process]:
    import ray

    return psutil.Process(ray.get(pool.actors[0].health.remote())["pid"]).children(recursive=True)


def _gone(procs: list[psutil.Process], within_s: float = 10) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.2)
    return False


def test_a_killed_browser_fails_its_episode_and_the_replica_comes_back():
    pool = _pool(kwargs={"tasks": ["click-checkboxes"]})
    try:
        slots = pool.acquire(2)
        _ok(pool.reset(slots, [EVAL_SEED_OFFSET, EVAL_SEED_OFFSET + 1]))
        browsers = _browsers(pool)
        assert len(browsers) == 2
        os.kill(browsers[0].pid, signal.SIGKILL)
        assert _gone(browsers[:1])
        results = pool.step(slots, _ok(pool.oracle(slots)))
        failed = [r for r in results if isinstance(r, EnvError)]
        assert len(failed) == 1 and failed[0].kind == "env_error"
        assert pool.restarts == 0  # the actor lives on; only the browser is replaced
        pool.release(slots)
        rows = _episodes(pool, [EVAL_SEED_OFFSET + 2, EVAL_SEED_OFFSET + 3], agent="oracle",
                         max_turns=10)
        assert all(success for _, success, _ in rows)
        assert len(_browsers(pool)) == 2
        # The worker rebuilt the replica that raised (a fresh env, a fresh browser).
        import ray

        assert ray.get(pool.actors[0].health.remote())["rebuilds"] == 1
    finally:
        pool.close()


def test_a_hung_page_is_cut_by_the_call_timeout_and_leaves_no_browser():
    pool = _pool(call_timeout_s=8, kwargs={"tasks": ["click-button"], "allow_script": True})
    try:
        slots = pool.acquire(2)
        _ok(pool.reset(slots, [0, 1]))
        old = _descendants(pool)
        assert len(old) >= 6  # two chromedrivers, two browsers and their helpers
        started = time.monotonic()
        results = pool.step(slots, ["script while (true) {}", "click [4]"])
        assert time.monotonic() - started < 20
        assert all(isinstance(r, EnvError) and r.kind == "timeout" for r in results)
        assert pool.restarts == 1
        assert _gone(old), [p.pid for p in old if p.is_running()]  # the watchdogs killed them
        pool.release(slots)
        rows = _episodes(pool, [EVAL_SEED_OFFSET, EVAL_SEED_OFFSET + 1], agent="oracle",
                         max_turns=5)
        assert all(success for _, success, _ in rows)
    finally:
        pool.close()


def test_experts_and_random_through_env_server(free_port, tmp_path):
    from horizonrl.envpool.agentgym_http import AgentGymHTTPEnv
    from horizonrl.envpool.agentgym_http import random_action as http_random

    tasks = ["click-test-2", "enter-text", "click-checkboxes", "navigate-tree"]
    port, log = free_port(), tmp_path / "server.log"
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(HORIZONRL), "env-server", "--env", "miniwob", "--port",
                                 str(port), "--kwargs", json.dumps({"tasks": tasks})],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while f"serving miniwob at {url}" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        seeds = range(EVAL_SEED_OFFSET, EVAL_SEED_OFFSET + 3 * len(tasks))
        rng, wins = random.Random(0), {"oracle": 0, "random": 0}
        with AgentGymHTTPEnv(url, timeout_s=30) as env:
            for agent in wins:
                for seed in seeds:
                    _, info = env.reset(seed=seed)
                    for _ in range(10 if agent == "oracle" else RANDOM_TURNS):
                        action = env.oracle_action() if agent == "oracle" else \
                            http_random(info, rng)
                        result = env.step(parse_action(format_action(action)))
                        info = result.info
                        if result.terminated or result.truncated:
                            break
                    wins[agent] += bool(info["success"])
        print(f"\nover HTTP, {len(seeds)} eval seeds: {wins}")
        assert wins["oracle"] == len(seeds) and wins["random"] <= len(seeds) // 2
    finally:
        kids = psutil.Process(proc.pid).children(recursive=True)
        proc.terminate()
        proc.wait(timeout=30)
        assert _gone(kids), "env-server left browsers behind"


@pytest.mark.slow
@pytest.mark.soak
def test_recycling_bounds_browser_memory():
    """200 episodes of random play on 2 replicas, browsers recycled every 20 episodes; the
    RSS of the actor's children (chromedrivers and browsers) is sampled every 20 episodes."""
    import ray

    episodes, recycle = 200, 20
    pool = _pool(kwargs={"recycle_every": recycle})
    samples = []
    try:
        slots, rng = pool.acquire(2), random.Random(0)
        print(f"\nMiniWoB, 2 replicas, recycle every {recycle} episodes, {episodes} episodes:")
        for ep in range(0, episodes, 2):
            infos = [info for _, info in _ok(pool.reset(slots, [ep, ep + 1]))]
            for _ in range(4):
                infos = [r.info for r in _ok(pool.step(slots, [random_action(i, rng)
                                                               for i in infos]))]
            if (ep // 2) % 10 == 9:
                health = ray.get(pool.actors[0].health.remote())
                samples.append(health["children_rss_bytes"] / 2**20)
                print(f"  episode {ep + 2}: browsers' RSS {samples[-1]:.0f} MB "
                      f"({health['children']} processes)", flush=True)
        pool.release(slots)
    finally:
        pool.close()
    quarter = max(1, len(samples) // 4)
    early, late = sum(samples[:quarter]) / quarter, sum(samples[-quarter:]) / quarter
    print(f"  first {samples[0]:.0f} MB, peak {max(samples):.0f} MB, early mean {early:.0f} MB, "
          f"late mean {late:.0f} MB")
    assert late <= early * 1.25 + 50
    assert max(samples) < 2 * 1200  # two browsers; one measured ~0.9 GB summed over processes
