"""Tool calls in a sampled reply: hermes style (Qwen2.5, the tiny model's template).

The model writes `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks after its
text. Parsing never raises: a malformed block, a call to a function the request did not offer,
or a reply that breaks `tool_choice` comes back as `error` with the parser's message, and the
endpoint answers with the text alone (the turn is recorded as an invalid action). Nothing
constrains sampling to the format: the learner must reproduce the distribution the tokens were
drawn from, which guided decoding would change.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from horizonrl.protos.chat import TOOL_CALL_END, TOOL_CALL_START

_BLOCK = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)(" + re.escape(TOOL_CALL_END) + "|$)",
                    re.DOTALL)


@dataclass(frozen=True, slots=True)
class ParsedReply:
    """A reply as the endpoint returns it: text, OpenAI `tool_calls`, and why it is invalid
    ("" when it is not)."""

    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""


class ToolParser(Protocol):
    """What a reply parser provides (users may plug in their model's format)."""

    def __call__(self, text: str, *, tools: list[dict[str, Any]] | None,
                 tool_choice: Any) -> ParsedReply: ...


def offered_names(tools: list[dict[str, Any]] | None) -> list[str]:
    """The function names a request's `tools` offer."""
    names = []
    for tool in tools or []:
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.append(fn["name"])
    return names


def renders_tools(tools: list[dict[str, Any]] | None, tool_choice: Any) -> bool:
    """Whether the prompt shows the functions: not with tool_choice "none", so the model is
    not told of functions it may not call."""
    return bool(tools) and tool_choice != "none"


def parse_hermes(text: str, *, tools: list[dict[str, Any]] | None,
                 tool_choice: Any = "auto") -> ParsedReply:
    """Split `text` into its prose and `<tool_call>` blocks, checked against `tools` and
    `tool_choice` (none | auto | required | {"type": "function", "function": {"name"}})."""
    if not renders_tools(tools, tool_choice):
        return ParsedReply(text)
    start = text.find(TOOL_CALL_START)
    content = text if start < 0 else text[:start].rstrip()
    calls: list[dict[str, Any]] = []
    names = offered_names(tools)
    for k, match in enumerate(_BLOCK.finditer(text, max(start, 0)) if start >= 0 else ()):
        body, closed = match.group(1), match.group(2)
        if not closed:
            return ParsedReply(text, error=f"tool call {k} is not closed with {TOOL_CALL_END}")
        try:
            call = json.loads(body)
        except ValueError as exc:
            return ParsedReply(text, error=f"tool call {k} is not JSON: {exc}")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return ParsedReply(text, error=f"tool call {k} needs a string \"name\"")
        args = call.get("arguments", {})
        if not isinstance(args, dict):
            return ParsedReply(text, error=f"tool call {k}: \"arguments\" must be an object")
        if call["name"] not in names:
            return ParsedReply(text, error=f"tool call {k} names {call['name']!r}, not one of "
                               f"the offered functions ({', '.join(names)})")
        calls.append({"id": f"call_{uuid.uuid4().hex[:16]}", "type": "function",
                      "function": {"name": call["name"],
                                   "arguments": json.dumps(args, ensure_ascii=False)}})
    return ParsedReply(content, calls, _choice_error(calls, tool_choice))


def _choice_error(calls: list[dict[str, Any]], tool_choice: Any) -> str:
    if tool_choice == "required" and not calls:
        return "tool_choice is \"required\" but the reply calls no function"
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function")
        want = fn.get("name") if isinstance(fn, dict) else None
        if not calls or any(c["function"]["name"] != want for c in calls):
            return f"tool_choice names {want!r} but the reply does not call (only) it"
    return ""


def check_tool_choice(tools: list[dict[str, Any]] | None, tool_choice: Any) -> str:
    """Why a request's `tool_choice` is unusable ("" when it is fine)."""
    if tool_choice in (None, "auto", "none"):
        return ""
    if tool_choice == "required" or isinstance(tool_choice, dict):
        if not tools:
            return "tool_choice asks for a function call but the request offers no tools"
        if isinstance(tool_choice, dict):
            fn = tool_choice.get("function")
            name = fn.get("name") if isinstance(fn, dict) else None
            if name not in offered_names(tools):
                return f"tool_choice names {name!r}, not one of the offered functions"
        return ""
    return f"tool_choice must be none, auto, required or a function, got {tool_choice!r}"


PARSERS: dict[str, ToolParser] = {"hermes": parse_hermes}


def tool_parser(name: str) -> ToolParser:
    """A registered parser by name, or a user's `module:function` (a `ToolParser`)."""
    if name in PARSERS:
        return PARSERS[name]
    module, sep, attr = name.partition(":")
    if not sep:
        raise ValueError(f"unknown tool parser {name!r}: use one of {', '.join(PARSERS)} or "
                         "'module:function'")
    import importlib

    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"tool parser {name!r} cannot be loaded: {exc}") from exc
