"""AgentGym's own env servers, unmodified (`../shared/agentgym-servers`), through the client.

Each server runs in `make install-dev`'s separate virtual environment (its pins clash with
ours) on 127.0.0.1. Per server: create, reset several tasks, scripted episodes solved through
`AgentGymHTTPEnv` (TextCraft from the recipe lines, BabyAI from the available actions,
SciWorld along the game's gold path), invalid actions counted, nothing sent after the end,
`close()` freeing the server's env (SciWorld: its JVM), a restart recovered at the next reset;
then a short training run against the real TextCraft server through the pool.
Skipped, naming the folder, where the servers' folder is absent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from horizonrl.envpool.agentgym_experts import (
    TextCraftPlanner,
    babyai_action,
    sciworld_games,
    sciworld_gold_path,
)
from horizonrl.envpool.agentgym_http import AgentGymEnvLostError, AgentGymHTTPEnv
from horizonrl.envpool.agentgym_servers import (
    AgentGymServer,
    default_python,
    default_servers_dir,
    java_processes,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]
ROOT = Path(__file__).resolve().parents[2]
SERVERS_DIR = default_servers_dir(ROOT)
if not SERVERS_DIR.is_dir():
    pytest.skip(f"AgentGym's servers are not at {SERVERS_DIR} (set HORIZONRL_AGENTGYM_SERVERS)",
                allow_module_level=True)


def _serve(name: str, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp(f"agentgym-{name}") / "server.log"
    with AgentGymServer(name, SERVERS_DIR, python=default_python(ROOT), log=log) as server:
        yield server


@pytest.fixture(scope="module")
def textcraft(tmp_path_factory):
    yield from _serve("textcraft", tmp_path_factory)


@pytest.fixture(scope="module")
def babyai(tmp_path_factory):
    yield from _serve("babyai", tmp_path_factory)


@pytest.fixture(scope="module")
def sciworld(tmp_path_factory):
    yield from _serve("sciworld", tmp_path_factory)


def _client(server: AgentGymServer, **kwargs) -> AgentGymHTTPEnv:
    return AgentGymHTTPEnv(server.url, server=server.name, timeout_s=120.0, **kwargs)


# ------------------------------------------------------------------------------ TextCraft
def test_textcraft_recipes_solved_invalid_counted_and_the_end_kept(textcraft):
    with _client(textcraft) as env:
        firsts = {env.reset(seed=i)[0] for i in range(3)}
        assert len(firsts) == 3 and all("Goal: craft" in o for o in firsts)
        solved = 0
        for task in range(5):
            obs, info = env.reset(seed=task)
            assert not info["invalid_action"]
            for action in TextCraftPlanner(obs).plan():
                result = env.step(action)
                assert not result.info["invalid_action"], (task, action, result.observation)
            solved += result.terminated and result.reward == 1.0 and result.info["success"]
            # The server would step on after the goal (done: false); the client sends nothing.
            after = env.step("inventory")
            assert after.terminated and after.info["invalid_action"] and after.reward == 0.0
            assert env.observation() == result.observation
        assert solved == 5
        env.reset(seed=0)
        for bad in ("hello", "craft 1 foo using 2 bar", "get 1 no such thing"):
            result = env.step(bad)
            assert result.info["invalid_action"], result.observation
            assert not result.terminated


def test_textcraft_close_frees_the_env_and_a_restart_is_recovered(textcraft):
    import httpx

    env = _client(textcraft)
    env.reset(seed=1)
    env_id = env.env_id
    env.close()
    gone = httpx.post(f"{textcraft.url}/step", json={"id": env_id, "action": "inventory"})
    assert "not valid" in gone.json()["error"]  # closed on the server, not left running
    with _client(textcraft) as env, _client(textcraft) as other:
        env.reset(seed=2)
        other.reset(seed=3)
        textcraft.restart()  # every env the server held is gone; ids start again from 0
        with pytest.raises(AgentGymEnvLostError):
            env.step("inventory")
        obs, _ = env.reset(seed=2)  # a new env on the new server
        assert "Goal: craft" in obs
        other_obs, _ = other.reset(seed=3)  # dropped its void id rather than share env 0
        assert other.env_id != env.env_id and "Goal: craft" in other_obs


# ------------------------------------------------------------------------------ BabyAI
def test_babyai_expert_solves_goto_levels_and_invalid_actions_count(babyai):
    with _client(babyai) as env:
        solved = 0
        for task in (0, 1, 2, 40, 41):  # GoToRedBallGrey, GoToRedBall, ...NoDists, seeds 0-1
            obs, _ = env.reset(seed=task)
            mission = obs.splitlines()[0]
            for _ in range(20):
                result = env.step(babyai_action(obs, mission))
                obs = result.observation
                if result.terminated or result.truncated:
                    break
            solved += result.info["success"]
            assert env.step("turn left").info["invalid_action"]  # the end: nothing sent
        assert solved == 5
        obs, _ = env.reset(seed=3)
        assert env.observation().startswith("Your goal:")  # GET /observation's object
        result = env.step("dance")
        assert result.info["invalid_action"] and "not recognized" in result.observation


# ------------------------------------------------------------------------------ SciWorld
@pytest.fixture(scope="module")
def games():
    return sciworld_games()


def test_sciworld_task_is_seen_and_rewards_are_on_the_native_scale(sciworld, games):
    boil, nonliving = games.index(("boil", 0)), games.index(("find-non-living-thing", 0))
    with _client(sciworld) as env:
        first_boil, _ = env.reset(seed=boil)
        first_find, _ = env.reset(seed=nonliving)
        assert first_boil != first_find
        assert first_boil.startswith("Your task is to boil water")
        assert "non-living thing" in first_find
        solved = 0
        for task in ("find-non-living-thing", "find-living-thing", "find-plant"):
            env.reset(seed=games.index((task, 0)))
            total = 0.0
            for action in sciworld_gold_path(task, 0):
                result = env.step(action)
                total += result.reward
                assert 0.0 <= result.reward <= 1.0  # points / 100, never the server's 8, 17...
                if result.terminated:
                    break
            assert total == pytest.approx(1.0) and result.info["score"] == pytest.approx(1.0)
            solved += result.info["success"]
            after = env.step("look around")  # the server would answer "has finished"
            assert after.info["invalid_action"] and after.reward == 0.0
        assert solved == 3
        assert env.step("look around").terminated
        env.reset(seed=boil)
        result = env.step("fly to the moon")
        assert result.info["invalid_action"] and not result.terminated


def _jvms_settle(pid: int, expected: int, timeout_s: float = 30.0) -> int:
    """The server's JVM count once it equals `expected` or `timeout_s` passed (a closed
    gateway's JVM exits a moment after /close answers)."""
    import time

    deadline = time.monotonic() + timeout_s
    while (count := java_processes(pid)) != expected and time.monotonic() < deadline:
        time.sleep(0.5)
    return count


def test_sciworld_close_frees_its_jvm(sciworld):
    base = _jvms_settle(sciworld.pid, 0)  # the earlier tests' envs were closed
    assert base == 0
    for task in range(3):  # as a pool recycles a replica: create, reset, close
        with _client(sciworld) as env:
            env.reset(seed=task)
            assert _jvms_settle(sciworld.pid, base + 1) == base + 1
    assert _jvms_settle(sciworld.pid, base) == base


# ------------------------------------------------------------------------------ training
@pytest.mark.slow
def test_a_short_training_run_against_the_real_textcraft_server(textcraft, tiny_model_path,
                                                                 tmp_path):
    from horizonrl.cluster.config import load_config
    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.rollout.iteration import make_run_dir
    from horizonrl.cluster.train.driver import Trainer

    cfg = load_config(ROOT / "configs/textcraft-local.yaml", [
        "name=agentgym-textcraft", "iterations=2", "metrics.port=0", f"run_root={tmp_path}",
        "checkpoint_every=0", f"model.path={tiny_model_path}", "env.name=agentgym",
        f'env.kwargs={{"url": "{textcraft.url}", "server": "textcraft", "timeout_s": 60}}',
        "env.replicas_per_actor=8", "env.step_threads=4", "generator.tasks_per_step=2",
        "generator.group_size=4", "curriculum.schedule=fixed", "curriculum.horizons=[3]",
        "learner.skip_zero_variance_groups=false"])
    with ray_session(cfg.ray), Trainer(cfg, run_dir=make_run_dir(cfg)) as trainer:
        for _ in range(2):
            m = trainer.step()
            assert m["ledger"]["reconciled"], m["ledger"]
        trajs = trainer.last_trajectories
        assert len(trajs) == 8 and all(t.env_name == "agentgym" for t in trajs)
        assert all(t.failure == "none" for t in trajs), [t.failure for t in trajs]
        led = m["ledger"]
        assert led["conflicts"] == 0 and led["unaccounted"] == 0 and led["generated"] == 16
