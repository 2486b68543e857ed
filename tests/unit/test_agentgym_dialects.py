"""The AgentGym client against faithful local stand-ins of each AgentGym env server's dialect
(tests/unit/agentgym_standins.py): round trips, wrong dialects, task-seed mapping."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from agentgym_standins import Game, serving, stand_in_app

from horizonrl.cluster.config import load_config
from horizonrl.envpool.agentgym_dialects import DIALECTS, close_problem
from horizonrl.envpool.agentgym_http import (
    AgentGymEnvLostError,
    AgentGymHTTPEnv,
    AgentGymProtocolError,
    AgentGymServerError,
)
from horizonrl.envpool.config import EnvConfig, replica_kwargs
from horizonrl.envpool.pool import EnvPool

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]
NAMED = ["webarena", "webarena-flask", "webshop", "babyai", "sciworld", "textcraft"]


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, tuple[str, Game]]]:
    """Every stand-in, by dialect name: (url, its Game)."""
    with ExitStack() as stack:
        out = {}
        for name in ("horizonrl", *NAMED):
            game = Game()
            out[name] = (stack.enter_context(serving(stand_in_app(name, game))), game)
        yield out


def _env(url: str, server: str, **kwargs: Any) -> AgentGymHTTPEnv:
    return AgentGymHTTPEnv(url, server=server, timeout_s=10.0, retries=0, **kwargs)


# ------------------------------------------------------------------------------- tests
RESET_BODY = {  # what each dialect's /reset must carry for env `i`, task 5
    "webarena": lambda i: {"env_idx": i, "seed": 0, "idx": 5},
    "webarena-flask": lambda i: {"env_idx": i, "seed": 0, "idx": 5},
    "webshop": lambda i: {"env_idx": i, "session_id": 5},
    "babyai": lambda i: {"id": i, "data_idx": 5},
    "sciworld": lambda i: {"id": i, "data_idx": 5},
    "textcraft": lambda i: {"id": i, "data_idx": 5},
}


@pytest.mark.parametrize("name", NAMED)
def test_each_dialect_round_trips_against_its_stand_in(servers, name, caplog):
    url, game = servers[name]
    d = DIALECTS[name]
    with _env(url, name) as env:
        obs, info = env.reset(seed=5)
        env_id = env.env_id
        task = "Your task is to boil water.\n\n" if name == "sciworld" else ""
        assert obs == f"{task}task 5: a closed door" and info["success"] is False
        assert env.observation() == "task 5: a closed door"
        result = env.step("look")
        assert (result.observation, result.reward, result.terminated) == ("you look", 0.0, False)
        assert env.observation() == "you look"
        result = env.step("win")
        assert result.terminated and not result.truncated and result.reward == 1.0
        assert result.info["success"] and result.info["score"] == 1.0
        assert env.step("look").info["invalid_action"]  # after the end: nothing is sent
        assert env.observation() == "you won"
    mine = [(route, query, body) for route, query, body in game.calls
            if env_id in (body or {}).values() or str(env_id) in query.values()
            or route == "POST /create"]
    routes = [route for route, _, _ in mine]
    reset_body = next(body for route, _, body in mine if route == "POST /reset")
    assert reset_body == RESET_BODY[name](env_id)
    assert all(set(body) == {d.id_key, "action"} for route, _, body in mine
               if route == "POST /step")
    assert all(query == {d.id_key: str(env_id)} for route, query, _ in mine
               if route == "GET /observation")
    assert routes.count("POST /step") == 2 and routes.count("GET /observation") == 2
    if d.close_answer is None:  # no /close route: nothing sent, the env stays
        assert "POST /close" not in routes and env_id in game.obs
    else:
        assert game.closed[-1] == env_id and env_id not in game.obs
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_default_dialect_round_trips_against_horizonrl_env_server(servers):
    url, _ = servers["horizonrl"]
    with _env(url, "horizonrl") as env:
        obs, _ = env.reset(seed=3)
        assert isinstance(obs, str) and obs
        result = env.step("turn left")
        assert env.observation() == result.observation
        assert env.oracle_action()
        env_id = env.env_id
    assert httpx.get(f"{url}/observation", params={"id": env_id}).status_code == 404  # closed


@pytest.mark.parametrize(("server", "client"), [
    (server, client) for server in ["horizonrl", *NAMED] for client in NAMED if client != server])
def test_a_wrong_dialect_fails_naming_the_mismatch(servers, server, client):
    url, _ = servers[server]
    with _env(url, client) as env, pytest.raises(AgentGymProtocolError) as err:
        env.reset(seed=1)
        env.step("look")
        env.observation()
    message = str(err.value)
    assert f"the {client} dialect" in message and "is `server` right?" in message, message
    assert message.split(" ")[0] in {"POST", "GET"}  # it names the endpoint first


@pytest.mark.parametrize(("server", "status", "needle"), [
    ("webarena", 500, "Internal Server Error"),   # Flask: request.json["seed"] -> KeyError
    ("webshop", 422, "body.env_idx: Field required"),
])
def test_the_default_dialect_against_agentgym_servers_hints_at_server(servers, server, status,
                                                                      needle):
    url, _ = servers[server]
    with _env(url, "horizonrl") as env, pytest.raises(AgentGymServerError) as err:
        env.reset(seed=1)
    assert err.value.status == status
    assert needle in str(err.value) and "set `server` to its dialect" in str(err.value)


@pytest.mark.parametrize(("server", "route", "body", "status"), [
    ("webarena", "/reset", {"env_idx": 41, "data_idx": 1}, 500),
    ("webarena", "/step", {"id": 41, "action": "look"}, 500),
    ("webshop", "/reset", {"id": 41, "data_idx": 1}, 422),
    ("webshop", "/step", {"env_idx": 41, "state": "look"}, 422),
    ("webshop", "/close", {"env_idx": 41}, 404),
    ("babyai", "/reset", {"env_idx": 41, "session_id": 1}, 422),
    ("babyai", "/close", {"env_idx": 41}, 422),
    ("sciworld", "/reset", {"id": 41}, 422),
    ("textcraft", "/create", None, 422),
    ("textcraft", "/step", {"env_idx": 41, "action": "look"}, 422),
])
def test_stand_ins_reject_what_their_server_rejects(servers, server, route, body, status):
    url, _ = servers[server]
    assert httpx.post(f"{url}{route}", json=body, timeout=10.0).status_code == status


@pytest.mark.parametrize("name", ["babyai", "sciworld", "textcraft"])
def test_agentenv_servers_report_unknown_ids_as_200_errors_and_reset_recovers(servers, name):
    url, game = servers[name]
    with _env(url, name) as env:
        env.reset(seed=0)
        lost = env.env_id
        game.obs.pop(lost)  # the server forgot our env: it answers 200 {"error"}
        with pytest.raises(AgentGymEnvLostError, match=f"{lost} is not valid") as err:
            env.step("look")
        assert err.value.status == 200 and env.env_id is None
        obs, _ = env.reset(seed=4)  # a new env, made at the next reset
        assert env.env_id != lost and obs.endswith("task 4: a closed door")


def test_dialect_names_and_keys_are_checked():
    with pytest.raises(ValueError, match="known: horizonrl, webarena, webarena-flask, webshop"):
        AgentGymHTTPEnv("http://127.0.0.1:9", server="alfworld")
    with pytest.raises(ValueError, match="the webarena dialect sends 'env_idx'"):
        AgentGymHTTPEnv("http://127.0.0.1:9", server="webarena", id_key="id")
    with pytest.raises(ValueError, match="the webshop dialect sends 'session_id'"):
        AgentGymHTTPEnv("http://127.0.0.1:9", server="webshop", reset_key="data_idx")
    env = AgentGymHTTPEnv("http://127.0.0.1:9", server="webarena", id_key="env_idx",
                          reset_key="idx")
    assert env.reset_key == "idx"
    with pytest.raises(ValueError, match="takes no options"):
        env.reset(seed=0, options={"x": 1})
    env.close()
    env = AgentGymHTTPEnv("http://127.0.0.1:9", server="babyai")
    with pytest.raises(RuntimeError, match="reset"):
        env.observation()
    env.close()


def test_oracle_is_horizonrl_only(servers):
    url, _ = servers["babyai"]
    with _env(url, "babyai") as env:
        env.reset(seed=0)
        with pytest.raises(AgentGymProtocolError, match="babyai dialect has no oracle"):
            env.oracle_action()


def test_close_answers_are_checked_and_logged_not_raised():
    webarena, flask = DIALECTS["webarena"], DIALECTS["webarena-flask"]
    sciworld, horizonrl = DIALECTS["sciworld"], DIALECTS["horizonrl"]
    assert close_problem(flask, 200, "closed", None) is None
    assert close_problem(webarena, 200, '{"closed":"closed"}', {"closed": "closed"}) is None
    problem = close_problem(webarena, 200, "", {"closed": "Close Env 3 time out."})
    assert problem and "did not close the env: Close Env 3 time out." in problem
    problem = close_problem(flask, 200, '{"closed":true}', {"closed": True})
    assert problem and 'the webarena-flask dialect answers the text "closed"' in problem
    for answer in (True, False):  # false: no such env (closed already): nothing to do
        assert close_problem(sciworld, 200, str(answer).lower(), answer) is None
    assert close_problem(sciworld, 500, "Internal Server Error", None) is None  # closed twice
    problem = close_problem(sciworld, 200, "closed", None)
    assert problem and "the sciworld dialect answers a bare true/false" in problem
    assert close_problem(horizonrl, 200, '{"closed":false}', {"closed": False}) is None
    assert "HTTP 503" in (close_problem(horizonrl, 503, "Unavailable", None) or "")
    assert DIALECTS["webshop"].close_answer is None  # its main branch has no /close


@pytest.mark.parametrize(("config", "server"), [("webarena-agentgym.yaml", "webarena"),
                                                ("webshop-agentgym.yaml", "webshop")])
def test_agentgym_configs_name_their_dialect(config, server):
    cfg = load_config(ROOT / "configs" / config)
    assert cfg.env.name == "agentgym" and cfg.env.kwargs["server"] == server
    env = AgentGymHTTPEnv(**replica_kwargs(cfg.env.kwargs, 0))  # as the env pool builds it
    assert env.dialect.name == server
    env.close()


def test_servers_with_one_global_state_get_one_replica_each(servers):
    """WebArena's config lists a server per replica; the pool gives replica i the URL i, over
    every generator's pool, and a config whose URLs do not match its replicas is refused."""
    cfg = load_config(ROOT / "configs/webarena-agentgym.yaml")
    urls = cfg.env.kwargs["urls"]
    assert len(urls) == len(set(urls)) == cfg.env.replicas_per_actor * cfg.env.num_actors
    url, _ = servers["webarena"]
    env_cfg = EnvConfig(name="agentgym", kwargs={"urls": [f"{url}/a", f"{url}/b", url, url + "/"],
                                                 "server": "webarena"},
                        num_actors=1, replicas_per_actor=2, in_process=True)
    pools = [EnvPool(env_cfg, index=i) for i in range(2)]  # two generators' pools
    got = [env.url for pool in pools for env in pool.actors[0].envs]
    assert got == [f"{url}/a", f"{url}/b", url, url]
    with pytest.raises(ValueError, match="replica 4 needs one"):
        replica_kwargs(env_cfg.kwargs, 4)
    with pytest.raises(ValueError, match="lists 16 servers for 32 replicas"):
        load_config(ROOT / "configs/webarena-agentgym.yaml", ["generator.num_generators=2"])
    with pytest.raises(ValueError, match="lists a server twice"):
        EnvConfig(name="agentgym", kwargs={"urls": [url, url]})
    with pytest.raises(ValueError, match="not both"):
        EnvConfig(name="agentgym", kwargs={"urls": [url], "url": url})


def test_task_seeds_map_onto_the_servers_task_range(servers):
    """WebArena's 812 tasks: train seeds wrap over the first 712, eval seeds over the last 100,
    and the index reaches the server as its task key."""
    env = AgentGymHTTPEnv("http://127.0.0.1:9", server="webarena", num_tasks=812,
                          eval_tasks=100)
    assert [env.task_index(s) for s in (0, 711, 712, 1_000_000, 1_000_099, 1_000_100)] == \
        [0, 711, 0, 712, 811, 712]
    assert env.task_index(2_000_005) == 5  # train-new seeds are training tasks too
    env.close()
    with pytest.raises(ValueError, match="eval_tasks"):
        AgentGymHTTPEnv("http://127.0.0.1:9", num_tasks=10, eval_tasks=10)
    with pytest.raises(ValueError, match="needs num_tasks"):
        AgentGymHTTPEnv("http://127.0.0.1:9", eval_tasks=3)
    no_eval = AgentGymHTTPEnv("http://127.0.0.1:9", num_tasks=10)
    with pytest.raises(ValueError, match="eval-split seed"):
        no_eval.task_index(1_000_000)
    no_eval.close()
    url, game = servers["webarena"]
    with AgentGymHTTPEnv(url, server="webarena", num_tasks=812, eval_tasks=100) as env:
        env.reset(seed=1_000_003)
        env_id = env.env_id
    body = next(b for route, _, b in game.calls
                if route == "POST /reset" and b.get("env_idx") == env_id)
    assert body["idx"] == 715
