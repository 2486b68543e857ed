"""Hermes tool calls in a reply: parsed, checked against the offered tools and tool_choice,
and what a malformed call becomes (the text alone, with the parser's message)."""

from __future__ import annotations

import json

import pytest

from horizonrl.actors.tool_calls import check_tool_choice, parse_hermes, renders_tools

TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
         for n in ("get", "craft", "inventory")]


def test_several_calls_in_one_reply_keep_their_order_and_arguments():
    text = ('I need logs. <tool_call>{"name": "get", "arguments": {"count": 1, "item": '
            '"oak logs"}}</tool_call>\n<tool_call>{"name": "inventory", "arguments": {}}'
            '</tool_call>')
    reply = parse_hermes(text, tools=TOOLS)
    assert reply.error == "" and reply.content == "I need logs."
    assert [c["function"]["name"] for c in reply.tool_calls] == ["get", "inventory"]
    assert json.loads(reply.tool_calls[0]["function"]["arguments"]) == {"count": 1,
                                                                      "item": "oak logs"}
    assert len({c["id"] for c in reply.tool_calls}) == 2
    assert all(c["type"] == "function" for c in reply.tool_calls)


@pytest.mark.parametrize("text, why", [
    ('<tool_call>{"name": "get", "arguments": {}}', "not closed"),
    ("<tool_call>{name: get}</tool_call>", "not JSON"),
    ('<tool_call>{"arguments": {}}</tool_call>', "needs a string"),
    ('<tool_call>{"name": "get", "arguments": [1]}</tool_call>', "must be an object"),
    ('<tool_call>{"name": "fly", "arguments": {}}</tool_call>', "not one of the offered"),
])
def test_a_malformed_call_is_the_text_alone_with_the_parsers_message(text, why):
    reply = parse_hermes(text, tools=TOOLS)
    assert why in reply.error
    assert reply.content == text and reply.tool_calls == []


def test_tool_choice_none_auto_required_and_named():
    call = '<tool_call>{"name": "get", "arguments": {"item": "x"}}</tool_call>'
    # none: the prompt shows no tools and nothing is parsed.
    assert not renders_tools(TOOLS, "none")
    assert parse_hermes(call, tools=TOOLS, tool_choice="none").tool_calls == []
    assert parse_hermes(call, tools=TOOLS, tool_choice="auto").tool_calls
    assert parse_hermes("just text", tools=TOOLS, tool_choice="auto").error == ""
    assert "required" in parse_hermes("just text", tools=TOOLS, tool_choice="required").error
    named = {"type": "function", "function": {"name": "craft"}}
    assert "craft" in parse_hermes(call, tools=TOOLS, tool_choice=named).error
    assert check_tool_choice(TOOLS, named) == ""
    assert "offers no tools" in check_tool_choice(None, "required")
    assert "not one of" in check_tool_choice(TOOLS, {"type": "function",
                                                     "function": {"name": "fly"}})
    assert "must be" in check_tool_choice(TOOLS, "sometimes")


def test_no_tools_means_plain_text():
    text = '<tool_call>{"name": "get", "arguments": {}}</tool_call>'
    assert parse_hermes(text, tools=None).content == text
