"""Faithful local stand-ins of each AgentGym env server's dialect, for
tests/unit/test_agentgym_dialects.py.

Each stand-in serves the routes, keys and answer shapes of one server in github.com/WooooDyy/
AgentGym (agentenv-<name>/agentenv_<name>/server.py, commit 3ef9235) on 127.0.0.1, and fails as
that server does: WebArena is Quart (Flask before 640f8bc: `webarena-flask`) and answers a
missing key with HTTP 500; the others are FastAPI and answer a body their pydantic model rejects
with 422; BabyAI, SciWorld and TextCraft report a failed call as HTTP 200 `{"error": ...}` and
answer /close with a bare boolean; WebShop has no /close. The real BabyAI, SciWorld and
TextCraft servers are tested too (tests/integration/test_agentgym_servers.py); these stand-ins
keep the fast checks fast. `horizonrl`'s stand-in is `horizonrl env-server` itself.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from pydantic import BaseModel

from horizonrl.envpool import env_server


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


def webarena_app(game: Game, *, flask: bool = False) -> FastAPI:
    """`request.json[...]` raises KeyError on a missing key, which Flask and Quart answer 500.
    Quart (640f8bc on) answers /reset with the task's sites and intent and /close with
    `{"closed": "closed"}`; Flask answered `{"observation"}` and the text "closed"."""
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
        if flask:
            return JSONResponse({"observation": game.reset(env_idx, idx)})
        try:
            obs, sites, intent = game.reset(env_idx, idx), ["shopping"], f"task {idx}"
        except Exception:  # the real one catches everything and says so in `sites`
            obs, sites, intent = "TimeoutError", "Error", "Error"
        return JSONResponse({"observation": obs, "sites": sites, "object": intent})

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
    async def close(request: Request) -> Any:
        game.close((await request.json())["env_idx"])
        return HTMLResponse("closed") if flask else JSONResponse({"closed": "closed"})

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

    return app  # no /close: WebShop's main branch has none


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


class IdOnly(BaseModel):
    id: int


def agentenv_app(game: Game, name: str) -> FastAPI:
    """BabyAI, SciWorld or TextCraft: `id`/`data_idx`, errors as 200 {"error"}, /close answering
    a bare boolean; BabyAI's /observation answers an object, SciWorld scores out of 100."""
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
            if name == "sciworld":  # points out of 100, reward their change
                return {"observation": obs, "reward": 100 * reward, "score": 100 * reward,
                        "done": done}
            score = {} if textcraft else {"score": reward}
            return {"observation": obs, "reward": reward, **score, "done": done}
        return _reported(answer)

    @app.get("/observation")
    def observation(id: int) -> Any:
        if name == "babyai":
            return _reported(lambda: {"observation": game.obs[id], "reward": 0, "score": 0,
                                      "done": False, "deleted": False})
        return _reported(lambda: game.obs[id])

    @app.post("/close")
    def close(body: IdOnly) -> bool:
        return game.close(body.id)

    return app


def stand_in_app(name: str, game: Game) -> FastAPI:
    if name in ("webarena", "webarena-flask"):
        return webarena_app(game, flask=name == "webarena-flask")
    if name == "webshop":
        return webshop_app(game)
    if name == "horizonrl":
        return env_server.create_app("babyai", {"level": "BabyAI-GoToRedBall-v0"})
    return agentenv_app(game, name)


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
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
