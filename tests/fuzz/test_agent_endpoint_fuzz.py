"""Schemathesis against the agent endpoint's own OpenAPI schema (actors/openai_server.py):
generated requests never get a 5xx, never stop the server, and responses match the schema.
The real FastAPI app runs in-process over ASGI (no sockets) over real `AgentSession`s (the tiny
model's tokenizer, chat template and hermes parser); a thread plays the rollout loop as
actors/agent_episodes.py does (`session.prompt(body)`, then a fixed reply for the engine's,
then `session.complete`), so a generated body goes all the way through the session path.

The schema names no auth header: most generated requests are given a live episode's key
(`Authorization: Bearer` or `X-Episode-Key`), the rest an unknown key or none (401), so both the
body's validation and the session are exercised, not only the key check."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from horizonrl.actors.agent_sessions import AgentRequestError, AgentSession, AgentSessions
from horizonrl.actors.openai_server import RequestQueue, create_app
from horizonrl.actors.rollout import Completion
from horizonrl.actors.tool_calls import offered_names
from horizonrl.protos.chat import TOOL_CALL_END, TOOL_CALL_START
from horizonrl.protos.messages import ROLES

pytestmark = pytest.mark.fuzz

MAX_BYTES = 64 * 1024
SESSIONS = AgentSessions()
REQUESTS = RequestQueue()
APP = create_app(SESSIONS, REQUESTS, model="horizonrl-tiny", max_request_bytes=MAX_BYTES,
                 request_timeout_s=20.0)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)

KEYS: list[str] = []  # the open sessions' keys
CASES: Counter[str] = Counter()
STATUS: Counter[int] = Counter()
MODES: Counter[str] = Counter()  # "positive 200", "negative 400", ...: schema-valid or not
AUTH: Counter[str] = Counter()  # which key a generated request carried
SESSION: Counter[str] = Counter()  # what the rollout thread did: "answered" or an error code
CRASHES: list[tuple[str, str]] = []  # (exception, body) the session raised unexpectedly
EXAMPLES = 1000  # per operation and phase; small inputs exhaust early, so the total is checked
TURNS_KEPT = 32  # a session's turns are cleared past this, so no episode reaches its horizon
_ROLL = itertools.count()
_REPAIR = itertools.count()
BODIES: Counter[str] = Counter()  # chat bodies given renderable messages, and a tool
TOOL = {"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}


def _rollout(stop: threading.Event, encode, end_id: int) -> None:
    """The rollout loop's part: each queued request is prompted in its session and answered
    as if the engine sampled a fixed reply: "Action: inventory", or, every other time the
    request offers tools, a call of the first offered function (the tool-call path of
    `complete`); a session's refusal is the request's answer."""
    deadline = time.monotonic() + 600  # bounded even if the module never sets `stop`
    text = encode("Action: inventory") + [end_id]
    n = 0
    while not stop.is_set() and time.monotonic() < deadline:
        for call in REQUESTS.drain(0.05):
            session = SESSIONS.get(call.key)
            if session is None:
                SESSION["invalid_api_key"] += 1
                call.reply.set_exception(AgentRequestError(401, "invalid_api_key", "finished"))
                continue
            if len(session.turns) >= TURNS_KEPT:
                session.turns.clear()
                session.history, session.tools = [], None
            try:
                session.prompt(call.body)
            except AgentRequestError as exc:
                SESSION[exc.code] += 1
                call.reply.set_exception(exc)
                continue
            except Exception as exc:  # the real loop would stop the rollout: a finding
                CRASHES.append((repr(exc), repr(call.body)[:300]))
                call.reply.set_exception(exc)
                continue
            n += 1
            names = offered_names(session.pending.tools)
            ids = text
            if names and n % 2:
                call_json = json.dumps({"name": names[0], "arguments": {"item": "stick"}})
                ids = encode(f"{TOOL_CALL_START}{call_json}{TOOL_CALL_END}") + [end_id]
            out = session.complete(Completion(tuple(ids), tuple([-0.25] * len(ids)), "stop"))
            SESSION["answered " + out["choices"][0]["finish_reason"]] += 1
            call.reply.set_result(out)


@pytest.fixture(scope="module", autouse=True)
def rollout(tokenizer, request):
    from horizonrl.actors.tool_calls import parse_hermes
    from horizonrl.protos.chat import ChatFormat
    from horizonrl.protos.messages import Renderer

    end_id = ChatFormat(tokenizer).im_end_id
    for _ in range(4):
        session = AgentSession(renderer=Renderer(tokenizer), parser=parse_hermes,
                               horizon=TURNS_KEPT + 1, max_context_tokens=1 << 20,
                               max_tokens=64, version=1, end_id=end_id)
        SESSIONS.open(session)
        KEYS.append(session.key)
    stop = threading.Event()
    thread = threading.Thread(target=_rollout, args=(stop, Renderer(tokenizer).encode, end_id),
                              daemon=True, name="fuzz-rollout")
    thread.start()
    yield
    total = sum(CASES.values())
    print(f"\nagent endpoint fuzz: {total} requests over {len(CASES)} operations; status "
          f"codes {dict(sorted(STATUS.items()))} (by schema: {dict(sorted(MODES.items()))}); "
          f"keys {dict(AUTH)}; session path {dict(SESSION.most_common())}; bodies changed "
          f"{dict(BODIES)}")
    try:
        _still_serves()
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert not CRASHES, CRASHES[:5]
    if any(item.originalname == "test_no_5xx_and_schema_conformant"
           for item in request.session.items):
        assert total >= 600, total
        # The session path was reached, not only the key and body checks.
        assert SESSION["answered stop"] >= 50 and SESSION["answered tool_calls"] >= 5, SESSION


def _still_serves() -> None:
    from fastapi.testclient import TestClient

    client = TestClient(APP)
    assert client.get("/").json() == {"status": "ok", "episodes": len(KEYS)}
    for key in KEYS:  # each session starts a fresh conversation (an edit) and is answered
        r = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                        json={"messages": [{"role": "user", "content": "Goal: craft a stick."}]})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "Action: inventory"


def _with_key(case) -> None:
    """Give the case a key: a live one as a bearer token (7 in 10) or as X-Episode-Key (1 in
    10), an unknown one (1 in 10) or none (1 in 10)."""
    n = next(_ROLL)
    headers = dict(case.headers or {})
    key = KEYS[n % len(KEYS)]
    kind = {7: "x-episode-key", 8: "unknown", 9: "none"}.get(n % 10, "bearer")
    if kind == "bearer":
        headers["Authorization"] = f"Bearer {key}"
    elif kind == "x-episode-key":
        headers["X-Episode-Key"] = key
    elif kind == "unknown":
        headers["Authorization"] = "Bearer not-an-episode"
    case.headers = headers
    AUTH[kind] += 1


def _renderable(case) -> None:
    """Half the schema-valid chat bodies with a list of object messages get each message a
    role and text content (the schema cannot say so), and half of those a function among
    their tools, keeping every other generated field, so the chat template, the session's
    checks and the reply's tool call see generated messages, tools and tool_choice rather
    than most bodies stopping at the role check."""
    if case.meta is not None and case.meta.generation.mode.is_negative:
        return  # a schema-violating body stays as generated (and must be refused)
    body = case.body
    if not (isinstance(body, dict) and isinstance(body.get("messages"), list)
            and body["messages"] and all(isinstance(m, dict) for m in body["messages"])):
        return
    n = next(_REPAIR)
    if n % 2:
        return
    for i, m in enumerate(body["messages"]):
        if m.get("role") not in ROLES:
            m["role"] = ROLES[i % len(ROLES)]
        if not (m.get("content") is None or isinstance(m["content"], str)):
            m["content"] = str(m["content"])
    BODIES["renderable"] += 1
    if n % 4 == 0:  # and a function to call, after whatever tools were generated
        tools = body.get("tools") if isinstance(body.get("tools"), list) else []
        body["tools"] = [*tools, TOOL]
        BODIES["with a tool"] += 1


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_no_5xx_and_schema_conformant(case):
    _with_key(case)
    _renderable(case)
    response = case.call()
    CASES[case.operation.label] += 1
    STATUS[response.status_code] += 1
    if case.meta is not None:
        MODES[f"{case.meta.generation.mode.value} {response.status_code}"] += 1
    assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])
    # The schema cannot say what the session checks (roles, tool_choice against tools, the
    # context): a schema-valid body refused with a 400 is right, so that one check is left
    # out; every other one (status codes and bodies documented, content types, negative data
    # rejected) runs.
    case.validate_response(response, excluded_checks=[positive_data_acceptance])


@pytest.fixture()
def client():
    from fastapi.testclient import TestClient

    return TestClient(APP)


def _openai_error(r, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "code"} and err["message"], err
    assert err["code"] == code and err["type"] == "invalid_request_error", err


def test_bad_requests_get_openai_errors(client):
    auth = {"Authorization": f"Bearer {KEYS[0]}"}
    chat = "/v1/chat/completions"
    ok = {"messages": [{"role": "user", "content": "hi"}]}
    _openai_error(client.post(chat, headers=auth, json={**ok, "pad": "x" * MAX_BYTES}), 413,
                  "request_too_large")
    # A chunked body names no length: it is measured.
    _openai_error(client.post(chat, headers={**auth, "Content-Type": "application/json"},
                              content=iter([b'{"messages": [], "pad": "', b"x" * MAX_BYTES,
                                            b'"}'])), 413, "request_too_large")
    _openai_error(client.post(chat, headers={**auth, "Content-Type": "application/json"},
                              content=b'{"messages": [{"role": '), 400, "invalid_request")
    _openai_error(client.post(chat, headers={"Authorization": "Bearer nope"}, json=ok), 401,
                  "invalid_api_key")
    _openai_error(client.post(chat, json=ok), 401, "invalid_api_key")
    _openai_error(client.get("/v1/models", headers={"X-Episode-Key": "nope"}), 401,
                  "invalid_api_key")
    _openai_error(client.post(chat, headers=auth, json={**ok, "stream": True}), 400,
                  "unsupported")
    _openai_error(client.post(chat, headers=auth, json={**ok, "n": 2}), 400, "unsupported")
    _openai_error(client.post(chat, headers=auth, json={"messages": "hi"}), 400,
                  "invalid_request")
    # Refused by the session on the rollout thread, answered in the same shape.
    _openai_error(client.post(chat, headers=auth, json={"messages": [{"role": "robot"}]}), 400,
                  "invalid_messages")
    _openai_error(client.post(chat, headers=auth, json={**ok, "tool_choice": "required"}),
                  400, "invalid_tool_choice")
    # A named tool_choice whose `function` is not an object is refused by the server; it
    # used to reach the rollout thread and raise there (AttributeError in check_tool_choice).
    tools = [TOOL]
    _openai_error(client.post(chat, headers=auth, json={**ok, "tools": tools,
                                                        "tool_choice": {"function": "get"}}),
                  400, "invalid_request")
    r = client.post(chat, headers=auth, json={**ok, "tools": tools, "tool_choice": {
        "type": "function", "function": {"name": "get"}}})
    assert r.status_code == 200, r.text
    _openai_error(client.post(chat, headers={**auth, "Content-Type": "application/json"},
                              content=b'{"messages": "\xff"}'), 400, "invalid_request")
    _openai_error(client.get("/v2/nothing", headers=auth), 404, "not_found")
    r = client.post(chat, headers=auth, json=ok)
    assert r.status_code == 200 and r.json()["object"] == "chat.completion", r.text
    assert client.get("/v1/models", headers=auth).json()["data"][0]["id"] == "horizonrl-tiny"
