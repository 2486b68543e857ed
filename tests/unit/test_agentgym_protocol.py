"""The AgentGym env-server protocol without a network: the client against scripted answers
(httpx.MockTransport), the server through FastAPI's TestClient, and the two joined in-process."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from horizonrl.envpool import env_server
from horizonrl.envpool.agentgym_http import (
    AgentGymConnectionError,
    AgentGymEnvLostError,
    AgentGymHTTPEnv,
    AgentGymProtocolError,
    AgentGymServerError,
    format_action,
    parse_action,
    random_action,
)
from horizonrl.envpool.base import StepResult

Answer = Callable[[httpx.Request], Any]
STEP_OK = {"observation": "You see a door.", "reward": 0.0, "score": 0.0, "done": False}


def _client(routes: dict[str, Any], calls: list[httpx.Request] | None = None,
            **kwargs: Any) -> AgentGymHTTPEnv:
    """An env whose server is `routes`: "METHOD /path" -> a JSON answer, an httpx.Response,
    or a function of the request giving either (or raising a transport error)."""
    calls = [] if calls is None else calls

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        answer = routes.get(f"{request.method} {request.url.path}")
        if callable(answer):
            answer = answer(request)
        if answer is None:
            return httpx.Response(404, json={"detail": "Not Found"})
        return answer if isinstance(answer, httpx.Response) else httpx.Response(200, json=answer)

    http = httpx.Client(base_url="http://env.test", transport=httpx.MockTransport(handle))
    kwargs.setdefault("backoff_s", 0.0)
    return AgentGymHTTPEnv("http://env.test", http_client=http, **kwargs)


def _routes(step: Any = None) -> dict[str, Any]:
    """A server that answers the protocol's plain shapes (override entries with `|`)."""
    return {"POST /create": {"id": 7}, "POST /reset": {"observation": "start"},
            "POST /step": STEP_OK if step is None else step, "POST /close": {"closed": True}}


def _body(request: httpx.Request) -> dict[str, Any]:
    return json.loads(request.content)


# ------------------------------------------------------------------------- client parsing
@pytest.mark.parametrize(("answer", "terminated", "truncated"), [
    ({"done": True}, True, False),
    ({"done": False}, False, False),
    ({"terminated": True, "truncated": False}, True, False),
    ({"terminated": False, "truncated": True}, False, True),
    ({"truncated": True}, False, True),
    ({"done": True, "terminated": False, "truncated": True}, False, True),  # the pair wins
])
def test_done_or_terminated_truncated(answer, terminated, truncated):
    env = _client(_routes(step={"observation": "o", "reward": 1.0, **answer}))
    env.reset(seed=3)
    result = env.step("go")
    assert (result.terminated, result.truncated) == (terminated, truncated)
    assert result.info["success"] == (terminated or truncated)  # default: done and reward > 0


def test_id_or_env_idx_follows_create():
    calls: list[httpx.Request] = []
    env = _client(_routes(step={"state": "page", "reward": 0, "done": 0}) | {
        "POST /create": {"env_idx": 4}, "GET /observation": "page text"}, calls)
    env.reset(seed=12)
    assert env.step("click").observation == "page"  # WebShop calls the observation "state"
    assert env.observation() == "page text"
    sent = {f"{c.method} {c.url.path}": c for c in calls}
    assert _body(sent["POST /reset"]) == {"env_idx": 4, "data_idx": 12}
    assert _body(sent["POST /step"]) == {"env_idx": 4, "action": "click"}
    assert sent["GET /observation"].url.params["env_idx"] == "4"

    calls.clear()
    env = _client(_routes() | {"POST /create": 9}, calls)  # a bare int, as WebShop answers
    env.reset(seed=None)
    assert _body(calls[-1]) == {"id": 9, "data_idx": 0}


def test_reset_shapes_and_info_pass_through():
    env = _client(_routes(step={**STEP_OK, "reward": 1.0, "done": True, "info": {
        "available_actions": ["a", "b"], "custom": 1}}) | {
        "POST /reset": ["first page", None]})  # WebShop's [observation, None]
    obs, info = env.reset(seed=1)
    assert obs == "first page"
    assert info == {"invalid_action": False, "success": False, "score": 0.0}
    result = env.step("a")
    assert result.info["available_actions"] == ["a", "b"] and result.info["custom"] == 1
    assert result.info["success"] is True and result.info["score"] == 0.0  # the sent score
    env = _client(_routes(step={"observation": "Invalid action: x", "reward": 2, "done": False,
                                "info": {"success": True}}))
    env.reset()
    result = env.step("x")
    assert result.info == {"success": True, "invalid_action": True, "score": 2.0}


@pytest.mark.parametrize(("routes", "needle"), [
    ({"POST /create": {"ok": True}}, "POST /create"),
    ({"POST /create": "seven"}, "POST /create"),
    ({"POST /reset": {"id": 7}, "GET /observation": {"text": "x"}}, "'observation' or 'state'"),
    ({"POST /step": {"reward": 0, "done": False}}, "'observation' or 'state'"),
    ({"POST /step": {"observation": "o", "done": False}}, "'reward' is missing"),
    ({"POST /step": {"observation": "o", "reward": "1", "done": False}}, "'reward' is str"),
    ({"POST /step": {"observation": "o", "reward": 0}}, "neither 'done'"),
    ({"POST /step": {"observation": "o", "reward": 0, "done": "no"}}, "'done' is str"),
    ({"POST /step": {"observation": 3, "reward": 0, "done": False}}, "'observation' is int"),
    ({"POST /step": {**STEP_OK, "info": [1]}}, "'info' is list"),
    ({"POST /step": [1, 2]}, "expected a JSON object"),
    ({"POST /step": httpx.Response(200, text="<html>")}, "not JSON"),
])
def test_protocol_mismatch_names_endpoint_and_field(routes, needle):
    env = _client(_routes() | routes)
    with pytest.raises(AgentGymProtocolError) as err:
        env.reset(seed=0)
        env.step("go")
    assert needle in str(err.value)
    assert str(err.value).split(":")[0] in {"POST /create", "POST /reset", "POST /step",
                                            "GET /observation"}


def test_http_errors_are_not_retried_and_error_fields_raise():
    calls: list[httpx.Request] = []
    env = _client(_routes(step=httpx.Response(400, json={"detail": "bad action"})), calls,
                  retries=5)
    env.reset(seed=0)
    before = len(calls)
    with pytest.raises(AgentGymServerError, match=r"POST /step -> HTTP 400: bad action") as err:
        env.step("go")
    assert err.value.status == 400 and len(calls) == before + 1
    env = _client(_routes(step={"error": "The id 7 is not valid."}))  # AgentGym's 200 errors
    env.reset(seed=0)
    with pytest.raises(AgentGymServerError, match="not valid"):
        env.step("go")


def test_connect_errors_are_retried_then_named():
    calls: list[httpx.Request] = []

    def refuse(request: httpx.Request) -> Any:
        raise httpx.ConnectError("Connection refused", request=request)

    env = _client({"POST /create": refuse}, calls, retries=3)
    with pytest.raises(AgentGymConnectionError) as err:
        env.reset(seed=0)
    assert len(calls) == 4
    assert "POST /create" in str(err.value) and "http://env.test" in str(err.value)
    assert "after 4 attempts" in str(err.value)

    flaky = iter([True, True, False])  # refused twice, then the server is up

    def create(request: httpx.Request) -> Any:
        return refuse(request) if next(flaky) else {"id": 1}

    env = _client(_routes() | {"POST /create": create}, retries=2)
    assert env.reset(seed=0)[0] == "start"


def test_a_post_that_may_have_acted_is_not_resent():
    calls: list[httpx.Request] = []

    def cut(request: httpx.Request) -> Any:
        raise httpx.ReadError("connection reset", request=request)

    env = _client(_routes(step=cut), calls, retries=3)
    env.reset(seed=0)
    with pytest.raises(AgentGymConnectionError, match="not resent"):
        env.step("go")
    assert [c.url.path for c in calls].count("/step") == 1


def test_lost_env_step_raises_then_reset_creates_a_new_one():
    created = iter(range(100, 110))
    server = {"restarted": False}
    gone = httpx.Response(404, json={"detail": "unknown env id 100"})

    def step(request: httpx.Request) -> Any:
        server["restarted"] = True  # the server restarted just before this step
        return gone

    def reset(request: httpx.Request) -> Any:
        env_id = _body(request)["id"]
        return gone if server["restarted"] and env_id == 100 else {"observation": f"env {env_id}"}

    env = _client(_routes(step=step) | {"POST /create": lambda r: {"id": next(created)},
                                        "POST /reset": reset})
    assert env.reset(seed=0)[0] == "env 100"
    with pytest.raises(AgentGymEnvLostError, match="restarted"):
        env.step("go")
    assert env.env_id is None
    with pytest.raises(RuntimeError, match="reset"):
        env.step("go")
    assert env.reset(seed=0)[0] == "env 101"


def test_oracle_missing_is_a_clear_error():
    env = _client(_routes())
    env.reset(seed=0)
    with pytest.raises(AgentGymProtocolError, match=r"GET /oracle: .*offers no oracle"):
        env.oracle_action()
    env = _client(_routes() | {"GET /oracle": {"action": "turn left"}})
    env.reset(seed=0)
    assert env.oracle_action() == "turn left"


def test_close_never_raises_and_odd_actions_never_raise():
    calls: list[httpx.Request] = []

    def down(request: httpx.Request) -> Any:
        raise httpx.ConnectError("Connection refused", request=request)

    env = _client(_routes() | {"POST /close": down}, calls)
    env.reset(seed=0)
    sent = len(calls)
    huge = env.step("x" * 1_000_000)  # answered here, not sent
    assert len(calls) == sent and huge.info["invalid_action"]
    assert huge.observation.startswith("Invalid action") and huge.reward == 0.0
    assert not env.step("\ud800 \x00\x1b[2J").info["invalid_action"]  # sent after repair
    assert "\ufffd" not in _body(calls[-1])["action"]  # lone surrogate became "?"
    env.close()
    env.close()
    assert env.env_id is None


def test_module_helpers():
    import random

    for action in ["click[Buy Now]", "search[red shoes]", "go to red ball 1"]:
        assert parse_action(format_action(action)) == action
    assert parse_action("Thought: hmm\nAction:  look   around \n") == "look around"
    rng = random.Random(0)
    assert {random_action({"available_actions": ["a", "b"]}, rng) for _ in range(50)} == {"a", "b"}
    with pytest.raises(ValueError, match="available_actions"):
        random_action({}, rng)


# --------------------------------------------------------------------------------- server
@pytest.fixture()
def app_client() -> TestClient:
    return TestClient(env_server.create_app("babyai", {}, max_envs=2, max_action_chars=100))


def test_server_protocol_round_trip(app_client):
    c = app_client
    assert c.get("/").json() == {"status": "ok", "env": "babyai", "envs": 0, "max_envs": 2}
    env_id = c.post("/create").json()["id"]
    reset = c.post("/reset", json={"id": env_id, "data_idx": 1_000_003}).json()
    assert reset["observation"].startswith("Mission:") and "available_actions" in reset["info"]
    assert c.get("/observation", params={"id": env_id}).json() == reset["observation"]
    action = c.get("/oracle", params={"id": env_id}).json()["action"]
    assert action in reset["info"]["available_actions"]
    step = c.post("/step", json={"env_idx": env_id, "action": action}).json()  # AgentGym naming
    assert set(step) == {"observation", "reward", "score", "done", "terminated", "truncated",
                         "info"}
    assert step["info"]["invalid_action"] is False
    assert c.get("/observation", params={"env_idx": env_id}).json() == step["observation"]
    bad = c.post("/step", json={"id": env_id, "action": "\x00 fly"}).json()
    assert bad["observation"].startswith("Invalid action") and bad["info"]["invalid_action"]
    assert c.post("/close", json={"id": env_id}).json() == {"closed": True}
    assert c.get("/").json()["envs"] == 0


def test_server_error_codes(app_client):
    c = app_client
    env_id = c.post("/create").json()["id"]
    assert c.post("/step", json={"id": env_id, "action": "turn left"}).status_code == 409
    assert c.get("/oracle", params={"id": env_id}).status_code == 409
    c.post("/reset", json={"id": env_id})
    for method, path, kw in [("post", "/step", {"json": {"id": env_id + 1, "action": "a"}}),
                             ("post", "/reset", {"json": {"id": -5}}),
                             ("get", "/observation", {"params": {"id": env_id + 1}}),
                             ("get", "/oracle", {"params": {"id": env_id + 1}}),
                             ("post", "/close", {"json": {"id": env_id + 1}})]:
        r = getattr(c, method)(path, **kw)
        assert r.status_code == 404 and "unknown env id" in r.json()["detail"], (path, r.text)
    headers = {"content-type": "application/json"}
    for body in [b"{not json", b"[1, 2]", b'{"id": "1", "action": "a"}', b'{"action": "a"}',
                 json.dumps({"id": env_id, "action": 5}).encode(), b'{"id": true, "action": "a"}']:
        assert c.post("/step", content=body, headers=headers).status_code == 422, body
    assert c.post("/reset", json={"id": env_id, "data_idx": -1}).status_code == 422
    assert c.post("/reset", json={"id": env_id, "data_idx": 1.5}).status_code == 422
    assert c.get("/observation").status_code == 422
    r = c.post("/step", json={"id": env_id, "action": "x" * 101})
    assert r.status_code == 413 and "limit is 100" in r.json()["detail"]
    r = c.post("/step", json={"id": env_id, "action": "x" * 100_000})  # refused unread
    assert r.status_code == 413
    assert c.post("/create").status_code == 200
    r = c.post("/create")
    assert r.status_code == 429 and "--max-envs" in r.json()["detail"]
    assert c.post("/step", json={"id": env_id, "action": "turn left"}).status_code == 200


class _FakeEnv:
    """Counts overlapping steps (a missing lock shows as overlap) and fails on "boom"."""

    inside = 0
    overlaps = 0
    steps = 0

    def reset(self, *, seed=None, options=None):
        return "ready", {"invalid_action": False, "success": False}

    def step(self, action: str) -> StepResult:
        if action == "boom":
            raise RuntimeError("the simulator crashed")
        cls = type(self)
        cls.inside += 1
        cls.overlaps += cls.inside > 1
        time.sleep(0.003)
        cls.steps += 1
        cls.inside -= 1
        return StepResult("ok", 0.0, False, False, {"invalid_action": False, "success": False})

    def close(self) -> None:
        pass


def test_env_exception_is_500_and_one_env_is_stepped_one_call_at_a_time(monkeypatch):
    monkeypatch.setattr(env_server, "make_env", lambda name, **kw: _FakeEnv())
    monkeypatch.setattr(_FakeEnv, "overlaps", 0)
    monkeypatch.setattr(_FakeEnv, "steps", 0)
    c = TestClient(env_server.create_app("babyai"))
    env_id = c.post("/create").json()["id"]
    c.post("/reset", json={"id": env_id})
    r = c.post("/step", json={"id": env_id, "action": "boom"})
    assert r.status_code == 500 and "the simulator crashed" in r.json()["detail"]
    assert c.get("/oracle", params={"id": env_id}).status_code == 501  # no oracle_action()
    codes: list[int] = []

    def worker() -> None:
        for _ in range(5):
            codes.append(c.post("/step", json={"id": env_id, "action": "a"}).status_code)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert codes == [200] * 30 and _FakeEnv.steps == 30
    assert _FakeEnv.overlaps == 0


def test_openapi_documents_the_protocol(app_client):
    spec = app_client.get("/openapi.json").json()
    paths = {"/", "/create", "/reset", "/step", "/observation", "/oracle", "/close"}
    assert paths <= set(spec["paths"])
    step = spec["components"]["schemas"]["StepRequest"]
    assert "Invalid action" in step["properties"]["action"]["description"]
    assert "done" in spec["components"]["schemas"]["StepResponse"]["properties"]
    assert app_client.get("/docs").status_code == 200


# close() bounds its own timeout, which the TestClient (unlike httpx) frowns upon.
@pytest.mark.filterwarnings("ignore:You should not use the 'timeout' argument")
def test_client_and_server_together_solve_babyai():
    """Oracle -> format_action -> parse_action -> step, all through the protocol in-process."""
    app = env_server.create_app("babyai", {})
    wins = 0
    with AgentGymHTTPEnv("http://testserver", http_client=TestClient(app)) as env:
        for seed in range(1_000_000, 1_000_004):
            env.reset(seed=seed)
            for _ in range(100):
                result = env.step(parse_action(format_action(env.oracle_action())))
                assert not result.info["invalid_action"]
                if result.terminated or result.truncated:
                    break
            wins += result.info["success"]
        assert len(app.state.table) == 1
    assert wins >= 3
    assert len(app.state.table) == 0  # close() closed the server's env
