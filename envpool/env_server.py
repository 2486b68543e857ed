"""Serve any registered horizonrl environment over the AgentGym env-server protocol (HTTP).

    horizonrl env-server --env babyai --port 8000       # docs at http://127.0.0.1:8000/docs

So AgentGym's clients (and `envpool.agentgym_http.AgentGymHTTPEnv`) can drive our envs the way
they drive WebShop or SciWorld. The protocol: `POST /create` -> `{"id"}`; `POST /reset`
`{"id", "data_idx"}`; `POST /step` `{"id", "action"}` -> `{"observation", "reward", "score",
"done"}`; `GET /observation?id=`; `POST /close` `{"id"}`; `GET /` health. Extensions: `info`,
`terminated` and `truncated` in answers, `env_idx` accepted for `id`, and `GET /oracle?id=`.

Bad input is a 4xx with `{"detail": ...}`, never a 5xx: unknown id 404, stepping before reset
409, malformed JSON or wrong types 422, an action over the size limit 413, too many envs 429.
An env that raises gives a 500 with the exception's text, and the server keeps serving.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import socket
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from horizonrl.envpool.agentgym_http import MAX_WIRE_ACTION_CHARS
from horizonrl.envpool.base import TextEnv, utf8_safe
from horizonrl.envpool.registry import env_spec, make_env

log = logging.getLogger(__name__)
T = TypeVar("T")
DEFAULT_MAX_ENVS = 256
_ID_DOC = "The env id /create gave (`env_idx` is accepted too, as some AgentGym clients send it)."


# ------------------------------------------------------------------------- request / response
class _Request(BaseModel):
    # Strict: "3" is not an id and 5 is not an action; a wrong type is a 422, never a guess.
    model_config = ConfigDict(strict=True)

    id: int = Field(validation_alias=AliasChoices("id", "env_idx"), description=_ID_DOC)


class CloseRequest(_Request):
    """Which env to close."""


class ResetRequest(_Request):
    """Start an episode on one task."""

    data_idx: int = Field(0, ge=0, description="Task index: the env's task seed (seeds at or "
                          "above 1_000_000 are the eval split, see envpool.base.task_split).")
    options: dict[str, Any] | None = Field(None, description="Passed to the env's reset().")


class StepRequest(_Request):
    """One action, as the model wrote it (after parsing)."""

    action: str = Field(description="The action text. Any text is a valid request: what the env "
                        "does not accept comes back as an observation starting 'Invalid action'.")


class CreateResponse(BaseModel):
    id: int = Field(description="The new env's id, for every later call.")


class ResetResponse(BaseModel):
    observation: str = Field(description="The episode's first observation.")
    info: dict[str, Any] = Field(description="The env's info: invalid_action, success, and "
                                 "available_actions where the env knows its legal moves.")


class StepResponse(BaseModel):
    observation: str = Field(description="What the agent sees next.")
    reward: float = Field(description="This step's reward.")
    score: float = Field(description="The env's score so far (the reward where it has none).")
    done: bool = Field(description="terminated or truncated (AgentGym's single flag).")
    terminated: bool = Field(description="The episode reached an end state.")
    truncated: bool = Field(description="The episode was cut by a step limit.")
    info: dict[str, Any] = Field(description="The env's info (see ResetResponse).")


class OracleResponse(BaseModel):
    action: str = Field(description="The env's scripted agent's next action (never shown to "
                        "the model; for tests and reference data).")


class CloseResponse(BaseModel):
    closed: bool = Field(description="Always true: the env is gone.")


class HealthResponse(BaseModel):
    status: str = Field("ok", description="'ok' while the server serves.")
    env: str = Field(description="The registered env this server serves.")
    envs: int = Field(description="Envs open now.")
    max_envs: int = Field(description="Envs allowed at once; /create answers 429 beyond.")


class ErrorResponse(BaseModel):
    detail: str = Field(description="What went wrong, for a person to read.")


# ------------------------------------------------------------------------------ env table
@dataclass(slots=True)
class _Slot:
    env: TextEnv
    lock: threading.Lock = field(default_factory=threading.Lock)  # one call at a time per env
    observation: str | None = None  # None until the first reset
    closed: bool = False


class EnvTable:
    """The open envs by id. Ids start at a random number per server, so a client whose server
    restarted gets 404 for its old id rather than someone else's env."""

    def __init__(self, env_name: str, env_kwargs: dict[str, Any], max_envs: int) -> None:
        self.env_name, self.env_kwargs, self.max_envs = env_name, env_kwargs, max_envs
        self._slots: dict[int, _Slot] = {}
        self._creating = 0  # envs being built outside the lock, counted against max_envs
        self._next_id = random.randrange(1 << 30)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._slots)

    def create(self) -> int:
        with self._lock:
            if len(self._slots) + self._creating >= self.max_envs:
                raise HTTPException(429, f"{self.max_envs} envs are open, the most this server "
                                    "allows: close some (POST /close) or raise --max-envs")
            self._creating += 1
        try:  # building an env may take seconds (a JVM): other calls go on meanwhile
            env = _env_call("creation", lambda: make_env(self.env_name, **self.env_kwargs))
        finally:
            with self._lock:
                self._creating -= 1
        with self._lock:
            env_id, self._next_id = self._next_id, self._next_id + 1
            self._slots[env_id] = _Slot(env)
        return env_id

    def get(self, env_id: int) -> _Slot:
        slot = self._slots.get(env_id)
        if slot is None or slot.closed:
            raise HTTPException(404, f"unknown env id {env_id}: never created, closed, or "
                                "created before this server restarted; POST /create a new one")
        return slot

    def close(self, env_id: int) -> None:
        with self._lock:
            slot = self._slots.pop(env_id, None)
        if slot is None:
            self.get(env_id)  # raises the 404
            return
        with slot.lock:  # a call in flight on this env finishes first
            slot.closed = True
            with contextlib.suppress(Exception):  # a failing close still frees the id
                slot.env.close()

    def close_all(self) -> None:
        for env_id in list(self._slots):
            self.close(env_id)


def _env_call(what: str, fn: Callable[[], T]) -> T:
    """Run an env method; its exception becomes a 500 naming it (and the server goes on)."""
    try:
        return fn()
    except HTTPException:
        raise
    except Exception as exc:
        log.exception("env %s failed", what)
        raise HTTPException(500, f"env {what} failed: {exc!r}"[:2000]) from exc


def _jsonable(info: dict[str, Any]) -> dict[str, Any]:
    """`info` as plain JSON types (numpy numbers and the like become numbers or strings)."""
    return json.loads(json.dumps(info, default=lambda v: v.tolist() if hasattr(v, "tolist")
                                 else str(v)))


# ------------------------------------------------------------------------------------ app
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in [(400, "The body is not parseable JSON (e.g. not UTF-8)."),
                       (404, "Unknown env id."), (409, "Step or oracle before the first reset."),
                       (413, "Action over the size limit."), (500, "The env raised.")]
}


def create_app(
    env_name: str,
    env_kwargs: dict[str, Any] | None = None,
    *,
    max_envs: int = DEFAULT_MAX_ENVS,
    max_action_chars: int = MAX_WIRE_ACTION_CHARS,
) -> FastAPI:
    """A FastAPI app serving `env_name` (any name in envpool.registry) with `env_kwargs`."""
    env_spec(env_name)  # an unknown name fails here, listing the known ones
    if max_envs < 1 or max_action_chars < 1:
        raise ValueError("max_envs and max_action_chars must be >= 1")
    table = EnvTable(env_name, dict(env_kwargs or {}), max_envs)
    # JSON escapes take up to 12 bytes per character (a surrogate pair); bigger bodies are
    # refused before they are read.
    max_body = 12 * max_action_chars + 4096

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        table.close_all()

    app = FastAPI(title=f"horizonrl env server: {env_name}", version="1",
                  description=__doc__, lifespan=lifespan)
    app.state.table = table

    @app.middleware("http")
    async def limit_body(request: Request, call_next: Callable) -> Any:
        size = request.headers.get("content-length", "")
        if size.isdigit() and int(size) > max_body:
            return JSONResponse({"detail": f"request body over {max_body} bytes"}, status_code=413)
        return await call_next(request)

    # Handlers are plain `def`: FastAPI runs them in its thread pool, so a slow env blocks
    # only its own callers; each env's lock keeps concurrent calls on one id in order.
    @app.get("/", summary="Health")
    def health() -> HealthResponse:
        return HealthResponse(env=env_name, envs=len(table), max_envs=max_envs)

    @app.post("/create", summary="Create an env", responses={
        429: {"model": ErrorResponse, "description": "Too many envs open."}, 500: _ERRORS[500]})
    def create() -> CreateResponse:
        return CreateResponse(id=table.create())

    @app.post("/reset", summary="Start an episode", responses=_ERRORS)
    def reset(req: ResetRequest) -> ResetResponse:
        slot = table.get(req.id)
        with slot.lock:
            obs, info = _env_call("reset", lambda: slot.env.reset(seed=req.data_idx,
                                                                  options=req.options))
            slot.observation = obs
        return ResetResponse(observation=utf8_safe(obs), info=_jsonable(info))

    @app.post("/step", summary="Take one action", responses=_ERRORS)
    def step(req: StepRequest) -> StepResponse:
        if len(req.action) > max_action_chars:
            raise HTTPException(413, f"action of {len(req.action)} characters; the limit is "
                                f"{max_action_chars}")
        slot = table.get(req.id)
        with slot.lock:
            _started(slot, req.id)
            result = _env_call("step", lambda: slot.env.step(utf8_safe(req.action)))
            slot.observation = result.observation
        info = _jsonable(result.info)
        score = info.get("score")
        ok = isinstance(score, int | float) and not isinstance(score, bool)
        return StepResponse(
            observation=utf8_safe(result.observation), reward=float(result.reward),
            score=float(score) if ok else float(result.reward), info=info,
            done=result.terminated or result.truncated, terminated=result.terminated,
            truncated=result.truncated,
        )

    @app.get("/observation", summary="The current observation", responses=_ERRORS)
    def observation(id: int | None = Query(None, description=_ID_DOC),
                    env_idx: int | None = Query(None, include_in_schema=False)) -> str:
        env_id = _query_id(id, env_idx)
        slot = table.get(env_id)
        with slot.lock:
            return utf8_safe(_started(slot, env_id))

    @app.get("/oracle", summary="The scripted agent's next action", responses=_ERRORS | {
        501: {"model": ErrorResponse, "description": "The env has no oracle."}})
    def oracle(id: int | None = Query(None, description=_ID_DOC),
               env_idx: int | None = Query(None, include_in_schema=False)) -> OracleResponse:
        env_id = _query_id(id, env_idx)
        slot = table.get(env_id)
        fn = getattr(slot.env, "oracle_action", None)
        if fn is None:
            raise HTTPException(501, f"env {env_name!r} has no oracle_action()")
        with slot.lock:
            _started(slot, env_id)
            return OracleResponse(action=_env_call("oracle", fn))

    @app.post("/close", summary="Close an env", responses=_ERRORS)
    def close(req: CloseRequest) -> CloseResponse:
        table.close(req.id)
        return CloseResponse(closed=True)

    return app


def _query_id(id_: int | None, env_idx: int | None) -> int:
    """The env id of a GET: `?id=`, or AgentGym's `?env_idx=`."""
    env_id = id_ if id_ is not None else env_idx
    if env_id is None:
        # Shaped like FastAPI's own validation errors, which is what the schema documents.
        raise HTTPException(422, [{"loc": ["query", "id"], "type": "missing",
                                   "msg": "query parameter 'id' is required"}])
    return env_id


def _started(slot: _Slot, env_id: int) -> str:
    """The slot's observation; 409 if the env was never reset."""
    if slot.observation is None:
        raise HTTPException(409, f"env {env_id} has not been reset: POST /reset first")
    return slot.observation


def serve(
    env_name: str,
    env_kwargs: dict[str, Any] | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_envs: int = DEFAULT_MAX_ENVS,
) -> None:
    """Serve until interrupted. Builds one env first so bad kwargs fail now, not on /create;
    prints the URL once the port listens (port 0 picks a free one and prints it)."""
    import uvicorn

    try:
        make_env(env_name, **(env_kwargs or {})).close()
    except Exception as exc:
        raise ValueError(f"cannot build env {env_name!r} with {env_kwargs}: {exc!r}") from exc
    app = create_app(env_name, env_kwargs, max_envs=max_envs)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    # A server restarted on the same port must not wait out the old one's TIME_WAIT sockets.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"horizonrl env-server: warning: listening on {host} without authentication; "
              "anyone who reaches this port can drive the envs", flush=True)
    print(f"horizonrl env-server: serving {env_name} at http://{shown}:{bound} "
          f"(API docs: http://{shown}:{bound}/docs)", flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
