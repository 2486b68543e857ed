"""OpenAI chat messages in token space, through the model's own chat template.

Three uses: the first prompt of an episode an outside agent runs (`Renderer.ids`); the ids its
next request adds after an assistant turn whose sampled ids are kept (`Renderer.continuation`,
the exact-token rule of actors/agent_sessions.py); and a whole conversation as training segments,
the assistant's marked trainable (`Renderer.segments`, for imported demonstrations).

Only text is rendered from messages; ids the model sampled are never re-encoded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from horizonrl.protos.chat import IM_END

ROLES = ("system", "user", "assistant", "tool")
Message = dict[str, Any]


class MessageError(ValueError):
    """A message list that cannot be rendered; the text says which message and why."""


def normalize(messages: Any) -> list[Message]:
    """Validated copies of OpenAI chat messages: `role`, `content` as a string (text parts
    joined; None only for an assistant that calls tools), assistant `tool_calls` as
    `{"id", "type": "function", "function": {"name", "arguments": <JSON string>}}`, and a
    tool message's `tool_call_id`. `developer` is read as `system`. Raises MessageError."""
    if not isinstance(messages, list) or not messages:
        raise MessageError("messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise MessageError(f"messages[{i}] is not an object")
        role = "system" if m.get("role") == "developer" else m.get("role")
        if role not in ROLES:
            raise MessageError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got "
                               f"{m.get('role')!r}")
        msg: Message = {"role": role, "content": _text(m.get("content"), i)}
        calls = m.get("tool_calls") or []
        if calls and role != "assistant":
            raise MessageError(f"messages[{i}]: only assistant messages carry tool_calls")
        if calls:
            msg["tool_calls"] = [_call(c, i, k) for k, c in enumerate(_listed(calls, i))]
        if msg["content"] is None and not calls:
            msg["content"] = ""
        if role == "tool":
            msg["tool_call_id"] = str(m.get("tool_call_id") or "")
        out.append(msg)
    return out


def _listed(calls: Any, i: int) -> list:
    if not isinstance(calls, list):
        raise MessageError(f"messages[{i}].tool_calls must be a list")
    return calls


def _text(content: Any, i: int) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise MessageError(f"messages[{i}].content: only text parts are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise MessageError(f"messages[{i}].content must be a string or a list of text parts")


def _call(call: Any, i: int, k: int) -> Message:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise MessageError(f"messages[{i}].tool_calls[{k}] needs function.name")
    args = fn.get("arguments", "{}")
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    return {"id": str(call.get("id") or f"call_{k}"), "type": "function",
            "function": {"name": fn["name"], "arguments": args}}


def same_message(a: Message, b: Message) -> bool:
    """Whether two normalized messages say the same thing: role, text and tool calls (name and
    arguments, compared as JSON values; call ids, which clients may rewrite, do not count)."""
    if a["role"] != b["role"] or (a.get("content") or "") != (b.get("content") or ""):
        return False
    ca, cb = a.get("tool_calls") or [], b.get("tool_calls") or []
    return len(ca) == len(cb) and all(
        x["function"]["name"] == y["function"]["name"]
        and _json_value(x["function"]["arguments"]) == _json_value(y["function"]["arguments"])
        for x, y in zip(ca, cb))


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


class Renderer:
    """Messages to ids with a tokenizer's chat template (`end` closes every message)."""

    def __init__(self, tokenizer: Any, end: str = IM_END) -> None:
        self.tokenizer = tokenizer
        self.end = end

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def text(self, messages: Sequence[Message], tools: list | None = None, *,
             generation_prompt: bool) -> str:
        if tools and "tools" not in (self.tokenizer.chat_template or ""):
            raise MessageError("this model's chat template does not render tools")
        return self.tokenizer.apply_chat_template(
            list(messages), tools=tools or None, tokenize=False,
            add_generation_prompt=generation_prompt)

    def ids(self, messages: Sequence[Message], tools: list | None = None) -> list[int]:
        """The prompt for the next assistant turn after `messages`, tokenised whole."""
        return self.encode(self.text(messages, tools, generation_prompt=True))

    def continuation(self, history: Sequence[Message], new: Sequence[Message],
                     tools: list | None = None) -> list[int]:
        """The ids that follow an assistant turn (the last of `history`, kept as the model
        sampled it, up to its end token) when `new` messages come after it: the template's
        text after that end token, the new messages, and the next generation prompt."""
        before = self.text(history, tools, generation_prompt=False)
        after = self.text([*history, *new], tools, generation_prompt=True)
        cut = before.rfind(self.end)
        if not after.startswith(before) or cut < 0:
            raise MessageError("the chat template does not render a conversation as its "
                               "messages one after another")
        return self.encode(before[cut + len(self.end):] + after[len(before):])

    def segments(self, messages: Sequence[Message], trainable: Sequence[bool],
                 tools: list | None = None) -> list[tuple[list[int], bool]]:
        """The whole conversation as (ids, trainable) pieces, in order: each assistant
        message from after its generation prompt up to and including its end token is one
        piece (trainable as `trainable[i]` says); everything else (system, user and tool
        messages, generation prompts, separators) is not trainable."""
        pieces: list[tuple[str, bool]] = []
        done = ""  # the text rendered so far
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            head = self.text(messages[:i], tools, generation_prompt=True)
            whole = self.text(messages[:i + 1], tools, generation_prompt=False)
            if not head.startswith(done) or not whole.startswith(head):
                raise MessageError(f"messages[{i}]: the chat template does not render the "
                                   "conversation as its messages one after another")
            body = whole[len(head):]
            cut = body.rfind(self.end)
            if cut < 0:
                raise MessageError(f"messages[{i}]: the template wrote no {self.end} after it")
            pieces += [(head[len(done):], False), (body[:cut + len(self.end)], trainable[i])]
            done = head + body[:cut + len(self.end)]
        tail = self.text(messages, tools, generation_prompt=False)
        if not tail.startswith(done):
            raise MessageError("the chat template does not render the conversation as its "
                               "messages one after another")
        pieces.append((tail[len(done):], False))
        return [(self.encode(text), flag) for text, flag in pieces if text]
