"""An agent written with the `openai` SDK that plays TextCraft through tool calls.

    agent:
      callable: horizonrl.envpool.agents.textcraft_tools:play

It is the kind of code a user already has: a chat loop that offers functions (`get`, `craft`,
`inventory`), runs the calls the model makes, and sends the whole history back each turn.
horizonrl trains the model behind `task.client()` on it unchanged. A reply without tool calls
is read as a plain "Action: <command>" line (what the tiny model's pre-training taught it), so
a model that has not learnt the tool format still plays.

`play_plain` offers no tools. `play_trimmed` keeps only the task and its latest turns in the
history it sends, as agents with long episodes do: its requests edit the history, which the
endpoint flags and trains turn by turn. `play_concise` adds a user-defined reward (TRL's length
reward: replies near 20 characters score best), which varies from the first step even for a
model that solves no task yet; the tests train the tiny model on it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from horizonrl.envpool.textcraft import SYSTEM_PROMPT, parse_action

TOOLS = [
    {"type": "function", "function": {
        "name": "get", "description": "Fetch a base item.",
        "parameters": {"type": "object", "properties": {
            "count": {"type": "integer"}, "item": {"type": "string"}},
            "required": ["count", "item"]}}},
    {"type": "function", "function": {
        "name": "craft", "description": "Craft an item from exactly the listed ingredients.",
        "parameters": {"type": "object", "properties": {
            "count": {"type": "integer"}, "item": {"type": "string"},
            "ingredients": {"type": "string", "description": "e.g. '1 oak logs'"}},
            "required": ["count", "item", "ingredients"]}}},
    {"type": "function", "function": {
        "name": "inventory", "description": "List what you carry.",
        "parameters": {"type": "object", "properties": {}}}},
]
MAX_TOKENS = 48


def command(name: str, args: dict[str, Any]) -> str:
    """The TextCraft command for a function call."""
    if name == "get":
        return f"get {args.get('count', 1)} {args.get('item', '')}"
    if name == "craft":
        return f"craft {args.get('count', 1)} {args.get('item', '')} using " \
               f"{args.get('ingredients', '')}"
    return "inventory"


def play(task: Any, keep_turns: int | None = None,
         reward: Callable[[list[str]], float] | None = None,
         tools: list[dict[str, Any]] | None = TOOLS) -> float | None:
    """One episode: at most `task.horizon` model calls. Returns None (the env's reward), or
    `reward(replies)` of the replies' texts. With `keep_turns`, each request carries the system
    prompt, the task and only the latest `keep_turns` exchanges; `tools=None` offers none."""
    replies: list[str] = []
    client = task.client()
    observation, _ = task.env.reset()
    head = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": observation}]
    turns: list[list[dict[str, Any]]] = []  # each: the reply and what answered it
    for _ in range(task.horizon):
        recent = turns if keep_turns is None else turns[-keep_turns:]
        messages = head + [m for turn in recent for m in turn]
        extra = {"tools": tools} if tools else {}
        reply = client.chat.completions.create(model=task.model, messages=messages,
                                               max_tokens=MAX_TOKENS, **extra)
        message = reply.choices[0].message
        replies.append(message.content or "")
        turn = [message.model_dump(exclude_none=True, include={"role", "content",
                                                               "tool_calls"})]
        done = False
        for call in message.tool_calls or []:
            try:
                args = json.loads(call.function.arguments or "{}")
            except ValueError:
                args = {}
            result = task.env.step(command(call.function.name, args))
            turn.append({"role": "tool", "tool_call_id": call.id,
                         "content": result.observation})
            done = done or result.terminated or result.truncated
        if not message.tool_calls:  # plain text: its "Action:" line is the command
            result = task.env.step(parse_action(message.content or ""))
            turn.append({"role": "user", "content": result.observation})
            done = result.terminated or result.truncated
        turns.append(turn)
        if done:
            break
    return None if reward is None else reward(replies)


def play_plain(task: Any) -> float | None:
    """`play` without tools: plain "Action:" replies, whose prompts are token for token those
    of horizonrl's own loop (bench/agent_endpoint.py measures the endpoint's cost with it)."""
    return play(task, tools=None)


def play_trimmed(task: Any) -> float | None:
    """`play` sending only the latest two exchanges after the task."""
    return play(task, keep_turns=2)


def concise(replies: list[str]) -> float:
    """TRL's length reward: 0 for a 20-character reply, less the further from it."""
    return -sum(abs(len(r) - 20) for r in replies) / (20.0 * max(len(replies), 1))


def play_concise(task: Any) -> float | None:
    """`play_trimmed` rewarded by `concise`."""
    return play(task, keep_turns=2, reward=concise)
