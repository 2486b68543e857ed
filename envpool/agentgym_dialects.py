"""How each AgentGym env server speaks HTTP, as data: one `Dialect` per server, and the parsing of
its answers (used by `agentgym_http.AgentGymHTTPEnv`).

AgentGym's env servers (github.com/WooooDyy/AgentGym, `agentenv-*/agentenv_*/server.py`, read at
commit 3ef9235; BabyAI, SciWorld and TextCraft are also run for real in the tests from
`../shared/agentgym-servers`) share the routes /create, /reset, /step, /observation and /close
but not their keys or shapes:

    dialect         id key   /create answers        /reset sends (task)    /reset answers
    webarena        env_idx  {"env_idx"}            env_idx, seed=0, idx   {"observation", "sites",
                                                                             "object"}
    webarena-flask  env_idx  {"env_idx"}            env_idx, seed=0, idx   {"observation"}
    webshop         env_idx  a bare int             env_idx, session_id    [observation, null]
    babyai          id       {"id"}                 id, data_idx           {"observation", ...}
    sciworld        id       {"id"}                 id, data_idx           {"task_description",
                                                                             "observation", ...}
    textcraft       id       {"id", "observation"}  id, data_idx           {"observation", ...}

/step answers `observation`, `reward`, `terminated`, `truncated`, `info` (webarena), `state`,
`reward`, `done`, `info` (webshop) or `observation`, `reward`, (`score`,) `done` (the rest).
`GET /observation?<id key>=` answers a JSON string (BabyAI: an object with `observation`).
/close answers, by server: `{"closed": "closed"}` or `{"closed": "<why not>"}` (webarena since
AgentGym's commit 640f8bc, when it moved from Flask to Quart), the text "closed" (webarena-flask),
a bare `true`/`false` (babyai, sciworld, textcraft since 640f8bc; `false`: no such env, and
SciWorld answers HTTP 500 for an id it already closed); WebShop's main branch has no /close.
Failures come as HTTP 500 (webarena, webshop), HTTP 422 for a body the server's pydantic model
rejects (the FastAPI ones), or HTTP 200 with `{"error": ...}` (babyai, sciworld, textcraft),
where "The id N is not valid." and "... has been deleted." mean the env is gone (a restarted
server): `lost_errors` below. WebArena's /reset answers a failure as `"sites": "Error"`.

Each server words a rejected action its own way (`invalid_prefixes`): TextCraft "Could not ...",
BabyAI "The action is not recognized ...", SciWorld "No known action matches that input.".
SciWorld's /reset carries the task in `task_description` apart from the room's text, and its
step rewards are point changes out of 100: the client puts the task first in the opening
observation and rewards the change of max(score, 0) / 100, exactly as the native env
(envpool/sciworld.py) does, so both train on the same scale. WebArena keeps one global task
state per server (the task's config file and prompt builder are server attributes), so one
server serves one session: give each replica its own server (`urls`, see agentgym_http).

A named dialect is strict: an answer must have exactly that server's fields, since an extra or
missing field is the surest sign that `server` names the wrong one, and a mismatch raises
`AgentGymProtocolError` naming the dialect. `horizonrl` (the default) is lenient: it takes every
shape above, as `horizonrl env-server` and the client before dialects did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from horizonrl.envpool.base import StepResult


class AgentGymError(RuntimeError):
    """Any failure talking to an AgentGym env server; the message names the endpoint."""


class AgentGymConnectionError(AgentGymError):
    """The server could not be reached (after the retries) or did not answer in time."""


class AgentGymProtocolError(AgentGymError):
    """The server answered, but not in the shape the protocol (or the named dialect) says."""


class AgentGymServerError(AgentGymError):
    """The server refused or failed the call (HTTP 4xx/5xx, or 200 with an `error` field)."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class AgentGymEnvLostError(AgentGymServerError):
    """The server does not know our env id: it restarted or dropped the env. `reset()` makes a
    new one; the interrupted episode is lost."""


@dataclass(frozen=True, slots=True)
class Dialect:
    """One server's wire format. Field sets are the exact top-level keys of an answer."""

    name: str
    source: str
    """Where the server's routes are defined, for a reader checking this table."""
    strict: bool = True
    """False only for `horizonrl`: any of the shapes in the module docstring is taken."""
    id_key: str | None = "id"
    """How requests and GET queries name the env id; None: as /create answers ("id" or
    "env_idx")."""
    task_key: str = "data_idx"
    """The /reset key that carries the task index (`reset(seed=...)`)."""
    reset_fixed: tuple[tuple[str, Any], ...] = ()
    """Further /reset keys with fixed values (WebArena reads a `seed`; AgentGym sends 0)."""
    create_body: bool = False
    """/create takes a JSON object (TextCraft's optional `commands`/`goal`); we send {}."""
    create_answer: Literal["object", "int"] = "object"
    create_fields: frozenset[str] = frozenset({"id"})
    reset_answer: Literal["object", "pair"] = "object"
    reset_fields: frozenset[str] = frozenset()
    step_fields: frozenset[str] = frozenset()
    obs_key: str = "observation"
    """The /step field with the observation (WebShop: `state`)."""
    observation_answer: Literal["text", "object"] = "text"
    """`GET /observation` answers a JSON string, or an object with `observation` (BabyAI)."""
    close_answer: Literal["text", "closed-object", "object", "bool"] | None = None
    """What /close answers: the text "closed" (webarena-flask), `{"closed": "closed"}` (webarena,
    any other string is its reason for not closing), `{"closed": bool}`, a bare boolean
    (`false`: no such env, already closed), or None: no /close route (nothing is sent)."""
    invalid_prefixes: tuple[str, ...] = ("invalid action",)
    """How the server's observation starts when it rejected the action (case ignored)."""
    lost_errors: tuple[str, ...] = ()
    """Phrases in a 200 `{"error"}` answer that mean the server no longer has our env."""
    task_field: str | None = None
    """A /reset field with the task, put before the observation (SciWorld)."""
    score_scale: float | None = None
    """Reward from the `score` field: the change of max(score, 0) times this (SciWorld: 1/100,
    as the native env); None: the server's `reward` as it is."""
    reset_failed: tuple[str, Any] | None = None
    """A /reset (field, value) that says the reset failed (WebArena: sites = "Error")."""


def _fields(*names: str) -> frozenset[str]:
    return frozenset(names)


_AGENTENV_LOST = ("is not valid.", "has been deleted.")  # agentenv's _check_id wording

DIALECTS: dict[str, Dialect] = {d.name: d for d in (
    Dialect("horizonrl", "envpool/env_server.py (`horizonrl env-server`), taken leniently",
            strict=False, id_key=None, close_answer="object", lost_errors=_AGENTENV_LOST),
    Dialect("webarena", "agentenv-webarena/agentenv_webarena/server.py (Quart, since 640f8bc)",
            id_key="env_idx", task_key="idx", reset_fixed=(("seed", 0),),
            create_fields=_fields("env_idx"),
            reset_fields=_fields("observation", "sites", "object"),
            step_fields=_fields("observation", "reward", "terminated", "truncated", "info"),
            close_answer="closed-object", reset_failed=("sites", "Error")),
    Dialect("webarena-flask", "agentenv-webarena/agentenv_webarena/server.py (Flask, before "
            "640f8bc)", id_key="env_idx", task_key="idx", reset_fixed=(("seed", 0),),
            create_fields=_fields("env_idx"), reset_fields=_fields("observation"),
            step_fields=_fields("observation", "reward", "terminated", "truncated", "info"),
            close_answer="text"),
    Dialect("webshop", "agentenv-webshop/agentenv_webshop/server.py, model.py (no /close)",
            id_key="env_idx", task_key="session_id", create_answer="int",
            reset_answer="pair", step_fields=_fields("state", "reward", "done", "info"),
            obs_key="state"),
    Dialect("babyai", "agentenv-babyai/agentenv_babyai/server.py, environment.py",
            reset_fields=_fields("observation", "reward", "score", "deleted", "done"),
            step_fields=_fields("observation", "reward", "score", "done"),
            observation_answer="object", close_answer="bool",
            invalid_prefixes=("The action is not recognized",), lost_errors=_AGENTENV_LOST),
    Dialect("sciworld", "agentenv-sciworld/agentenv_sciworld/server.py, environment.py",
            reset_fields=_fields("task_name", "var_num", "task_description", "observation",
                                 "reward", "score", "deleted", "done"),
            step_fields=_fields("observation", "reward", "score", "done"), close_answer="bool",
            invalid_prefixes=("No known action matches that input", "Unknown action"),
            lost_errors=_AGENTENV_LOST, task_field="task_description", score_scale=0.01),
    Dialect("textcraft", "agentenv-textcraft/agentenv_textcraft/server.py, env_wrapper.py",
            create_body=True, create_fields=_fields("id", "observation", "done", "reward"),
            reset_fields=_fields("id", "observation", "done", "reward"),
            step_fields=_fields("observation", "reward", "done"), close_answer="bool",
            invalid_prefixes=("Could not ",), lost_errors=_AGENTENV_LOST),
)}


def dialect(name: str) -> Dialect:
    """The dialect called `name`; a ValueError lists the known ones."""
    try:
        return DIALECTS[name]
    except KeyError:
        raise ValueError(f"unknown AgentGym server dialect {name!r}; known: "
                         f"{', '.join(DIALECTS)}") from None


# ------------------------------------------------------------------------------ parsing
def parse_create(d: Dialect, answer: Any) -> tuple[int, str]:
    """(the env id, the key later requests name it by) from a /create answer."""
    ep = "POST /create"
    if not d.strict:
        if _is_int(answer):
            return answer, "id"  # WebShop-style servers answer a bare int
        for key in ("id", "env_idx"):
            if isinstance(answer, dict) and _is_int(answer.get(key)):
                return answer[key], key
        raise AgentGymProtocolError(
            f'{ep}: expected {{"id": int}} (or {{"env_idx": int}}, or a bare int), '
            f"got {_short(answer)}")
    assert d.id_key is not None
    if d.create_answer == "int":
        if not _is_int(answer):
            raise mismatch(d, ep, "a bare integer", answer)
        return answer, d.id_key
    fields = _exact(d, ep, answer, d.create_fields)
    if not _is_int(fields[d.id_key]):
        raise mismatch(d, ep, f"an integer {d.id_key!r}", fields[d.id_key])
    return fields[d.id_key], d.id_key


def parse_reset(d: Dialect, answer: Any) -> tuple[str | None, dict[str, Any]]:
    """(the first observation, the answer's fields); None: the answer has no text, so ask
    `GET /observation` (lenient only). SciWorld's task comes first, as in the native env."""
    ep = "POST /reset"
    if not d.strict:
        if isinstance(answer, str):
            return answer, {}
        if isinstance(answer, list) and answer and isinstance(answer[0], str):
            return answer[0], {}  # WebShop answers [observation, None]
        fields = expect_dict(answer, ep)
        if "observation" in fields or "state" in fields:
            return text_field(fields, ep, ("observation", "state")), fields
        return None, fields
    if d.reset_answer == "pair":
        if not (isinstance(answer, list) and len(answer) == 2 and isinstance(answer[0], str)
                and answer[1] is None):
            raise mismatch(d, ep, "[observation, null]", answer)
        return answer[0], {}
    fields = _exact(d, ep, answer, d.reset_fields)
    obs = text_field(fields, _label(d, ep), ("observation",))
    if d.reset_failed is not None and fields.get(d.reset_failed[0]) == d.reset_failed[1]:
        raise AgentGymServerError(f"{ep}: the {d.name} server could not reset the task "
                                  f"(it answered {_short(obs)})", status=200)
    if d.task_field is not None:
        obs = f"{text_field(fields, _label(d, ep), (d.task_field,)).rstrip()}\n\n{obs}"
    return obs, fields


def parse_step(d: Dialect, answer: Any, *, last_score: float = 0.0) -> StepResult:
    """A /step answer as a StepResult; `done` (or `terminated`/`truncated`) ends the episode.
    `last_score`: the previous answer's `info["score"]`, for dialects that reward the score's
    change (`score_scale`)."""
    ep = "POST /step"
    if d.strict:
        fields = _exact(d, ep, answer, d.step_fields)
        ep = _label(d, ep)
        obs = text_field(fields, ep, (d.obs_key,))
    else:
        fields = expect_dict(answer, ep)
        obs = text_field(fields, ep, ("observation", "state"))
    reward = number_field(fields, ep, "reward")
    if d.score_scale is not None:
        reward = scaled_score(d, fields, ep) - last_score
    if "terminated" in fields or "truncated" in fields:
        terminated = _flag(fields, ep, "terminated") if "terminated" in fields else False
        truncated = _flag(fields, ep, "truncated") if "truncated" in fields else False
    elif "done" in fields:
        terminated, truncated = _flag(fields, ep, "done"), False
    else:
        raise AgentGymProtocolError(
            f"{ep}: the answer has neither 'done' nor 'terminated'/'truncated' "
            f"(fields: {sorted(fields)})")
    info = step_info(d, fields, ep, obs=obs, reward=reward, done=terminated or truncated)
    return StepResult(obs, reward, terminated, truncated, info)


def scaled_score(d: Dialect, fields: dict[str, Any], ep: str) -> float:
    """max(score, 0) on the native env's scale: a failed SciWorld task (score -100) counts 0,
    so its rewards take back the progress made and the episode returns 0, as natively."""
    assert d.score_scale is not None
    return max(number_field(fields, ep, "score"), 0.0) * d.score_scale


def parse_observation(d: Dialect, answer: Any) -> str:
    """The text of a `GET /observation` answer (a JSON string; BabyAI: an object)."""
    ep = "GET /observation"
    if isinstance(answer, str):
        return answer
    if d.strict and d.observation_answer == "text":
        raise mismatch(d, ep, "a JSON string", answer)
    return text_field(expect_dict(answer, ep), ep, ("observation", "state"))


def close_problem(d: Dialect, status: int, text: str, answer: Any) -> str | None:
    """What is wrong with a /close answer (`answer`: its JSON, or None), or None if nothing.
    An id the server no longer has is not a problem: `false` (agentenv), and SciWorld's
    HTTP 500 for an id it already closed."""
    if status >= 400:
        if d.close_answer == "bool" and status == 500:
            return None
        return f"POST /close -> HTTP {status}: {text[:200]}"
    if not d.strict:
        return None
    if d.close_answer == "text":
        ok, expected = text.strip() == "closed", 'the text "closed"'
    elif d.close_answer == "bool":
        ok, expected = isinstance(answer, bool), "a bare true/false"
    elif d.close_answer == "closed-object":
        closed = answer.get("closed") if isinstance(answer, dict) else None
        if isinstance(closed, str) and set(answer) == {"closed"} and closed != "closed":
            return f"POST /close: the {d.name} server did not close the env: {closed[:200]}"
        ok, expected = closed == "closed" and set(answer) == {"closed"}, '{"closed": "closed"}'
    else:
        ok = isinstance(answer, dict) and set(answer) == {"closed"} \
            and isinstance(answer["closed"], bool)
        expected = '{"closed": bool}'
    return None if ok else str(mismatch(d, "POST /close", expected, answer or text))


def mismatch(d: Dialect, ep: str, expected: str, got: Any) -> AgentGymProtocolError:
    """The error for an answer outside dialect `d`: it names both and asks about `server`."""
    return AgentGymProtocolError(
        f"{ep}: the {d.name} dialect answers {expected}, got {_short(got)}; is `server` right? "
        f"(known: {', '.join(DIALECTS)})")


# ------------------------------------------------------------------------------ fields
def step_info(d: Dialect, fields: dict[str, Any], ep: str, *, obs: str, reward: float,
              done: bool) -> dict:
    """The server's `info` (if any) with `invalid_action`, `success` and `score` always set:
    an action is invalid when the observation starts with one of the dialect's phrases."""
    info = fields.get("info")
    if info is not None and not isinstance(info, dict):
        raise AgentGymProtocolError(f"{ep}: field 'info' is {_short(info)}, expected an object")
    info = dict(info or {})
    head = obs.lstrip().lower()
    info.setdefault("invalid_action",
                    any(head.startswith(p.lower()) for p in d.invalid_prefixes))
    if d.score_scale is not None and "score" in fields:
        score = scaled_score(d, fields, ep)
        info.setdefault("success", done and score >= 1.0)
        info.setdefault("score", score)
        return info
    info.setdefault("success", done and reward > 0)
    score = fields.get("score")
    info.setdefault("score", reward if score is None else number_field(fields, ep, "score"))
    return info


def expect_dict(answer: Any, ep: str) -> dict[str, Any]:
    if not isinstance(answer, dict):
        raise AgentGymProtocolError(f"{ep}: expected a JSON object, got {_short(answer)}")
    return answer


def text_field(fields: dict[str, Any], ep: str, names: tuple[str, ...]) -> str:
    """The first of `names` in `fields`, which must be a string."""
    for name in names:
        if name in fields:
            if not isinstance(fields[name], str):
                raise AgentGymProtocolError(
                    f"{ep}: field {name!r} is {_short(fields[name])}, expected a string")
            return fields[name]
    raise AgentGymProtocolError(
        f"{ep}: the answer has no {' or '.join(map(repr, names))} field "
        f"(fields: {sorted(fields)})")


def number_field(fields: dict[str, Any], ep: str, name: str) -> float:
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


def _exact(d: Dialect, ep: str, answer: Any, names: frozenset[str]) -> dict[str, Any]:
    """`answer` as an object with exactly the fields `names`, else a mismatch naming them."""
    expected = f"an object with {sorted(names)}"
    if not isinstance(answer, dict):
        raise mismatch(d, ep, expected, answer)
    if set(answer) != names:
        missing, extra = sorted(names - set(answer)), sorted(set(answer) - names)
        detail = "; ".join(f"{what} {keys}" for what, keys in
                           (("missing", missing), ("unexpected", extra)) if keys)
        raise mismatch(d, ep, f"{expected} ({detail})", answer)
    return answer


def _label(d: Dialect, ep: str) -> str:
    return f"{ep} ({d.name} dialect)"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _short(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:120]}{'...' if len(text) > 120 else ''}"
