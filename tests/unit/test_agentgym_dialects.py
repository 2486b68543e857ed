"""The AgentGym client against faithful local stand-ins of each AgentGym env server's dialect.

Each stand-in serves the routes, keys and answer shapes of one server in github.com/WooooDyy/
AgentGym (agentenv-<name>/agentenv_<name>/server.py) on 127.0.0.1, and fails as that server
does: WebArena is Flask and answers a missing key with HTTP 500; the others are FastAPI and
answer a body their pydantic model rejects with 422; BabyAI, SciWorld and TextCraft report a
failed call as HTTP 200 `{"error": ...}`. `horizonrl`'s stand-in is `horizonrl env-server` itself.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from pydantic import BaseModel

from horizonrl.cluster.config import load_config
from horizonrl.envpool import env_server
from horizonrl.envpool.agentgym_dialects import DIALECTS, close_problem
from horizonrl.envpool.agentgym_http import (
    AgentGymHTTPEnv,
    AgentGymProtocolError,
    AgentGymServerError,
)

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]
NAMED = ["webarena", "webshop", "babyai", "sciworld", "textcraft"]


# ------------------------------------------------------------------------ the stand-ins
class Game:
    """The envs of one stand-in: task k starts at "task k: a closed door", an action `a` is
    answered "you a", and "win" ends the episode with reward 1. Unknown ids raise KeyError, as
    the real servers' env dicts do. `calls` records every request as (route, query, body)."""

    def __init__(self) -> None:
        self.obs: dict[int, str] = {}
        self.closed: list[int] = []
        self.calls: list[tuple[str, dict[str, str], Any]] = []
        self._next = 40  # ids from 41, apart from the task indices: a swapped key shows

    def create(self) -> int:
        self._next += 1
        self.obs[self._next] = ""
        return self._next

    def reset(self, env_id: int, task: int | None) -> str:
        self._known(env_id)
        self.obs[env_id] = f"task {task}: a closed door"
        return self.obs[env_id]

    def step(self, env_id: int, action: str) -> tuple[str, float, bool]:
        self._known(env_id)
        self.obs[env_id] = "you won" if action == "win" else f"you {action}"
        if self.obs[env_id] == "you won":
            return self.obs[env_id], 1.0, True
        return self.obs[env_id], 0.0, False

    def close(self, env_id: int) -> bool:
        self.closed.append(env_id)
        return self.obs.pop(env_id, None) is not None

    def _known(self, env_id: int) -> None:
        if env_id not in self.obs:
            raise KeyError(env_id)


def _recorded(game: Game) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def record(request: Request, call_next: Callable) -> Any:
        raw = await request.body()
        body = (await request.json()) if raw else None
        game.calls.append((f"{request.method} {request.url.path}",
                           dict(request.query_params), body))
        return await call_next(request)

    return app


FLASK_500 = "<!doctype html><title>500 Internal Server Error</title><h1>Internal Server Error</h1>"


def webarena_app(game: Game) -> FastAPI:
    """Flask: `request.json[...]` raises KeyError on a missing key, which Flask answers 500."""
    app = _recorded(game)

    @app.exception_handler(KeyError)
    @app.exception_handler(TypeError)
    async def flask_500(request: Request, exc: Exception) -> HTMLResponse:
        return HTMLResponse(FLASK_500, status_code=500)

    @app.post("/create")
    def create() -> JSONResponse:
        return JSONResponse({"env_idx": game.create()})

    @app.post("/reset")
    async def reset(request: Request) -> JSONResponse:
        q = await request.json()
        env_idx, _seed, idx = q["env_idx"], q["seed"], q["idx"]  # each read, as the real one
        return JSONResponse({"observation": game.reset(env_idx, idx)})

    @app.post("/step")
    async def step(request: Request) -> JSONResponse:
        q = await request.json()
        env_idx, action = q["env_idx"], q["action"]
        try:  # the real server's step catches everything and answers it as an observation
            obs, reward, done = game.step(env_idx, action)
            info = {"fail_error": ""}
        except Exception as exc:
            obs, reward, done, info = str(exc), 0, False, None
        return JSONResponse({"observation": obs, "reward": reward, "terminated": done,
                             "truncated": False, "info": info})

    @app.get("/observation")
    def observation(request: Request) -> JSONResponse:
        raw = request.query_params.get("env_idx", "")  # Flask's type=int: None if not an int
        return JSONResponse(game.obs[int(raw) if raw.lstrip("-").isdigit() else None])

    @app.post("/close")
    async def close(request: Request) -> HTMLResponse:
        game.close((await request.json())["env_idx"])
        return HTMLResponse("closed")

    return app


class WebShopStepQuery(BaseModel):
    env_idx: int
    action: str


class WebShopStepResponse(BaseModel):
    state: str
    reward: float
    done: bool
    info: None


class WebShopResetQuery(BaseModel):
    env_idx: int
    session_id: int | None = None


class WebShopCloseQuery(BaseModel):
    env_idx: int


class WebShopCloseResponse(BaseModel):
    closed: bool


def webshop_app(game: Game) -> FastAPI:
    """FastAPI with the real pydantic models and response models; KeyError is a bare 500."""
    app = _recorded(game)

    @app.exception_handler(KeyError)
    async def internal(request: Request, exc: Exception) -> PlainTextResponse:
        return PlainTextResponse("Internal Server Error", status_code=500)

    @app.post("/create", response_model=int)
    def create() -> Any:
        return game.create()

    @app.post("/reset", response_model=tuple[str, None])
    def reset(q: WebShopResetQuery) -> Any:
        return game.reset(q.env_idx, q.session_id), None

    @app.post("/step", response_model=WebShopStepResponse)
    def step(q: WebShopStepQuery) -> Any:
        state, reward, done = game.step(q.env_idx, q.action)
        return WebShopStepResponse(state=state, reward=reward, done=done, info=None)

    @app.get("/observation", response_model=str)
    def observation(env_idx: int) -> Any:
        return game.obs[env_idx]

    @app.post("/close", response_model=WebShopCloseResponse)
    def close(q: WebShopCloseQuery) -> Any:
        return WebShopCloseResponse(closed=game.close(q.env_idx))

    return app


class IdAction(BaseModel):
    id: int
    action: str


class IdTask(BaseModel):
    id: int
    data_idx: int


class TextCraftCreate(BaseModel):
    commands: str | None = None
    goal: str | None = None


class TextCraftReset(BaseModel):
    id: int
    data_idx: int | None = 0


def _reported(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """BabyAI, SciWorld and TextCraft answer any failure as HTTP 200 {"error": ...}."""
    try:
        return fn()
    except Exception as exc:
        return {"error": f"The id {exc} is not valid."}


def agentenv_app(game: Game, name: str) -> FastAPI:
    """BabyAI, SciWorld or TextCraft: `id`/`data_idx`, errors as 200 {"error"}, no /close;
    BabyAI has no /observation either."""
    app = _recorded(game)
    textcraft = name == "textcraft"

    def started(env_id: int) -> dict[str, Any]:
        return {"id": env_id, "observation": "", "done": False, "reward": 0}

    if textcraft:
        @app.post("/create")
        def create_tc(body: TextCraftCreate) -> Any:
            return _reported(lambda: started(game.create()))
    else:
        @app.post("/create")
        def create() -> Any:
            return _reported(lambda: {"id": game.create()})

    def reset_answer(body: IdTask | TextCraftReset) -> dict[str, Any]:
        obs = game.reset(body.id, body.data_idx)
        if textcraft:
            return started(body.id) | {"observation": obs}
        fields = {"observation": obs, "reward": 0.0, "score": 0.0, "deleted": False,
                  "done": False}
        if name == "sciworld":
            fields |= {"task_name": "boil", "var_num": body.data_idx,
                       "task_description": "Your task is to boil water."}
        return fields

    if textcraft:
        @app.post("/reset")
        def reset_tc(body: TextCraftReset) -> Any:
            return _reported(lambda: reset_answer(body))
    else:
        @app.post("/reset")
        def reset(body: IdTask) -> Any:
            return _reported(lambda: reset_answer(body))

    @app.post("/step")
    def step(body: IdAction) -> Any:
        def answer() -> dict[str, Any]:
            obs, reward, done = game.step(body.id, body.action)
            score = {} if textcraft else {"score": reward}
            return {"observation": obs, "reward": reward, **score, "done": done}
        return _reported(answer)

    if name != "babyai":
        @app.get("/observation")
        def observation(id: int) -> Any:
            return _reported(lambda: game.obs[id])

    return app


def _app(name: str, game: Game) -> FastAPI:
    if name == "webarena":
        return webarena_app(game)
    if name == "webshop":
        return webshop_app(game)
    if name == "horizonrl":
        return env_server.create_app("babyai", {"level": "BabyAI-GoToRedBall-v0"})
    return agentenv_app(game, name)


@contextmanager
def _serving(app: FastAPI) -> Iterator[str]:
    """`app` served by uvicorn in a thread on 127.0.0.1, on a port the OS picks."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(200):  # 10 s at most
            if server.started:
                break
            time.sleep(0.05)
        else:
            pytest.fail("stand-in server did not start in 10 s")
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, tuple[str, Game]]]:
    """Every stand-in, by dialect name: (url, its Game)."""
    with (_serving(_app("horizonrl", horizonrl := Game())) as h,
          _serving(_app("webarena", webarena := Game())) as wa,
          _serving(_app("webshop", webshop := Game())) as ws,
          _serving(_app("babyai", babyai := Game())) as ba,
          _serving(_app("sciworld", sciworld := Game())) as sw,
          _serving(_app("textcraft", textcraft := Game())) as tc):
        yield {"horizonrl": (h, horizonrl), "webarena": (wa, webarena),
               "webshop": (ws, webshop), "babyai": (ba, babyai), "sciworld": (sw, sciworld),
               "textcraft": (tc, textcraft)}


def _env(url: str, server: str, **kwargs: Any) -> AgentGymHTTPEnv:
    return AgentGymHTTPEnv(url, server=server, timeout_s=10.0, retries=0, **kwargs)


# ------------------------------------------------------------------------------- tests
RESET_BODY = {  # what each dialect's /reset must carry for env `i`, task 5
    "webarena": lambda i: {"env_idx": i, "seed": 0, "idx": 5},
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
        assert obs == "task 5: a closed door" and info["success"] is False
        assert env.observation() == obs
        result = env.step("look")
        assert (result.observation, result.reward, result.terminated) == ("you look", 0.0, False)
        assert env.observation() == "you look"
        result = env.step("win")
        assert result.terminated and not result.truncated and result.reward == 1.0
        assert result.info["success"] and result.info["score"] == 1.0
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
    assert ("GET /observation" in routes) == d.observation_route
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
    ("webshop", "/close", {"id": 41}, 422),
    ("babyai", "/reset", {"env_idx": 41, "session_id": 1}, 422),
    ("babyai", "/close", {"id": 41}, 404),
    ("sciworld", "/reset", {"id": 41}, 422),
    ("textcraft", "/create", None, 422),
    ("textcraft", "/step", {"env_idx": 41, "action": "look"}, 422),
])
def test_stand_ins_reject_what_their_server_rejects(servers, server, route, body, status):
    url, _ = servers[server]
    assert httpx.post(f"{url}{route}", json=body, timeout=10.0).status_code == status


def test_agentenv_servers_report_unknown_ids_as_200_errors(servers):
    url, game = servers["sciworld"]
    with _env(url, "sciworld") as env:
        env.reset(seed=0)
        game.obs.pop(env.env_id)  # the server forgot our env: it answers 200 {"error"}
        with pytest.raises(AgentGymServerError, match=f"{env.env_id} is not valid") as err:
            env.step("look")
        assert err.value.status == 200


def test_dialect_names_and_keys_are_checked():
    with pytest.raises(ValueError, match="known: horizonrl, webarena, webshop, babyai"):
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
    webarena, webshop = DIALECTS["webarena"], DIALECTS["webshop"]
    assert close_problem(webarena, 200, "closed", None) is None
    assert close_problem(webshop, 200, '{"closed":false}', {"closed": False}) is None
    problem = close_problem(webarena, 200, '{"closed":true}', {"closed": True})
    assert problem and 'the webarena dialect answers the text "closed"' in problem
    problem = close_problem(webshop, 200, "closed", None)
    assert problem and "the webshop dialect answers {\"closed\": bool}" in problem
    assert "HTTP 500" in (close_problem(webshop, 500, "Internal Server Error", None) or "")
    assert close_problem(DIALECTS["horizonrl"], 200, "anything", None) is None


@pytest.mark.parametrize(("config", "server"), [("webarena-agentgym.yaml", "webarena"),
                                                ("webshop-agentgym.yaml", "webshop")])
def test_agentgym_configs_name_their_dialect(config, server):
    cfg = load_config(ROOT / "configs" / config)
    assert cfg.env.name == "agentgym" and cfg.env.kwargs["server"] == server
    env = AgentGymHTTPEnv(**cfg.env.kwargs)  # what the env pool builds from env.kwargs
    assert env.dialect.name == server
    env.close()


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
