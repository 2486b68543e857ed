"""`horizonrl demos --import FILE --format agentgym|openai`: others' trajectories become our
demonstrations, token for token what the model's chat template renders, masked to the trained
assistant messages; bad records are skipped with their number and reason; the result trains."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import mask_runs

from horizonrl.cluster.config import load_config
from horizonrl.cluster.warm_start.auxiliary import read_trajectories
from horizonrl.cluster.warm_start.demos import DEMOS_FILE, SUMMARY_FILE
from horizonrl.cluster.warm_start.importers import import_demos
from horizonrl.protos.chat import IM_END

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "horizonrl.cluster.cli"]
ROLE = {"human": "user", "gpt": "assistant", "system": "system"}


def _gpt(value: str, loss: bool | None = None) -> dict:
    return {"from": "gpt", "loss": loss, "value": value}


def _human(value: str) -> dict:
    return {"from": "human", "loss": None, "value": value}


AGENTGYM = [  # AgentTraj-L's shape: a "gpt" acknowledgement with loss false, then the episode
    {"item_id": "textcraft_12", "conversations": [
        _human("You craft items. Reply with Thought and Action."), _gpt("OK.", False),
        _human("Goal: craft a stick."), _gpt("Thought: need planks.\nAction: get 1 oak log"),
        _human("Got 1 oak log."), _gpt("Thought: now craft.\nAction: craft 4 oak planks", True),
        _human("Crafted 4 oak planks."), _gpt("Action: craft 4 stick")]},
    {"item_id": "web_shop_3", "conversations": [
        {"from": "system", "value": "You shop online."}, _human("Buy socks."),
        {"from": "gpt", "value": "Action: search[socks]"}]},
]
TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Find a word",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}}]
OPENAI = {"messages": [
    {"role": "system", "content": "Answer with the tool."},
    {"role": "user", "content": "What does 'apple' mean?"},
    {"role": "assistant", "content": "I guess.", "weight": 0},
    {"role": "user", "content": "Use the tool."},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
     "function": {"name": "lookup", "arguments": "{\"word\": \"apple\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "a red fruit"},
    {"role": "assistant", "content": [{"type": "text", "text": "A red fruit."}]}],
    "tools": TOOLS, "reward": 0.5, "env": "dictionary", "task_id": "apple"}


def _trained_text(t, tokenizer) -> list[str]:
    return [tokenizer.decode(list(t.response_ids[s:e]))
            for v, s, e in mask_runs(t.response_mask) if v]


def _import(tmp_path: Path, model: Path, fmt: str, text: str, *overrides: str):
    src = tmp_path / f"data.{'json' if text.startswith('[') else 'jsonl'}"
    src.write_text(text)
    summary = import_demos(load_config(None, list(overrides)), path=src, fmt=fmt,
                           model_path=str(model), out=tmp_path / "out")
    return summary, read_trajectories(tmp_path / "out" / DEMOS_FILE)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "demos", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_agentgym_tokens_render_the_template_and_mask_the_trained_messages(
        tmp_path, tiny_model_path, tokenizer):
    summary, trajs = _import(tmp_path, tiny_model_path, "agentgym", json.dumps(AGENTGYM))
    assert summary["imported"] == 2 and summary["skipped"] == 0
    assert summary["skipped_by_reason"] == {} and summary["env"] == "textcraft+web_shop"
    for rec, t in zip(AGENTGYM, trajs):
        messages = [{"role": ROLE[m["from"]], "content": m["value"]}
                    for m in rec["conversations"]]
        assert tokenizer.decode(list(t.prompt_ids + t.response_ids)) == \
            tokenizer.apply_chat_template(messages, tokenize=False)
        first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        assert tokenizer.decode(list(t.prompt_ids)) == tokenizer.apply_chat_template(
            messages[:first], tokenize=False, add_generation_prompt=True)
        trained = [m["value"] + IM_END for m in rec["conversations"]
                   if m["from"] == "gpt" and m.get("loss") is not False]
        assert _trained_text(t, tokenizer) == trained
        turns = sum(m["from"] == "gpt" for m in rec["conversations"])
        assert (t.num_turns, t.horizon, t.rewards[-1], t.reward) == (turns, turns, 1.0, 1.0)
        assert t.terminated and t.policy_version == 0 and set(t.response_logprobs) == {0.0}
        assert t.info["success"] and t.info["source"] == "agentgym"
    assert "OK." not in "".join(_trained_text(trajs[0], tokenizer))  # loss: false stays out
    assert (trajs[0].env_name, trajs[0].task_id, trajs[0].info["record"]) == (
        "textcraft", "textcraft_12", 0)
    assert trajs[1].env_name == "web_shop" and trajs[0].trajectory_id != trajs[1].trajectory_id


def test_openai_tool_calls_tool_results_and_weight_zero(tmp_path, tiny_model_path, tokenizer):
    summary, (t,) = _import(tmp_path, tiny_model_path, "openai", json.dumps(OPENAI) + "\n")
    assert summary["imported"] == 1
    plain = [{**m, "content": m["content"] if not isinstance(m["content"], list)
              else m["content"][0]["text"]} for m in OPENAI["messages"]]
    rendered = tokenizer.apply_chat_template(plain, tools=TOOLS, tokenize=False)
    assert '<tool_call>{"name": "lookup"' in rendered and "<|im_start|>tool\n" in rendered
    assert tokenizer.decode(list(t.prompt_ids + t.response_ids)) == rendered
    # weight 0 ("I guess.") stays in the context untrained; the tool call and answer train.
    assert _trained_text(t, tokenizer) == [
        '<tool_call>{"name": "lookup", "arguments": {"word": "apple"}}</tool_call>' + IM_END,
        "A red fruit." + IM_END]
    assert "I guess." in tokenizer.decode(list(t.response_ids))
    assert (t.env_name, t.task_id, t.num_turns, t.rewards) == ("dictionary", "apple", 3,
                                                               (0.0, 0.0, 0.5))
    assert t.info["success"] and t.info["source"] == "openai" and t.info["record"] == 1


def test_a_template_that_fails_skips_only_its_records(tmp_path, tiny_model_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_path, model)
    (model / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m['role'] == 'tool' %}"
        "{{ raise_exception('no tool turns here') }}{% endif %}"
        "{{ '<|im_start|>' + m['role'] + '\n' + (m['content'] or '') + '<|im_end|>\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    plain = {"messages": [{"role": "user", "content": "hi"},
                          {"role": "assistant", "content": "hello"}]}
    summary, trajs = _import(tmp_path, model, "openai",
                             json.dumps({**OPENAI, "tools": None}) + "\n" + json.dumps(plain))
    assert (summary["imported"], summary["skipped_by_reason"]) == (1, {"template_failure": 1})
    assert trajs[0].info["record"] == 2


def test_bad_records_are_skipped_with_line_and_reason(tmp_path, tiny_model_path):
    good = AGENTGYM[0]
    lines = [json.dumps(good),
             '{"item_id": "textcraft_1", "conversations": [',
             json.dumps({"conversations": good["conversations"]}),
             json.dumps({"item_id": "a_1", "conversations": [{"from": "robot", "value": "x"}]}),
             json.dumps({"item_id": "a_2", "conversations": [
                 {"from": "human", "loss": True, "value": "x"}, _gpt("y")]}),
             json.dumps({"item_id": "a_3", "conversations": [_human("x"), _gpt("y", False)]}),
             json.dumps({"item_id": "a_4", "conversations": [_human("go north. " * 1500),
                                                             _gpt("y")]}),
             "", json.dumps({**good, "item_id": "textcraft_99"})]
    src = tmp_path / "mixed.jsonl"
    src.write_text("\n".join(lines) + "\n")
    proc = _cli("--import", str(src), "--format", "agentgym", "--out", str(tmp_path / "o"),
                "--model", str(tiny_model_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "o" / SUMMARY_FILE).read_text())
    assert (summary["imported"], summary["skipped"]) == (2, 6)
    assert summary["skipped_by_reason"] == {
        "malformed_json": 1, "bad_field": 1, "unknown_role": 1, "loss_on_non_gpt": 1,
        "no_trainable_message": 1, "too_long": 1}
    for n, reason in [(2, "malformed_json"), (3, "bad_field: item_id"), (4, "unknown_role"),
                      (5, "loss_on_non_gpt"), (6, "no_trainable_message"), (7, "too_long")]:
        assert f"skipped line {n}: {reason}" in proc.stderr, proc.stderr
    trajs = read_trajectories(tmp_path / "o" / DEMOS_FILE)
    assert [t.info["record"] for t in trajs] == [1, 9]

    bad = tmp_path / "bad.jsonl"  # OpenAI lines, every one bad: exit 2, each reason given
    bad.write_text("\n".join(json.dumps(r) for r in [
        {"messages": [{"role": "robot", "content": "x"}]},
        {**OPENAI, "reward": "high"},
        {"messages": [{"role": "user", "content": "x", "tool_calls": [{}]}]},
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y",
                                                        "weight": 0}]}]))
    proc = _cli("--import", str(bad), "--format", "openai", "--out", str(tmp_path / "b"),
                "--model", str(tiny_model_path))
    assert proc.returncode == 2 and "none of the 4 records" in proc.stderr, proc.stderr
    for n, reason in [(1, "unknown_role"), (2, "bad_field: reward"), (3, "bad_message"),
                      (4, "no_trainable_message")]:
        assert f"skipped line {n}: {reason}" in proc.stderr, proc.stderr


def test_unreadable_input_is_a_clear_error(tmp_path, tiny_model_path):
    model = ["--model", str(tiny_model_path)]
    broken = tmp_path / "broken.json"
    broken.write_text('[{"item_id": "a_1", "conversations": [}')
    proc = _cli("--import", str(broken), "--format", "agentgym", "--out", str(tmp_path), *model)
    assert proc.returncode == 2 and "not JSON" in proc.stderr, proc.stderr
    text = tmp_path / "notes.txt"
    text.write_text("these are\nnot trajectories\n")
    proc = _cli("--import", str(text), "--format", "agentgym", "--out", str(tmp_path), *model)
    assert proc.returncode == 2 and "neither a JSON array nor JSONL" in proc.stderr
    assert not (tmp_path / DEMOS_FILE).exists()  # a file-level error writes nothing
    proc = _cli("--import", str(tmp_path / "missing.jsonl"), "--format", "openai", "--out",
                str(tmp_path), *model)
    assert proc.returncode == 2 and "cannot read" in proc.stderr
    proc = _cli("--import", str(text), "--format", "sharegpt", "--out", str(tmp_path))
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
    proc = _cli("--import", str(text), "--out", str(tmp_path), *model)
    assert proc.returncode == 2 and "--format" in proc.stderr


def test_imported_demos_warm_start_sft(tmp_path, tiny_model_path):
    src = tmp_path / "agenttraj.json"
    src.write_text(json.dumps(AGENTGYM))
    proc = _cli("--import", str(src), "--format", "agentgym", "--out", str(tmp_path / "demos"),
                "--model", str(tiny_model_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    sft = subprocess.run(
        [*CLI, "sft", "--data", str(tmp_path / "demos" / DEMOS_FILE), "--out",
         str(tmp_path / "sft"), "--model", str(tiny_model_path), "--steps", "2",
         "--batch-size", "2", "learner.world_size=1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert sft.returncode == 0, sft.stdout[-3000:] + sft.stderr[-3000:]
    assert "2 examples" in sft.stdout  # both imported records, read as trajectories
    losses = [json.loads(x)["loss"] for x in (tmp_path / "sft/metrics.jsonl").read_text()
              .splitlines()]
    assert len(losses) == 2 and all(math.isfinite(x) and x > 0 for x in losses)
    assert (tmp_path / "sft/model/config.json").exists()


def test_many_skips_print_twenty_then_a_count(tmp_path, tiny_model_path, capsys):
    text = "\n".join(["{oops"] * 25 + [json.dumps(AGENTGYM[1])])
    summary, trajs = _import(tmp_path, tiny_model_path, "agentgym", text)
    err = capsys.readouterr().err
    assert (summary["imported"], summary["skipped_by_reason"]) == (1, {"malformed_json": 25})
    assert "skipped line 20: malformed_json" in err and "skipped line 21" not in err
    assert "and 5 more skipped records" in err and trajs[0].info["record"] == 26
