"""Any AgentGym environment server (WebShop, SciWorld, WebArena, ... or `horizonrl env-server`)
as a `TextEnv`, over HTTP.

The protocol: `POST /create` -> `{"id": int}`; `POST /reset` `{"id", "data_idx"}`; `POST /step`
`{"id", "action"}` -> `{"observation", "reward", "score", "done"}`; `GET /observation?id=`;
`POST /close` `{"id"}`; `GET /` health. AgentGym's servers differ in small ways and the client
takes each: /create may answer a bare int or `{"env_idx": int}` (requests then name the id
`env_idx`), the observation may be called `state`, `done` may come as `terminated`/`truncated`,
and a failure may come as HTTP 200 with `{"error": ...}`. Our own server adds an `info` dict to
/reset and /step answers (passed through) and `GET /oracle?id=`.

    with AgentGymHTTPEnv("http://127.0.0.1:8000") as env:
        obs, info = env.reset(seed=1_000_000)
        result = env.step(parse_action(model_text))

Failures raise an `AgentGymError` subclass that names the endpoint: connection trouble
(`AgentGymConnectionError`, after bounded retries), answers that do not fit the protocol
(`AgentGymProtocolError`), errors the server reports (`AgentGymServerError`) and, among those, a
server that no longer knows our env id because it restarted (`AgentGymEnvLostError`): `reset()`
recovers from that by creating a new env, `step()` cannot (the episode's state is gone).
"""

from __future__ import annotations

import contextlib
import random
import time
from typing import Any, Self

import httpx

from horizonrl.envpool.base import MAX_ACTION_CHARS, StepResult, parse_agentgym_action, utf8_safe

SYSTEM_PROMPT = (
    "You are an agent acting in a text environment. Each turn you read an observation and "
    "answer in exactly this format, each field on one line:\n"
    "Thought: <your reasoning, on one line>\n"
    "Action: <one action, in the syntax the environment describes>\n"
    'An action the environment does not accept is answered with "Invalid action" and uses up '
    "the turn."
)
# Actions longer than this are answered here as invalid instead of being sent; it is also the
# limit `horizonrl env-server` answers with HTTP 413 above. No env's action comes near it.
MAX_WIRE_ACTION_CHARS = 8 * MAX_ACTION_CHARS
_MAX_BACKOFF_S = 5.0


class AgentGymError(RuntimeError):
    """Any failure talking to an AgentGym env server; the message names the endpoint."""


class AgentGymConnectionError(AgentGymError):
    """The server could not be reached (after the retries) or did not answer in time."""


class AgentGymProtocolError(AgentGymError):
    """The server answered, but not in the shape the protocol says (missing or odd field)."""


class AgentGymServerError(AgentGymError):
    """The server refused or failed the call (HTTP 4xx/5xx, or 200 with an `error` field)."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class AgentGymEnvLostError(AgentGymServerError):
    """The server does not know our env id: it restarted or dropped the env. `reset()` makes a
    new one; the interrupted episode is lost."""


def parse_action(text: str) -> str:
    """The action in an AgentGym-style reply ("Thought: ... Action: <action>"). Never raises."""
    return parse_agentgym_action(text)


def format_action(action: str) -> str:
    """How a well-formed reply carries `action`."""
    return f"Action: {action}"


def random_action(info: dict[str, Any], rng: random.Random) -> str:
    """A uniformly random action from `info["available_actions"]`; servers that do not send
    that list give a random agent nothing to choose from, which is an error."""
    actions = info.get("available_actions")
    if not actions:
        raise ValueError("info has no 'available_actions': this server does not list its moves")
    return rng.choice(list(actions))


class AgentGymHTTPEnv:
    """A `TextEnv` (see envpool/base.py) backed by one env on an AgentGym env server.

    The env is created on the first `reset`; `reset(seed=s)` sends `data_idx = s`. Every call has
    a timeout. Calls are retried with exponential backoff only when the connection could not be
    opened (the server never saw the request); a POST that reached the server is never resent,
    since /step may already have acted. HTTP errors (4xx/5xx) are not retried.
    """

    env_name = "agentgym"

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 30.0,
        retries: int = 3,
        backoff_s: float = 0.25,
        id_key: str | None = None,
        reset_key: str = "data_idx",
        max_action_chars: int = MAX_WIRE_ACTION_CHARS,
        http_client: httpx.Client | None = None,
    ) -> None:
        """`id_key`: how requests name the env id ("id" or "env_idx"; None: as /create answers).
        `http_client`: an httpx.Client to use instead of a new one (tests, auth, TLS); the env
        closes it in `close()`."""
        if timeout_s <= 0 or retries < 0 or backoff_s < 0:
            raise ValueError("timeout_s must be > 0, retries and backoff_s >= 0")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.reset_key = reset_key
        self.max_action_chars = max_action_chars
        self._id_key = id_key or "id"
        self._id_key_fixed = id_key is not None
        self._http = http_client or httpx.Client(base_url=self.url, timeout=timeout_s)
        self._id: int | None = None
        self._last: StepResult | None = None

    @property
    def env_id(self) -> int | None:
        """The server's id for our env (None before the first reset or after it was lost)."""
        return self._id

    # ----------------------------------------------------------------------------- gym API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode on task `data_idx = seed` (None: 0), creating the env if needed."""
        body: dict[str, Any] = {self.reset_key: 0 if seed is None else int(seed)}
        if options:
            body["options"] = options  # our server's extension; AgentGym servers ignore it
        if self._id is None:
            self._create()
        try:
            answer = self._request("POST", "/reset", json={**self._ids(), **body})
        except AgentGymEnvLostError:
            # The server restarted between episodes: only the id is lost, so make a new env.
            self._id = None
            self._create()
            answer = self._request("POST", "/reset", json={**self._ids(), **body})
        obs, fields = self._reset_observation(answer)
        reward = 0.0 if fields.get("reward") is None else _number(fields, "POST /reset", "reward")
        info = _info(fields, "POST /reset", obs=obs, reward=reward, done=False)
        self._last = StepResult(obs, 0.0, False, False, info)
        return obs, info

    def step(self, action: str) -> StepResult:
        """Send one action. Any string is accepted: over-long ones are answered here as invalid
        (the server's turn is not used up), text that UTF-8 cannot carry is replaced."""
        if self._id is None or self._last is None:
            raise RuntimeError("call reset() before step()")
        if not isinstance(action, str) or len(action) > self.max_action_chars:
            last = self._last
            info = {**last.info, "invalid_action": True}
            obs = f"Invalid action (over {self.max_action_chars} characters). {last.observation}"
            return StepResult(obs, 0.0, last.terminated, last.truncated, info)
        try:
            body = {**self._ids(), "action": utf8_safe(action)}
            answer = self._request("POST", "/step", json=body)
        except AgentGymEnvLostError:
            self._id = None
            raise
        self._last = _step_result(answer)
        return self._last

    def observation(self) -> str:
        """The current observation, as `GET /observation` gives it."""
        answer = self._request("GET", "/observation", params=self._ids())
        if isinstance(answer, str):
            return answer
        return _text(_expect_dict(answer, "GET /observation"), "GET /observation",
                     ("observation", "state"))

    def oracle_action(self) -> str:
        """The server env's scripted next action (`GET /oracle`, a horizonrl env-server
        extension; AgentGym's own servers lack it)."""
        if self._id is None:
            raise RuntimeError("call reset() before oracle_action()")
        try:
            answer = self._request("GET", "/oracle", params=self._ids())
        except AgentGymServerError as exc:
            if isinstance(exc, AgentGymEnvLostError) or exc.status not in (404, 405, 501):
                raise
            raise AgentGymProtocolError(
                f"GET /oracle: the server at {self.url} offers no oracle (an extension of "
                f"`horizonrl env-server` for envs with oracle_action()): {exc}"
            ) from exc
        return _text(_expect_dict(answer, "GET /oracle"), "GET /oracle", ("action",))

    def close(self) -> None:
        """Close our env on the server and the HTTP client. Never raises (the server may be
        gone); calling it twice is fine."""
        if self._id is not None:
            with contextlib.suppress(httpx.HTTPError, RuntimeError):
                self._http.post("/close", json=self._ids(), timeout=min(self.timeout_s, 5.0))
            self._id = None
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------- internals
    def _ids(self) -> dict[str, int]:
        assert self._id is not None
        return {self._id_key: self._id}

    def _create(self) -> None:
        answer = self._request("POST", "/create")
        if isinstance(answer, int) and not isinstance(answer, bool):
            self._id = answer  # WebShop-style servers answer a bare int
            return
        if isinstance(answer, dict):
            for key in ("id", "env_idx"):
                value = answer.get(key)
                if isinstance(value, int) and not isinstance(value, bool):
                    if not self._id_key_fixed:
                        self._id_key = key
                    self._id = value
                    return
        raise AgentGymProtocolError(
            f'POST /create: expected {{"id": int}} (or {{"env_idx": int}}, or a bare int), '
            f"got {_short(answer)}"
        )

    def _reset_observation(self, answer: Any) -> tuple[str, dict[str, Any]]:
        """(observation, the answer's other fields) from the shapes /reset answers come in."""
        if isinstance(answer, str):
            return answer, {}
        if isinstance(answer, list) and answer and isinstance(answer[0], str):
            return answer[0], {}  # WebShop answers [observation, None]
        fields = _expect_dict(answer, "POST /reset")
        if "observation" in fields or "state" in fields:
            return _text(fields, "POST /reset", ("observation", "state")), fields
        return self.observation(), fields  # servers whose reset answers no text

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One call: retries when no connection could be opened, then the decoded JSON."""
        endpoint = f"{method} {path}"
        error: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(self.backoff_s * 2 ** (attempt - 1), _MAX_BACKOFF_S))
            try:
                response = self._http.request(method, path, **kwargs)
                break
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                error = exc  # the request never left: safe to send again
            except httpx.TimeoutException as exc:
                raise AgentGymConnectionError(
                    f"{endpoint}: no answer from {self.url} within {self.timeout_s} s"
                ) from exc
            except httpx.TransportError as exc:
                if method != "GET":  # it may have reached the server and acted: do not resend
                    raise AgentGymConnectionError(
                        f"{endpoint}: the connection to {self.url} broke mid-call ({exc!r}); "
                        "not resent, as the server may have acted on it"
                    ) from exc
                error = exc
        else:
            raise AgentGymConnectionError(
                f"{endpoint}: cannot reach {self.url} after {self.retries + 1} attempts: "
                f"{error!r}"
            ) from error
        return _decode(response, endpoint)


# --------------------------------------------------------------------------- answer parsing
def _decode(response: httpx.Response, endpoint: str) -> Any:
    """The JSON of an answer; HTTP errors and AgentGym's 200-with-`error` become exceptions."""
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail", response.text)
        except (ValueError, AttributeError):
            detail = response.text
        detail = str(detail)[:500]
        lost = response.status_code == 404 and "unknown env id" in detail
        cls = AgentGymEnvLostError if lost else AgentGymServerError
        hint = " (the server restarted or closed it; reset() creates a new env)" if lost else ""
        raise cls(f"{endpoint} -> HTTP {response.status_code}: {detail}{hint}",
                  status=response.status_code)
    try:
        answer = response.json()
    except ValueError:
        raise AgentGymProtocolError(
            f"{endpoint}: the answer is not JSON: {response.text[:200]!r}"
        ) from None
    if isinstance(answer, dict) and answer.get("error"):
        raise AgentGymServerError(
            f"{endpoint}: the server reported an error: {str(answer['error'])[:500]}",
            status=response.status_code,
        )
    return answer


def _step_result(answer: Any) -> StepResult:
    ep = "POST /step"
    fields = _expect_dict(answer, ep)
    obs = _text(fields, ep, ("observation", "state"))
    reward = _number(fields, ep, "reward")
    if "terminated" in fields or "truncated" in fields:
        terminated = _flag(fields, ep, "terminated") if "terminated" in fields else False
        truncated = _flag(fields, ep, "truncated") if "truncated" in fields else False
    elif "done" in fields:
        terminated, truncated = _flag(fields, ep, "done"), False
    else:
        raise AgentGymProtocolError(
            f"{ep}: the answer has neither 'done' nor 'terminated'/'truncated' "
            f"(fields: {sorted(fields)})"
        )
    info = _info(fields, ep, obs=obs, reward=reward, done=terminated or truncated)
    return StepResult(obs, reward, terminated, truncated, info)


def _info(fields: dict[str, Any], ep: str, *, obs: str, reward: float, done: bool) -> dict:
    """The server's `info` (if any) with `invalid_action`, `success` and `score` always set."""
    info = fields.get("info")
    if info is not None and not isinstance(info, dict):
        raise AgentGymProtocolError(f"{ep}: field 'info' is {_short(info)}, expected an object")
    info = dict(info or {})
    info.setdefault("invalid_action", obs.lower().startswith("invalid action"))
    info.setdefault("success", done and reward > 0)
    score = fields.get("score")
    info.setdefault("score", reward if score is None else _number(fields, ep, "score"))
    return info


def _expect_dict(answer: Any, ep: str) -> dict[str, Any]:
    if not isinstance(answer, dict):
        raise AgentGymProtocolError(f"{ep}: expected a JSON object, got {_short(answer)}")
    return answer


def _text(fields: dict[str, Any], ep: str, names: tuple[str, ...]) -> str:
    for name in names:
        if name in fields:
            if not isinstance(fields[name], str):
                raise AgentGymProtocolError(
                    f"{ep}: field {name!r} is {_short(fields[name])}, expected a string"
                )
            return fields[name]
    raise AgentGymProtocolError(
        f"{ep}: the answer has no {' or '.join(map(repr, names))} field "
        f"(fields: {sorted(fields)})"
    )


def _number(fields: dict[str, Any], ep: str, name: str) -> float:
    value = fields.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        what = "missing" if name not in fields else f"{_short(value)}"
        raise AgentGymProtocolError(f"{ep}: field {name!r} is {what}, expected a number")
    return float(value)


def _flag(fields: dict[str, Any], ep: str, name: str) -> bool:
    value = fields[name]
    if isinstance(value, bool) or value in (0, 1):
        return bool(value)
    raise AgentGymProtocolError(f"{ep}: field {name!r} is {_short(value)}, expected a boolean")


def _short(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:120]}{'...' if len(text) > 120 else ''}"


