"""Any AgentGym environment server (WebArena, WebShop, BabyAI, SciWorld, TextCraft, ... or
`horizonrl env-server`) as a `TextEnv`, over HTTP.

The protocol: `POST /create` -> `{"id": int}`; `POST /reset` `{"id", "data_idx"}`; `POST /step`
`{"id", "action"}` -> `{"observation", "reward", "score", "done"}`; `GET /observation?id=`;
`POST /close` `{"id"}`; `GET /` health. AgentGym's own servers each speak a dialect of it (other
id and task keys, other answer shapes); `server=` names one (envpool/agentgym_dialects.py has
the table) and the client then sends that server's keys and holds its answers to that server's
shapes. The default, `server="horizonrl"`, is lenient: /create may answer a bare int or
`{"env_idx": int}` (requests then name the id `env_idx`), the observation may be called `state`,
`done` may come as `terminated`/`truncated`, and a failure may come as HTTP 200 with
`{"error": ...}`. Our own server adds an `info` dict to /reset and /step answers (passed
through) and `GET /oracle?id=`.

    with AgentGymHTTPEnv("http://127.0.0.1:8000", server="webarena") as env:
        obs, info = env.reset(seed=3)  # WebArena task 3
        result = env.step(parse_action(model_text))

Failures raise an `AgentGymError` subclass that names the endpoint: connection trouble
(`AgentGymConnectionError`, after bounded retries), answers that do not fit the protocol or the
named dialect (`AgentGymProtocolError`), errors the server reports (`AgentGymServerError`) and,
among those, a server that no longer knows our env id because it restarted
(`AgentGymEnvLostError`): `reset()` recovers from that by creating a new env, `step()` cannot (the
episode's state is gone).
"""

from __future__ import annotations

import logging
import random
import re
import time
from typing import Any, Self

import httpx

from horizonrl.envpool.agentgym_dialects import (
    DIALECTS,
    AgentGymConnectionError,
    AgentGymEnvLostError,
    AgentGymError,
    AgentGymProtocolError,
    AgentGymServerError,
    close_problem,
    dialect,
    expect_dict,
    number_field,
    parse_create,
    parse_observation,
    parse_reset,
    parse_step,
    step_info,
    text_field,
)
from horizonrl.envpool.base import (
    MAX_ACTION_CHARS,
    StepResult,
    parse_agentgym_action,
    task_split,
    utf8_safe,
)

__all__ = [
    "SYSTEM_PROMPT", "AgentGymConnectionError", "AgentGymEnvLostError", "AgentGymError",
    "AgentGymHTTPEnv", "AgentGymProtocolError", "AgentGymServerError", "format_action",
    "parse_action", "random_action",
]
log = logging.getLogger(__name__)

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
# Restarts seen per server URL in this process: replicas that share a server share this.
_server_generation: dict[str, int] = {}


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

    The env is created on the first `reset`; `reset(seed=s)` sends task index `s` under the
    dialect's key (`data_idx`; WebArena `idx`, WebShop `session_id`). Every call has
    a timeout. Calls are retried with exponential backoff only when the connection could not be
    opened (the server never saw the request); a POST that reached the server is never resent,
    since /step may already have acted. HTTP errors (4xx/5xx) are not retried.
    """

    env_name = "agentgym"

    def __init__(
        self,
        url: str,
        *,
        server: str = "horizonrl",
        timeout_s: float = 30.0,
        retries: int = 3,
        backoff_s: float = 0.25,
        id_key: str | None = None,
        reset_key: str | None = None,
        max_action_chars: int = MAX_WIRE_ACTION_CHARS,
        num_tasks: int | None = None,
        eval_tasks: int = 0,
        http_client: httpx.Client | None = None,
    ) -> None:
        """`server`: the server's dialect (see agentgym_dialects.DIALECTS: horizonrl, webarena,
        webshop, babyai, sciworld, textcraft). `id_key`, `reset_key`: how requests name the env
        id and the task index; they default to the dialect's (for `horizonrl`: the id key
        /create answers with, and `data_idx`), and a named dialect allows only its own.
        `num_tasks`: how many tasks the server has (WebArena's 812 config files, WebShop's
        goals); task seeds then map onto indices: the train split onto the first
        `num_tasks - eval_tasks`, the eval split onto the last `eval_tasks`, each wrapping
        round (base.task_split). None: the seed is sent as the index, as before.
        `http_client`: an httpx.Client to use instead of a new one (tests, auth, TLS); the env
        closes it in `close()`."""
        if timeout_s <= 0 or retries < 0 or backoff_s < 0:
            raise ValueError("timeout_s must be > 0, retries and backoff_s >= 0")
        if num_tasks is not None and not 0 <= eval_tasks < num_tasks:
            raise ValueError(f"eval_tasks must be in [0, num_tasks), got {eval_tasks} of "
                             f"num_tasks={num_tasks}")
        if num_tasks is None and eval_tasks:
            raise ValueError("eval_tasks needs num_tasks (the server's task count)")
        self.num_tasks, self.eval_tasks = num_tasks, eval_tasks
        self.dialect = dialect(server)
        if self.dialect.strict:
            for kwarg, value, own in (("id_key", id_key, self.dialect.id_key),
                                      ("reset_key", reset_key, self.dialect.task_key)):
                if value is not None and value != own:
                    raise ValueError(f"{kwarg}={value!r}, but the {server} dialect sends {own!r}"
                                     f": drop {kwarg}, or name another `server`")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.reset_key = reset_key or self.dialect.task_key
        self.max_action_chars = max_action_chars
        self._id_key = id_key or self.dialect.id_key or "id"
        self._id_key_fixed = id_key is not None or self.dialect.id_key is not None
        self._http = http_client or httpx.Client(base_url=self.url, timeout=timeout_s)
        self._id: int | None = None
        self._generation = 0  # the server's restart count (as this process saw it) at /create
        self._last: StepResult | None = None
        self._score = 0.0  # info["score"] after the last call (SciWorld's reward base)

    @property
    def env_id(self) -> int | None:
        """The server's id for our env (None before the first reset or after it was lost)."""
        return self._id

    # ----------------------------------------------------------------------------- gym API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode on task index `seed` (None: 0), creating the env if needed.
        `options` reach `horizonrl env-server` only; AgentGym's servers take none."""
        body: dict[str, Any] = {self.reset_key: self.task_index(seed),
                                **dict(self.dialect.reset_fixed)}
        if options:
            if self.dialect.strict:
                raise ValueError(f"the {self.dialect.name} dialect's /reset takes no options")
            body["options"] = options
        self._last = None  # the new episode's: observation() must not answer the old end
        if self._id is not None and self._generation != _server_generation.get(self.url, 0):
            self._id = None  # another replica saw this server restart: our id is void
        if self._id is None:
            self._create()
        try:
            answer = self._request("POST", "/reset", json={**self._ids(), **body})
        except AgentGymEnvLostError:
            # The server restarted between episodes: only the id is lost, so make a new env.
            self._id = None
            self._create()
            answer = self._request("POST", "/reset", json={**self._ids(), **body})
        obs, fields = parse_reset(self.dialect, answer)
        if obs is None:
            obs = self.observation()  # servers whose reset answers no text
        ep = "POST /reset"
        reward = 0.0 if fields.get("reward") is None else number_field(fields, ep, "reward")
        info = step_info(self.dialect, fields, ep, obs=obs, reward=reward, done=False)
        self._score = info["score"]
        self._last = StepResult(obs, 0.0, False, False, info)
        return obs, info

    def task_index(self, seed: int | None) -> int:
        """The server's task index for a task seed (see `num_tasks`)."""
        if self.num_tasks is None:
            return 0 if seed is None else int(seed)
        split, index = task_split(seed)
        train = self.num_tasks - self.eval_tasks
        if split == "eval":
            if not self.eval_tasks:
                raise ValueError(f"seed {seed} is an eval-split seed, but eval_tasks=0")
            return train + index % self.eval_tasks
        return index % train

    def step(self, action: str) -> StepResult:
        """Send one action. Any string is accepted: over-long ones are answered here as invalid
        (the server's turn is not used up), text that UTF-8 cannot carry is replaced."""
        if self._id is None or self._last is None:
            raise RuntimeError("call reset() before step()")
        last = self._last
        if not isinstance(action, str) or len(action) > self.max_action_chars:
            info = {**last.info, "invalid_action": True}
            obs = f"Invalid action (over {self.max_action_chars} characters). {last.observation}"
            return StepResult(obs, 0.0, last.terminated, last.truncated, info)
        if last.terminated or last.truncated:
            # The real servers answer errors (BabyAI, SciWorld) or step on (TextCraft) after
            # the end; the episode is over, so nothing is sent.
            info = {**last.info, "invalid_action": True}
            return StepResult(f"Invalid action. The episode has ended. {last.observation}",
                              0.0, last.terminated, last.truncated, info)
        try:
            body = {**self._ids(), "action": utf8_safe(action)}
            answer = self._request("POST", "/step", json=body)
        except AgentGymEnvLostError:
            self._id = None
            raise
        self._last = parse_step(self.dialect, answer, last_score=self._score)
        self._score = self._last.info["score"]
        return self._last

    def observation(self) -> str:
        """The current observation, as `GET /observation` gives it; after the episode's end
        (when the real servers answer errors) the last one reset or step answered."""
        if self._id is None:
            raise RuntimeError("call reset() before observation()")
        if self._last is not None and (self._last.terminated or self._last.truncated):
            return self._last.observation
        answer = self._request("GET", "/observation", params=self._ids())
        return parse_observation(self.dialect, answer)

    def oracle_action(self) -> str:
        """The server env's scripted next action (`GET /oracle`, a horizonrl env-server
        extension; AgentGym's own servers lack it)."""
        if self._id is None:
            raise RuntimeError("call reset() before oracle_action()")
        if self.dialect.strict:
            raise AgentGymProtocolError(f"GET /oracle: the {self.dialect.name} dialect has no "
                                        "oracle (an extension of `horizonrl env-server`)")
        try:
            answer = self._request("GET", "/oracle", params=self._ids())
        except AgentGymServerError as exc:
            if isinstance(exc, AgentGymEnvLostError) or exc.status not in (404, 405, 501):
                raise
            raise AgentGymProtocolError(
                f"GET /oracle: the server at {self.url} offers no oracle (an extension of "
                f"`horizonrl env-server` for envs with oracle_action()): {exc}"
            ) from exc
        return text_field(expect_dict(answer, "GET /oracle"), "GET /oracle", ("action",))

    def close(self) -> None:
        """Close our env on the server (where it has a /close route) and the HTTP client.
        Never raises (the server may be gone): an answer outside the dialect is logged.
        Calling it twice is fine."""
        if self._id is not None and self.dialect.close_answer is not None:
            try:
                response = self._http.post("/close", json=self._ids(),
                                           timeout=min(self.timeout_s, 5.0))
                try:
                    answer = response.json()
                except ValueError:
                    answer = None  # WebArena answers the text "closed"
                problem = close_problem(self.dialect, response.status_code, response.text,
                                        answer)
                if problem:
                    log.warning("closing env %s at %s: %s", self._id, self.url, problem)
            except (httpx.HTTPError, RuntimeError) as exc:  # the server is gone: nothing to free
                log.debug("closing env %s at %s: %r", self._id, self.url, exc)
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
        body = {"json": {}} if self.dialect.create_body else {}
        env_id, key = parse_create(self.dialect, self._request("POST", "/create", **body))
        if not self._id_key_fixed:
            self._id_key = key
        self._id, self._generation = env_id, _server_generation.get(self.url, 0)

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
        return self._decode(response, endpoint)

    def _decode(self, response: httpx.Response, endpoint: str) -> Any:
        """The JSON of an answer; HTTP errors and AgentGym's 200-with-`error` become exceptions.
        Under a named dialect, a route or body the server does not take (404, 405, 422) is a
        protocol mismatch; under `horizonrl` a 422 or 500 hints at naming one."""
        status = response.status_code
        if status >= 400:
            detail = _detail(response)
            lost = status == 404 and "unknown env id" in detail
            if lost:
                self._lost()
            d = self.dialect
            if d.strict and not lost and status in (404, 405, 422):
                raise AgentGymProtocolError(
                    f"{endpoint} -> HTTP {status}: the server does not take the {d.name} "
                    f"dialect's request ({detail}); is `server` right? "
                    f"(known: {', '.join(DIALECTS)})")
            cls = AgentGymEnvLostError if lost else AgentGymServerError
            hint = " (the server restarted or closed it; reset() creates a new env)" if lost else ""
            if d.strict and status >= 500:
                hint = f" (the server was spoken to in the {d.name} dialect)"
            elif not d.strict and status in (422, 500):
                hint = (" (if this is one of AgentGym's own servers, set `server` to its dialect:"
                        f" {', '.join(n for n in DIALECTS if n != d.name)})")
            raise cls(f"{endpoint} -> HTTP {status}: {detail}{hint}", status=status)
        try:
            answer = response.json()
        except ValueError:
            raise AgentGymProtocolError(
                f"{endpoint}: the answer is not JSON: {response.text[:200]!r}"
            ) from None
        if isinstance(answer, dict) and answer.get("error"):
            error = str(answer["error"])
            if any(phrase in error for phrase in self.dialect.lost_errors):
                self._lost()
                raise AgentGymEnvLostError(
                    f"{endpoint}: the server no longer has env {self._id}: {error[:300]} (it "
                    "restarted or closed it; reset() creates a new env)", status=status)
            raise AgentGymServerError(
                f"{endpoint}: the server reported an error: {error[:500]}", status=status)
        return answer

    def _lost(self) -> None:
        """The server lost our env: it restarted, so every id this process got from it before
        is void. Other replicas here drop theirs at their next reset rather than reset an env
        the new server handed to someone else (ids restart from 0)."""
        if self._generation == _server_generation.get(self.url, 0):
            _server_generation[self.url] = self._generation + 1


def _detail(response: httpx.Response) -> str:
    """An error answer's reason: FastAPI's `detail` (a 422's list as "where: what; ..."), else
    the body's text (Flask's error page without its tags)."""
    try:
        detail = response.json().get("detail", response.text)
    except (ValueError, AttributeError):
        detail = response.text
    if isinstance(detail, list):
        detail = "; ".join(
            f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg', '')}" if isinstance(e, dict)
            else str(e) for e in detail)
    return " ".join(re.sub(r"<[^>]*>", " ", str(detail)).split())[:500]
