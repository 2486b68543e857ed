"""`horizonrl env-server` in a real subprocess on 127.0.0.1, driven through AgentGymHTTPEnv:
BabyAI's oracle solves eval tasks and a random agent mostly does not, malformed actions are
harmless, bad requests get 4xx, and a restarted or absent server gives defined outcomes."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx
import pytest

from horizonrl.envpool.agentgym_http import (
    AgentGymConnectionError,
    AgentGymEnvLostError,
    AgentGymHTTPEnv,
    format_action,
    parse_action,
    random_action,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

HORIZONRL = Path(sys.executable).parent / "horizonrl"
LEVEL = '{"level": "BabyAI-PickupLoc-v0"}'
EVAL_SEEDS = range(1_000_000, 1_000_020)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(port: int, log: IO[bytes]) -> subprocess.Popen:
    return subprocess.Popen(
        [str(HORIZONRL), "env-server", "--env", "babyai", "--port", str(port), "--kwargs", LEVEL],
        stdout=log, stderr=subprocess.STDOUT,
    )


def _wait_healthy(proc: subprocess.Popen, url: str, log: Path) -> None:
    for _ in range(300):  # 30 s at most
        if proc.poll() is not None:
            pytest.fail(f"env-server exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    pytest.fail(f"env-server not healthy after 30 s:\n{log.read_text()}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port, log = _free_port(), tmp_path_factory.mktemp("env-server") / "server.log"
    with log.open("wb") as out:
        proc = _start(port, out)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(proc, url, log)
            assert f"serving babyai at {url}" in log.read_text()
            yield url
        finally:
            _stop(proc)


def _success_rate(url: str, choose, *, max_turns: int) -> float:
    wins = 0
    rng = random.Random(0)
    with AgentGymHTTPEnv(url, timeout_s=10) as env:
        for seed in EVAL_SEEDS:
            _, info = env.reset(seed=seed)
            for _ in range(max_turns):
                result = env.step(parse_action(format_action(choose(env, info, rng))))
                info = result.info
                if result.terminated or result.truncated:
                    break
            wins += bool(info["success"])
    return wins / len(EVAL_SEEDS)


def test_oracle_solves_eval_tasks_and_a_random_agent_does_not(server):
    oracle = _success_rate(server, lambda env, info, rng: env.oracle_action(), max_turns=200)
    rand = _success_rate(server, lambda env, info, rng: random_action(info, rng), max_turns=5)
    print(f"over HTTP, {len(EVAL_SEEDS)} eval seeds: oracle {oracle:.2f}, random (5 turns) "
          f"{rand:.2f}")
    assert oracle >= 0.9
    assert rand <= oracle - 0.3


def test_malformed_actions_are_invalid_and_the_server_stays_healthy(server):
    rng = random.Random(0)
    fixed = ["", " ", "\n\n", "x" * 1_000_000, "go to", "\x00\x07\x1b[2J", "\ud800", "🙂",
             "Action:", '{"id": 0}', "turn left" * 2_000]
    with AgentGymHTTPEnv(server) as env:
        obs, _ = env.reset(seed=1_000_000)
        for i in range(1000):
            if i < len(fixed):
                action = fixed[i]
            else:
                raw = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
                action = raw.decode("utf-8", errors="replace")
            result = env.step(action)
            assert result.info["invalid_action"], repr(action)
            assert result.observation.startswith("Invalid action") and obs in result.observation
            assert result.reward == 0.0 and not result.terminated
        assert env.observation().endswith(obs)  # the last answer's text: nothing moved
        assert not env.step(env.oracle_action()).info["invalid_action"]
    assert httpx.get(f"{server}/", timeout=5).json()["status"] == "ok"


def test_bad_requests_get_4xx(server):
    with httpx.Client(base_url=server, timeout=10) as c:
        env_id = c.post("/create").json()["id"]
        c.post("/reset", json={"id": env_id, "data_idx": 1_000_001})
        assert c.post("/step", json={"id": env_id + 1, "action": "a"}).status_code == 404
        assert c.get("/observation", params={"id": env_id + 1}).status_code == 404
        assert c.post("/step", json={"id": env_id, "action": "x" * 20_000}).status_code == 413
        assert c.post("/step", content=b"x" * 400_000).status_code == 413  # refused unread
        assert c.post("/step", content=b"{oops", headers={"content-type": "application/json"}
                      ).status_code == 422
        assert c.post("/step", json={"id": str(env_id), "action": "a"}).status_code == 422
        assert c.post("/step", json={"id": env_id, "action": "turn left"}).status_code == 200
        assert c.post("/close", json={"id": env_id}).status_code == 200
        assert c.post("/close", json={"id": env_id}).status_code == 404
        assert c.get("/").status_code == 200


def test_restarted_server_step_fails_clearly_and_reset_recovers(tmp_path):
    """The defined behaviour: a call while the server is down is retried (connection refused)
    until the new server listens; the new server does not know the old env id, so the
    interrupted episode's step fails with AgentGymEnvLostError and the next reset() creates a
    new env and works, giving the same task text as before."""
    port, log = _free_port(), tmp_path / "server.log"
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = _start(port, out)
        try:
            _wait_healthy(proc, url, log)
            env = AgentGymHTTPEnv(url, timeout_s=10, retries=8, backoff_s=0.2)
            first, _ = env.reset(seed=1_000_005)
            env.step("turn left")
            old_id = env.env_id
            proc.kill()  # a crash, not a shutdown
            proc.wait(timeout=10)
            proc = _start(port, out)  # not waited for: the client's retries cover the start
            started = time.monotonic()
            with pytest.raises(AgentGymEnvLostError, match="restarted"):
                env.step("turn left")
            print(f"step answered {time.monotonic() - started:.1f} s after the restart began")
            again, _ = env.reset(seed=1_000_005)
            assert again == first and env.env_id not in (None, old_id)
            assert not env.step(env.oracle_action()).info["invalid_action"]
            env.close()
        finally:
            _stop(proc)
    env.close()  # a dead server: close() is quiet


def test_no_server_is_a_clear_error_after_bounded_retries():
    url = f"http://127.0.0.1:{_free_port()}"
    env = AgentGymHTTPEnv(url, retries=2, backoff_s=0.05, timeout_s=2)
    started = time.monotonic()
    with pytest.raises(AgentGymConnectionError) as err:
        env.reset(seed=0)
    assert time.monotonic() - started < 5
    assert f"POST /create: cannot reach {url} after 3 attempts" in str(err.value)
    env.close()
