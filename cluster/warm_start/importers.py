"""`horizonrl demos --import FILE --format agentgym|openai`: other people's trajectories as our
demonstrations.

Each record becomes an ordinary `Trajectory` in OUT/demos.jsonl (+ summary.json), exactly what
`horizonrl demos` writes, so `sft`, `rs`, `dpo` and the `init:` warm start read it unchanged.
The conversation is rendered with the model's own chat template (`protos.messages.Renderer`):
`response_mask` is 1 on the trainable assistant messages' tokens (up to and including their end
token) and 0 on everything else.

Formats:
- agentgym (AgentGym's AgentTraj-L): a JSON array, or JSONL, of `{"item_id", "conversations":
  [{"from": "human"|"gpt"|"system", "loss": bool|null, "value"}]}`. A message is trained when
  `loss` is true, or when it is a gpt message without `loss`; `loss: true` elsewhere is an error.
- openai: JSONL of `{"messages", "tools"?, "reward"?, "env"?, "task_id"?}` (chat messages with
  tool calls); assistant messages are trained unless they carry `"weight": 0`.

A record that cannot be imported is skipped with its line (JSONL) or index (JSON array) and a
reason; the reasons are printed and counted in summary.json, never silently dropped.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from horizonrl.cluster.config import RunConfig
from horizonrl.cluster.warm_start.demos import DEMOS_FILE, SUMMARY_FILE, DemoSummary
from horizonrl.protos.chat import load_tokenizer
from horizonrl.protos.codec import to_json_line
from horizonrl.protos.messages import ROLES, Message, MessageError, Renderer, normalize
from horizonrl.protos.trajectory import Trajectory

FORMATS = ("agentgym", "openai")
AGENTGYM_ROLES = {"human": "user", "gpt": "assistant", "system": "system"}
# Imported data are demonstrations, and published agent datasets (AgentTraj-L among them) keep
# only successful episodes: a record without a reward counts as a success.
DEFAULT_REWARD = 1.0
SHOWN = 20  # skipped records printed one by one; the rest are counted


class ImportFailed(ValueError):
    """The file as a whole cannot be imported (unreadable, not JSON, unknown format)."""


class BadRecord(ValueError):
    """One record that cannot be imported: `reason` is a short key (counted in summary.json),
    `detail` says where in the record and why."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass(slots=True)
class Conversation:
    """One record as normalized chat messages, which of them are trained, and its labels."""

    messages: list[Message]
    trainable: list[bool]
    tools: list[dict] | None = None
    reward: float = DEFAULT_REWARD
    env_name: str = "imported"
    task_id: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


def _normalized(messages: list[Message]) -> list[Message]:
    try:
        return normalize(messages)
    except MessageError as exc:
        raise BadRecord("bad_message", str(exc)) from None


def agentgym_conversation(rec: Any) -> Conversation:
    """An AgentTraj-L record; env_name is item_id up to its last "_" ("textcraft_12")."""
    if not isinstance(rec, dict):
        raise BadRecord("bad_field", "the record is not a JSON object")
    item, turns = rec.get("item_id"), rec.get("conversations")
    if not isinstance(item, str) or not item:
        raise BadRecord("bad_field", "item_id must be a non-empty string")
    if not isinstance(turns, list) or not turns:
        raise BadRecord("bad_field", "conversations must be a non-empty list")
    messages, trainable = [], []
    for i, m in enumerate(turns):
        if not (isinstance(m, dict) and isinstance(m.get("from"), str)
                and isinstance(m.get("value"), str)):
            raise BadRecord("bad_field", f"conversations[{i}] needs string 'from' and 'value'")
        role, loss = AGENTGYM_ROLES.get(m["from"]), m.get("loss")
        if role is None:
            raise BadRecord("unknown_role", f"conversations[{i}].from is {m['from']!r}")
        if loss is not None and not isinstance(loss, bool):
            raise BadRecord("bad_field", f"conversations[{i}].loss must be true, false or null")
        if loss and role != "assistant":  # only the agent's own words can be learned
            raise BadRecord("loss_on_non_gpt", f"conversations[{i}] is {m['from']!r} with "
                            "loss: true")
        messages.append({"role": role, "content": m["value"]})
        trainable.append(role == "assistant" and loss is not False)
    return Conversation(_normalized(messages), trainable, env_name=item.rpartition("_")[0] or item,
                        task_id=item, info={"item_id": item})


def openai_conversation(rec: Any) -> Conversation:
    """An OpenAI fine-tuning line: messages (tool calls allowed), optional tools, reward,
    env and task_id; `"weight": 0` keeps an assistant message in the context untrained."""
    if not isinstance(rec, dict):
        raise BadRecord("bad_field", "the record is not a JSON object")
    messages, tools = rec.get("messages"), rec.get("tools")
    reward = rec.get("reward", DEFAULT_REWARD)
    if not isinstance(messages, list) or not messages:
        raise BadRecord("bad_field", "messages must be a non-empty list")
    if tools is not None and not (isinstance(tools, list)
                                  and all(isinstance(t, dict) for t in tools)):
        raise BadRecord("bad_field", "tools must be a list of objects")
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(
            reward):
        raise BadRecord("bad_field", f"reward must be a finite number, got {reward!r}")
    for key in ("env", "task_id"):
        if rec.get(key) is not None and not isinstance(rec[key], str):
            raise BadRecord("bad_field", f"{key} must be a string")
    trainable = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if isinstance(m, dict) and role not in (*ROLES, "developer"):
            raise BadRecord("unknown_role", f"messages[{i}].role is {role!r}")
        weight = m.get("weight", 1) if isinstance(m, dict) else 1
        if weight not in (0, 1):
            raise BadRecord("bad_field", f"messages[{i}].weight must be 0 or 1")
        trainable.append(role == "assistant" and weight == 1)
    return Conversation(_normalized(messages), trainable, tools=tools or None,
                        reward=float(reward), env_name=rec.get("env") or "imported",
                        task_id=rec.get("task_id"))


def to_trajectory(conv: Conversation, renderer: Renderer, *, ident: str, max_tokens: int,
                  info: dict[str, Any]) -> Trajectory:
    """The conversation in token space: the prompt up to the first assistant message's
    generation prompt, then everything else as the response (mask 1 on trained messages)."""
    assistants = [i for i, m in enumerate(conv.messages) if m["role"] == "assistant"]
    if not any(conv.trainable):
        raise BadRecord("no_trainable_message", "no assistant message is marked for training")
    try:
        prompt = renderer.ids(conv.messages[:assistants[0]], conv.tools)
        pieces = renderer.segments(conv.messages, conv.trainable, conv.tools)
    except Exception as exc:  # a chat template is third-party Jinja: whatever it raises
        # condemns this record, not the whole import
        raise BadRecord("template_failure", f"{type(exc).__name__}: {exc}") from None
    # segments' first piece is the same text as the prompt; anything else means the template
    # does not render messages one after another and the split would be wrong.
    if not prompt or pieces[0] != (prompt, False):
        raise BadRecord("template_failure", "the first assistant message's prompt does not "
                        "render as its own segment")
    response = [t for ids, _ in pieces[1:] for t in ids]
    mask = [int(flag) for ids, flag in pieces[1:] for _ in ids]
    if len(prompt) + len(response) > max_tokens:
        raise BadRecord("too_long", f"{len(prompt) + len(response)} tokens > "
                        f"generator.max_context_tokens {max_tokens}")
    turns = len(assistants)
    return Trajectory(
        trajectory_id=ident, group_id=ident, task_id=conv.task_id or ident,
        env_name=conv.env_name, policy_version=0, horizon=turns,
        prompt_ids=tuple(prompt), response_ids=tuple(response), response_mask=tuple(mask),
        response_logprobs=(0.0,) * len(response),
        rewards=(0.0,) * (turns - 1) + (conv.reward,), reward=conv.reward, num_turns=turns,
        terminated=True, truncated=False,
        info={"success": conv.reward > 0, **info, **conv.info})


def _jsonl(lines: Iterable[str]) -> list[tuple[str, int, Any]]:
    rows: list[tuple[str, int, Any]] = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                rows.append(("line", n, json.loads(line)))
            except json.JSONDecodeError as exc:
                rows.append(("line", n, BadRecord("malformed_json", str(exc))))
    return rows


def read_records(path: Path, fmt: str) -> list[tuple[str, int, Any]]:
    """(`"line"` or `"index"`, its number, the parsed record or a BadRecord) per record; an
    agentgym file starting with "[" is one JSON array, any other file JSONL. Read whole and
    before anything is written: a file that cannot be read leaves no half-made output."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ImportFailed(f"cannot read {path}: {exc}") from None
    if fmt == "agentgym" and text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ImportFailed(f"{path} starts like a JSON array but is not JSON: {exc}") from None
        return [("index", i, rec) for i, rec in enumerate(records)]
    rows = _jsonl(text.split("\n"))  # not splitlines: JSON strings may hold U+2028
    if fmt == "agentgym" and rows and all(isinstance(r, BadRecord) for _, _, r in rows):
        raise ImportFailed(f"{path} is neither a JSON array nor JSONL (no line is JSON)")
    return rows


def import_demos(cfg: RunConfig, *, path: str | Path, fmt: str, model_path: str,
                 out: str | Path) -> dict[str, Any]:
    """Write the importable records of `path` to OUT/demos.jsonl and summary.json (what
    `collect_demos` writes, plus "imported", "skipped" and "skipped_by_reason"); print each
    skipped record's number and reason (the first SHOWN) to stderr. Returns the summary.
    Raises ImportFailed when the file as a whole cannot be read."""
    if fmt not in FORMATS:
        raise ImportFailed(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    path, out, t0 = Path(path), Path(out), time.perf_counter()
    records = read_records(path, fmt)
    parse = agentgym_conversation if fmt == "agentgym" else openai_conversation
    renderer = Renderer(load_tokenizer(model_path))
    out.mkdir(parents=True, exist_ok=True)
    per_env: dict[str, DemoSummary] = {}
    skipped: list[tuple[str, BadRecord]] = []
    with (out / DEMOS_FILE).open("w") as f:
        for kind, n, rec in records:
            try:
                if isinstance(rec, BadRecord):
                    raise rec
                t = to_trajectory(parse(rec), renderer, ident=f"import-{path.stem}-{n}",
                                  max_tokens=cfg.generator.max_context_tokens,
                                  info={"source": fmt, "record": n, "file": path.name})
            except BadRecord as bad:
                skipped.append((f"{kind} {n}", bad))
                continue
            f.write(to_json_line(t) + "\n")
            per_env.setdefault(t.env_name, DemoSummary()).add(t)
    total = DemoSummary(*(sum(getattr(v, k) for v in per_env.values())
                          for k in ("episodes", "successes", "turns", "tokens", "failures")))
    summary = {**total.as_dict(), "imported": total.episodes, "skipped": len(skipped),
               "skipped_by_reason": dict(Counter(bad.reason for _, bad in skipped)),
               "seconds": round(time.perf_counter() - t0, 1), "source": fmt,
               "file": str(path), "env": "+".join(per_env),
               "per_env": {k: v.as_dict() for k, v in per_env.items()}}
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
    _report(skipped, summary, out)
    return summary


def _report(skipped: list[tuple[str, BadRecord]], summary: dict[str, Any], out: Path) -> None:
    for where, bad in skipped[:SHOWN]:
        print(f"[demos] skipped {where}: {bad.reason}: {bad.detail}", file=sys.stderr)
    if len(skipped) > SHOWN:
        print(f"[demos] ... and {len(skipped) - SHOWN} more skipped records", file=sys.stderr)
    print(f"[demos] imported {summary['imported']} records ({summary['skipped']} skipped: "
          f"{summary['skipped_by_reason']}) to {out / DEMOS_FILE}", flush=True)
