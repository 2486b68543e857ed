"""An OpenAI-compatible endpoint over a generator's own engine, for agents horizonrl does not
run: `POST /v1/chat/completions`, `GET /v1/models`, `GET /` (health).

Each episode's API key (`Authorization: Bearer <key>`, or an `X-Episode-Key` header) names its
session (actors/agent_sessions.py); an unknown or finished one is a 401. The server thread only
validates and queues: the rollout loop (actors/agent_episodes.py) renders the prompt, runs the
engine and answers, so engine and sessions stay on one thread. Bad input is a 4xx in OpenAI's
error shape (`{"error": {"message", "type", "code"}}`): malformed JSON or fields 400, a body over
the limit 413, `stream` or `n` > 1 400 (not supported). Binds to 127.0.0.1 unless configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import socket
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator
from starlette.exceptions import HTTPException

from horizonrl.actors.agent_sessions import AgentRequestError, AgentSessions

log = logging.getLogger(__name__)


class FunctionName(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str


class NamedToolChoice(BaseModel):
    """`tool_choice` naming a function: its `function` must be an object with a string
    `name` (anything else is a 400 here, not an error on the rollout thread)."""

    model_config = ConfigDict(extra="allow")

    function: FunctionName


class ChatRequest(BaseModel):
    """The fields of OpenAI's chat request the endpoint reads; others are accepted and ignored
    (`temperature` among them: the run's generator.temperature applies, as the learner
    reproduces the distribution sampled from)."""

    model_config = ConfigDict(extra="allow")

    messages: list[dict[str, Any]] = Field(description="The conversation so far.")
    model: str | None = Field(None, description="Any name; the generator's policy answers.")
    tools: list[dict[str, Any]] | None = Field(None, description="Functions the model may call.")
    tool_choice: str | NamedToolChoice | None = Field(
        None, description="none | auto | required | {\"type\": \"function\", \"function\": "
        "{\"name\"}}; auto when tools are given.")
    max_tokens: StrictInt | None = Field(None, ge=1, description="Reply budget (capped at "
                                         "the run's generator.max_tokens_per_turn).")
    max_completion_tokens: StrictInt | None = Field(None, ge=1, description="As max_tokens.")
    stream: StrictBool | None = Field(False, description="Streaming is not supported.")
    n: StrictInt | None = Field(1, description="Only 1.")

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _named(cls, value: Any) -> Any:
        """One clear message for a malformed named choice (not one per member of the union)."""
        fn = value.get("function") if isinstance(value, dict) else None
        if isinstance(value, dict) and not (isinstance(fn, dict)
                                            and isinstance(fn.get("name"), str)):
            raise ValueError('a named tool_choice is {"type": "function", "function": '
                             '{"name": <string>}}')
        return value


class ErrorDetail(BaseModel):
    message: str
    type: str
    code: str


class ErrorBody(BaseModel):
    """OpenAI's error shape, which every refusal has."""

    error: ErrorDetail


def _documented(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The error statuses a route answers with, for its OpenAPI schema."""
    return {code: {"model": ErrorBody} for code in codes}


@dataclass(slots=True)
class Call:
    """A queued request: its session key, body, and the future the rollout loop answers."""

    key: str
    body: dict[str, Any]
    reply: Future = field(default_factory=Future)


class RequestQueue:
    """Requests from the server thread to the rollout loop."""

    def __init__(self) -> None:
        self._q: queue.Queue[Call] = queue.Queue()

    def put(self, key: str, body: dict[str, Any]) -> Future:
        call = Call(key, body)
        self._q.put(call)
        return call.reply

    def drain(self, wait_s: float = 0.0) -> list[Call]:
        """The requests queued now; with `wait_s`, first waits that long for one."""
        out = []
        with contextlib.suppress(queue.Empty):
            out.append(self._q.get(timeout=wait_s) if wait_s > 0 else self._q.get_nowait())
            while True:
                out.append(self._q.get_nowait())
        return out


def error(status: int, code: str, message: str,
          headers: dict[str, str] | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "code": code}}, status,
                        headers=headers)


class BodyLimit:
    """Refuse a request body over `limit` bytes with 413, before any handler reads it: by its
    Content-Length, or (chunked) by counting as it arrives. A plain ASGI middleware: Starlette's
    `BaseHTTPMiddleware` costs a task group per request, on the path of every model turn."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        size = dict(scope["headers"]).get(b"content-length")
        if size is not None and (not size.isdigit() or int(size) > self.limit):
            return await self._refuse(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                return await self._refuse(scope, receive, send)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)

    async def _refuse(self, scope: dict, receive: Any, send: Any) -> None:
        await error(413, "request_too_large", f"request body over {self.limit} bytes "
                    "(agent.max_request_bytes)")(scope, receive, send)


def create_app(sessions: AgentSessions, requests: RequestQueue, *, model: str,
               max_request_bytes: int, request_timeout_s: float) -> FastAPI:
    app = FastAPI(title="horizonrl agent endpoint",
                  description="OpenAI-compatible chat completions over a generator's policy.")

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return error(400, "invalid_request", f"{where}: {first.get('msg', 'invalid request')}")

    @app.exception_handler(HTTPException)
    async def refused(request: Request, exc: HTTPException) -> JSONResponse:
        """FastAPI's own refusals (a body that is not UTF-8, an unknown path or method) in
        the same shape."""
        code = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}.get(
            exc.status_code, "http_error")
        return error(exc.status_code, code, str(exc.detail), getattr(exc, "headers", None))

    app.add_middleware(BodyLimit, limit=max_request_bytes)

    def session_key(request: Request) -> str | None:
        auth = request.headers.get("authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        key = key or request.headers.get("x-episode-key", "").strip()
        return key if key and sessions.get(key) is not None else None

    @app.get("/")
    def health() -> dict[str, Any]:
        return {"status": "ok", "episodes": len(sessions)}

    @app.get("/v1/models", responses=_documented(401))
    def models(request: Request) -> Any:
        if session_key(request) is None:
            return error(401, "invalid_api_key", "unknown or finished episode key")
        return {"object": "list", "data": [{"id": model, "object": "model",
                                            "owned_by": "horizonrl"}]}

    @app.post("/v1/chat/completions", responses=_documented(400, 401, 409, 413, 503, 504))
    async def chat(req: ChatRequest, request: Request) -> Any:
        key = session_key(request)
        if key is None:
            return error(401, "invalid_api_key", "unknown or finished episode key: each "
                         "episode's key is valid while it runs")
        if req.stream:
            return error(400, "unsupported", "stream=true is not supported")
        if (req.n or 1) != 1:
            return error(400, "unsupported", "only n=1 is supported")
        body = req.model_dump(exclude_none=True)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(requests.put(key, body)),
                                          request_timeout_s)
        except AgentRequestError as exc:
            return error(exc.status, exc.code, exc.message)
        except TimeoutError:
            return error(504, "timeout", f"no reply within {request_timeout_s}s")

    return app


class AgentEndpoint:
    """The endpoint's uvicorn server on a thread of the generator's process."""

    def __init__(self, sessions: AgentSessions, requests: RequestQueue, *, host: str, port: int,
                 model: str, max_request_bytes: int, request_timeout_s: float) -> None:
        import uvicorn

        app = create_app(sessions, requests, model=model, max_request_bytes=max_request_bytes,
                         request_timeout_s=request_timeout_s)
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(1024)
        self.host, self.port = host, self._sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning",
                                                     timeout_keep_alive=30))
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._sock]}, daemon=True,
                                        name="agent-endpoint")
        self._thread.start()

    def base_url(self, host: str | None = None) -> str:
        """The URL agents use (`host`: how they reach this node, when bound to all)."""
        return f"http://{host or self.host}:{self.port}/v1"

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
