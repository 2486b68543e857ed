"""Scripted and random agents through the real env pool (Ray actors), and through
`horizonrl env-server` + `AgentGymHTTPEnv`, for every environment.

Each agent talks the way the model does: the action goes through the env's `format_action`
(the reply text) and back through its `parse_action` before the pool steps it. The scripted
agent's action comes from the replica itself (`oracle_action()`, run in the env actor, or via the
env server's `/oracle` extension); the random agent draws from the info it got back.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest

from horizonrl.envpool.base import EVAL_SEED_OFFSET
from horizonrl.envpool.config import EnvConfig
from horizonrl.envpool.pool import EnvPool
from horizonrl.envpool.registry import EnvSpec, env_spec
from horizonrl.envpool.replicas import EnvError

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]


@dataclass(frozen=True)
class Case:
    """One environment's agent test: how many eval tasks, the turn cap, the success bars."""

    env: str
    kwargs: dict = field(default_factory=dict)
    tasks: int = 20
    max_turns: int = 30
    random_turns: int | None = None  # the random agent's cap when it differs (see BabyAI)
    oracle_min: float = 0.9
    random_max: float = 0.3
    marks: tuple = ()


CASES = [
    # The BabyAI bot moves one primitive step per turn, while a random agent can draw a
    # high-level `go to X` / `pick up X` that walks many steps: the random agent gets the turn
    # budget a model gets in training (5), the bot as many primitive steps as it needs.
    Case("babyai", {"level": "BabyAI-PickupLoc-v0", "reward": "binary"}, tasks=20,
         max_turns=60, random_turns=5, random_max=0.3),
    # Depth-1 goals (one `get`, one `craft`) are near free for a random agent: 2-4 only here.
    Case("textcraft", {"depths": [2, 3, 4]}, tasks=40, max_turns=40, random_max=0.2),
    Case("deepsearch", {}, tasks=40, max_turns=12, random_max=0.1),
    Case("sciworld", {}, tasks=10, max_turns=60, random_max=0.3, marks=(pytest.mark.slow,)),
]


def run_agent(pool: EnvPool, spec: EnvSpec, policy: str, case: Case) -> float:
    """Success rate of `policy` ("oracle" | "random") on `case.tasks` eval tasks, all episodes in
    lock-step through the pool (one batched call per turn), like the generator does. `spec` is
    the env whose reply format and parser the agent uses."""
    rng = random.Random(0)
    slots = pool.acquire(case.tasks)
    try:
        seeds = [EVAL_SEED_OFFSET + i for i in range(case.tasks)]
        firsts = pool.reset(slots, seeds)
        assert not any(isinstance(r, EnvError) for r in firsts), firsts
        infos = [info for _, info in firsts]
        done, success = [False] * len(slots), [False] * len(slots)
        cap = case.random_turns if policy == "random" and case.random_turns else case.max_turns
        for _ in range(cap):
            live = [i for i in range(len(slots)) if not done[i]]
            if not live:
                break
            if policy == "oracle":
                actions = pool.oracle([slots[i] for i in live])
                assert not any(isinstance(a, EnvError) for a in actions), actions
            else:
                actions = [spec.random_action(infos[i], rng) for i in live]
            # The model's path: reply text -> parser -> env.
            parsed = [spec.parse_action(spec.format_action(a)) for a in actions]
            results = pool.step([slots[i] for i in live], parsed)
            for i, res in zip(live, results):
                assert not isinstance(res, EnvError), res
                infos[i] = res.info
                success[i] = bool(res.info.get("success"))
                done[i] = res.terminated or res.truncated
        return sum(success) / len(slots)
    finally:
        pool.release(slots)


def _pool(name: str, kwargs: dict, tasks: int) -> EnvPool:
    cfg = EnvConfig(name=name, kwargs=kwargs, num_actors=1, replicas_per_actor=tasks,
                    num_cpus_per_actor=0.5, call_timeout_s=120)
    pool = EnvPool(cfg, name=f"test-{name}")
    pool.wait_ready()
    return pool


@pytest.mark.parametrize("case", [pytest.param(c, id=c.env, marks=c.marks) for c in CASES])
def test_scripted_and_random_agents_through_the_pool(case: Case):
    pool = _pool(case.env, case.kwargs, case.tasks)
    oracle = run_agent(pool, env_spec(case.env), "oracle", case)
    rnd = run_agent(pool, env_spec(case.env), "random", case)
    print(f"\n[{case.env}] pool: oracle success {oracle:.2f}, random {rnd:.2f} "
          f"on {case.tasks} eval tasks, cap {case.max_turns} turns")
    assert oracle >= case.oracle_min
    assert rnd <= case.random_max
    assert pool.stats()["errors_env_error"] == 0


class EnvServer:
    """`horizonrl env-server` in a subprocess on a free loopback port."""

    def __init__(self, env: str, kwargs: dict, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "horizonrl.cluster.cli", "env-server", "--env", env, "--host",
             "127.0.0.1", "--port", str(port), "--kwargs", json.dumps(kwargs),
             "--max-envs", "256"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        import httpx

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"env-server exited: {self.proc.stderr.read()[-2000:]}")
            try:
                if httpx.get(self.url + "/", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.5)
        self.close()
        raise TimeoutError(f"env-server for {env} did not answer within 120 s")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.mark.parametrize("case", [pytest.param(c, id=c.env, marks=c.marks) for c in CASES])
def test_same_agents_through_the_agentgym_http_protocol(case: Case, free_port):
    """Served by `horizonrl env-server`, reached by pool replicas of `AgentGymHTTPEnv`; the
    agents still use the served env's own format and parser, as a model trained on it would."""
    server = EnvServer(case.env, case.kwargs, free_port())
    try:
        pool = _pool("agentgym", {"url": server.url}, case.tasks)
        served = env_spec(case.env)
        oracle = run_agent(pool, served, "oracle", case)
        rnd = run_agent(pool, served, "random", case)
        print(f"\n[{case.env}] http: oracle success {oracle:.2f}, random {rnd:.2f}")
        assert oracle >= case.oracle_min
        assert rnd <= case.random_max
    finally:
        server.close()
