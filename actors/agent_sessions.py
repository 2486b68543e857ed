"""Episodes an outside agent runs through the OpenAI endpoint, kept in token space.

An agent sends its whole message history with every request. Re-tokenising that history would
train on ids the model never sampled (verl #3960, #6719). So each episode keeps what it has
sampled: when a request's messages extend the previous request's messages plus the reply that
was returned, its prompt is the previous prompt, the sampled ids, and the new messages' tokens
(`Renderer.continuation`) - nothing sampled is re-encoded. A request whose history differs (the
agent dropped, rewrote or summarised messages, or changed its tools) is re-tokenised whole and
counted as an edit; the episode then trains one row per turn, each from the prompt that turn was
really sampled from (`Trajectory.turn_spans`, as window contexts do).

Plain classes, no HTTP and no engine: the server (actors/openai_server.py) and the rollout
loop (actors/agent_episodes.py) drive them.
"""

from __future__ import annotations

import secrets
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from horizonrl.actors.rollout import Completion
from horizonrl.actors.tool_calls import ToolParser, check_tool_choice, renders_tools
from horizonrl.envpool.agent_worker import AgentOutcome
from horizonrl.protos.messages import Message, MessageError, Renderer, normalize, same_message
from horizonrl.protos.trajectory import Failure, Trajectory


class AgentRequestError(Exception):
    """A request the endpoint refuses: an HTTP status, an OpenAI error code and a message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass(slots=True)
class Turn:
    """One sampled reply: the ids it was sampled from, what was sampled, and how."""

    context: list[int]
    extends: bool  # context = previous turn's context + its ids + the new messages' ids
    sampled: list[int]
    logprobs: list[float]
    closer: list[int]  # the end token, added when the reply was cut by max_tokens
    version: int
    invalid: str = ""  # the parser's message for a malformed tool call
    action: str = ""  # what the reply did, for metrics: its calls, else its text


@dataclass(slots=True)
class _Pending:
    messages: list[Message]
    tools: list | None
    tool_choice: Any
    ids: list[int]
    extends: bool


class AgentSession:
    """One episode's requests and replies. `prompt` then `complete`, request after request;
    `trajectory` at the end."""

    def __init__(self, *, renderer: Renderer, parser: ToolParser, horizon: int,
                 max_context_tokens: int, max_tokens: int, version: int,
                 end_id: int, model: str = "horizonrl") -> None:
        self.key = secrets.token_urlsafe(24)  # the agent's API key: unguessable off loopback
        self.renderer, self.parser = renderer, parser
        self.horizon, self.max_context_tokens, self.max_tokens = horizon, max_context_tokens, \
            max_tokens
        self.version, self.end_id, self.model = version, end_id, model
        self.turns: list[Turn] = []
        self.history: list[Message] = []  # the last request's messages + the reply returned
        self.tools: list | None = None
        self.edits = 0
        self.cut: str | None = None  # "horizon" or "context": the endpoint refused a turn
        self.pending: _Pending | None = None

    # -- requests ----------------------------------------------------------------------------
    def prompt(self, body: dict[str, Any]) -> tuple[list[int], int]:
        """The prompt ids and token budget for a chat request; raises AgentRequestError."""
        if self.pending is not None:
            raise AgentRequestError(409, "request_in_flight", "this episode already has a "
                                    "request in flight; send one at a time")
        if len(self.turns) >= self.horizon:
            self.cut = self.cut or "horizon"
            raise AgentRequestError(400, "horizon_reached", f"the episode has used its "
                                    f"{self.horizon} turns (the curriculum's horizon)")
        tools, choice = body.get("tools") or None, body.get("tool_choice", "auto")
        if why := check_tool_choice(tools, choice):
            raise AgentRequestError(400, "invalid_tool_choice", why)
        try:
            messages = normalize(body.get("messages"))
            shown = tools if renders_tools(tools, choice) else None
            ids, extends = self._ids(messages, shown)
        except MessageError as exc:
            raise AgentRequestError(400, "invalid_messages", str(exc)) from None
        asked = body.get("max_completion_tokens") or body.get("max_tokens") or self.max_tokens
        budget = min(int(asked), self.max_tokens)
        if len(ids) + budget > self.max_context_tokens:
            self.cut = self.cut or "context"
            raise AgentRequestError(400, "context_length_exceeded", f"{len(ids)} prompt "
                                    f"tokens + {budget} for the reply > the context of "
                                    f"{self.max_context_tokens} (generator.max_context_tokens)")
        self.pending = _Pending(messages, shown, choice, ids, extends)
        return ids, budget

    def _ids(self, messages: list[Message], tools: list | None) -> tuple[list[int], bool]:
        """Kept ids + the new messages' tokens where the history is extended; else the whole
        history tokenised (an edit, when there was a previous turn)."""
        n = len(self.history)
        extends = bool(self.turns) and tools == self.tools and len(messages) >= n and all(
            same_message(a, b) for a, b in zip(messages, self.history))
        if extends:
            last = self.turns[-1]
            return (last.context + last.sampled + last.closer
                    + self.renderer.continuation(self.history, messages[n:], tools)), True
        self.edits += bool(self.turns)
        return self.renderer.ids(messages, tools), False

    def complete(self, completion: Completion) -> dict[str, Any]:
        """Record the sampled reply; the chat.completion the endpoint answers with."""
        p, self.pending = self.pending, None
        ids = list(completion.token_ids)
        closed = bool(ids) and ids[-1] == self.end_id
        text = self.renderer.tokenizer.decode(ids[:-1] if closed else ids)
        reply = self.parser(text, tools=p.tools, tool_choice=p.tool_choice)
        action = "; ".join(f"{c['function']['name']} {c['function']['arguments']}"
                           for c in reply.tool_calls) or " ".join(reply.content.split())
        self.turns.append(Turn(p.ids, p.extends, ids, list(completion.logprobs),
                               [] if closed else [self.end_id], self.version, reply.error,
                               action[:500]))
        message: Message = {"role": "assistant", "content": reply.content or None}
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        self.history, self.tools = [*p.messages, normalize([message])[0]], p.tools
        finish = "length" if completion.finish_reason == "length" else (
            "tool_calls" if reply.tool_calls else "stop")
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                "created": int(time.time()), "model": self.model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish,
                             "logprobs": None}],
                "usage": {"prompt_tokens": len(p.ids), "completion_tokens": len(ids),
                          "total_tokens": len(p.ids) + len(ids)},
                "horizonrl": {"turn": len(self.turns), "policy_version": self.version,
                              "extended": p.extends,
                              **({"invalid_tool_call": reply.error} if reply.error else {})}}

    def drop_pending(self) -> None:
        """The request's generation was abandoned (the agent finished without its reply)."""
        self.pending = None

    # -- the episode -------------------------------------------------------------------------
    def trajectory(self, outcome: AgentOutcome | None, failure: Failure, *, trajectory_id: str,
                   group_id: str, task_id: str, env_name: str, info: dict[str, Any]
                   ) -> Trajectory:
        """The episode as a Trajectory: the final reward on the last turn; one row per turn
        (`turn_spans`) when the agent edited its history, else one row."""
        if outcome is None and failure is Failure.NONE:
            failure = Failure.ENV_ERROR
        if not self.turns and failure is Failure.NONE:
            failure, info = Failure.ENV_ERROR, {**info, "agent_error": "the agent finished "
                                                "without asking the model for anything"}
        prompt, resp, mask, lps, spans = self._token_layout()
        n = len(self.turns)
        reward = outcome.reward if outcome is not None else 0.0
        rewards = tuple([0.0] * (n - 1) + [float(reward)]) if n else ()
        versions = tuple(t.version for t in self.turns)
        terminated = outcome is not None and outcome.terminated and self.cut is None
        invalid = [k for k, t in enumerate(self.turns) if t.invalid]
        # Invalid actions: turns with a malformed call, plus the env steps the env rejected
        # (the agent steps its env itself, so those are known per episode, not per turn; one
        # step per reply is the usual case). `invalid_turns` lists the former only.
        rejected = int((outcome.info if outcome else {}).get("env_invalid_steps", 0))
        return Trajectory(
            trajectory_id=trajectory_id, group_id=group_id, task_id=task_id,
            env_name=env_name, policy_version=min(versions, default=self.version),
            horizon=max(self.horizon, n), prompt_ids=tuple(prompt), response_ids=tuple(resp),
            response_mask=tuple(mask), response_logprobs=tuple(lps), rewards=rewards,
            reward=float(sum(rewards)), num_turns=n, terminated=terminated,
            truncated=not terminated and failure is Failure.NONE, failure=failure,
            info={"success": bool(outcome and outcome.success), "agent": True,
                  "invalid_actions": min(n, len(invalid) + rejected), "invalid_turns": invalid,
                  "invalid_tool_calls": [t.invalid for t in self.turns if t.invalid],
                  "actions": [t.action for t in self.turns],
                  "edited_history": self.edits,
                  "env_steps": outcome.env_steps if outcome else 0,
                  **({"cut": self.cut} if self.cut else {}),
                  **(outcome.info if outcome else {}), **info},
            turn_spans=tuple(spans) if self.edits else (),
            turn_versions=versions if len(set(versions)) > 1 else ())

    def _token_layout(self) -> tuple[list[int], list[int], list[int], list[float], list]:
        """prompt_ids and the response (ids, mask, logprobs) with each turn's span. Turns that
        extend the one before add only the new messages' ids; a turn after an edit adds its
        whole prompt past the part every turn's prompt shares (`prompt_ids`)."""
        if not self.turns:
            return [], [], [], [], []
        prompt = _common_prefix([t.context for t in self.turns])
        resp: list[int] = []
        mask: list[int] = []
        lps: list[float] = []
        spans = []
        window, prev = 0, prompt
        for t in self.turns:
            if t.extends:
                new = t.context[len(prev):]
            else:  # the first turn, or one after an edit: its own window
                window, new = len(resp), t.context[len(prompt):]
            resp += new
            mask += [0] * len(new)
            lps += [0.0] * len(new)
            start = len(resp)
            resp += t.sampled + t.closer
            mask += [1] * len(t.sampled) + [0] * len(t.closer)
            lps += t.logprobs + [0.0] * len(t.closer)
            spans.append((window, start, len(resp)))
            prev = t.context + t.sampled + t.closer
        return prompt, resp, mask, lps, spans


def _common_prefix(seqs: list[list[int]]) -> list[int]:
    first = seqs[0]
    n = len(first)
    for s in seqs[1:]:
        n = min(n, len(s))
        for i in range(n):
            if s[i] != first[i]:
                n = i
                break
    return first[:n]


class AgentSessions:
    """The episodes the endpoint serves, by API key. The server thread looks keys up; the
    rollout thread opens and closes sessions."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, AgentSession] = {}

    def open(self, session: AgentSession) -> None:
        with self._lock:
            self._open[session.key] = session

    def close(self, key: str) -> None:
        with self._lock:
            self._open.pop(key, None)

    def get(self, key: str) -> AgentSession | None:
        with self._lock:
            return self._open.get(key)

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)
