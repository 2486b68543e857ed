"""`horizonrl demos` as code: expert episodes over the real env pool (Ray actors), written through
the agent loop's token path. The format the trainer relies on is checked token by token."""

from __future__ import annotations

import json
import os
import re

import pytest
from conftest import mask_runs

from horizonrl.cluster.config import load_config
from horizonrl.cluster.model.tiny_model import expert_reply
from horizonrl.cluster.warm_start.auxiliary import read_trajectories
from horizonrl.cluster.warm_start.demos import DEMOS_FILE, SUMMARY_FILE, collect_demos
from horizonrl.envpool.registry import env_spec
from horizonrl.learner.auxiliary import sft_examples_from_trajectories
from horizonrl.protos.chat import IM_END, IM_START

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]
REPLY = re.compile(r"Thought: I will ([^\n]*)\.\nAction: \1" + re.escape(IM_END))
MAZE = ["env.kwargs.level=BabyAI-GoToObjMaze-v0", "env.kwargs.expert=macro",
        "env.replicas_per_actor=8"]


@pytest.fixture(scope="module")
def demos(tmp_path_factory, tiny_model_path):
    from horizonrl.cluster.ops.runtime import ray_session

    out = tmp_path_factory.mktemp("demos")
    cfg = load_config(None, [*MAZE, "seed=3"])
    with ray_session(cfg.ray):
        summary = collect_demos(cfg, model_path=str(tiny_model_path), episodes=20, out=out,
                                noise=0.3, thought="short", max_turns=40)
    return out, summary


def test_demo_tokens_decode_to_the_turns_and_the_mask_covers_only_expert_tokens(
        demos, tokenizer):
    out, _ = demos
    trajs = read_trajectories(out)
    spec = env_spec("babyai")
    assert len(trajs) == 20 and all(t.info["source"] == "expert" for t in trajs)
    noisy = 0
    for t in trajs:
        assert tokenizer.decode(list(t.prompt_ids)).startswith(
            f"{IM_START}system\n{spec.system_prompt}{IM_END}\n{IM_START}user\nMission: ")
        # In order: every expert turn is a mask-1 run decoding to exactly its reply; the rest
        # is observations, plus injected random turns (kept in context, mask 0).
        replies, kinds = [], []
        for value, s, e in mask_runs(t.response_mask):
            text = tokenizer.decode(list(t.response_ids[s:e]))
            if value == 1:
                assert text.endswith(IM_END)
                replies.append(text[: -len(IM_END)])
                kinds.append("expert")
                continue
            for m in REPLY.finditer(text):
                replies.append(m.group(0)[: -len(IM_END)])
                kinds.append("random")
            rest = REPLY.sub("", text)
            if rest:
                assert rest.startswith(f"\n{IM_START}user\nMission: ") and rest.endswith(
                    f"{IM_END}\n{IM_START}assistant\n"), rest
        assert replies == [expert_reply(spec, a) for a in t.info["actions"]]
        assert len(replies) == t.num_turns
        noisy += kinds.count("random")
    assert noisy > 0, "noise=0.3 over 20 episodes injected no random turn"


def test_expert_solves_the_maze_and_the_summary_says_so(demos):
    out, summary = demos
    written = json.loads((out / SUMMARY_FILE).read_text())
    assert written["episodes"] == 20 and summary.failures == 0
    assert written["success_rate"] >= 0.9, written  # the expert recovers from random turns
    assert 6 <= written["mean_turns"] <= 30
    lines = (out / DEMOS_FILE).read_text().splitlines()
    assert len(lines) == 20


def test_demos_feed_sft_unchanged(demos):
    out, _ = demos
    trajs = read_trajectories(out)
    examples = sft_examples_from_trajectories(trajs, only_successful=True)
    assert len(examples) == sum(bool(t.info["success"]) for t in trajs)
    for ex, t in zip(examples, [t for t in trajs if t.info["success"]]):
        assert sum(ex.loss_mask) == sum(t.response_mask) > 0
        assert ex.input_ids == t.prompt_ids + t.response_ids


def test_demos_cli_eval_split(tmp_path, tiny_model_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "horizonrl.cluster.cli", "demos", "--episodes", "6", "--out",
         str(tmp_path), "--split", "eval", "--thought", "none", "--model",
         str(tiny_model_path), *MAZE],
        cwd=root, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "expert on babyai (eval): success" in proc.stdout
    trajs = read_trajectories(tmp_path)
    assert sorted(t.info["seed"] for t in trajs) == [1_000_000 + i for i in range(6)]
    bad = subprocess.run([sys.executable, "-m", "horizonrl.cluster.cli", "demos", "--episodes", "2",
                          "--out", str(tmp_path / "x"), "--noise", "1.5"], cwd=root,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--noise" in bad.stderr


def test_mixed_run_demos_share_episodes_by_env_weight(tmp_path, tiny_model_path):
    from horizonrl.cluster.ops.runtime import ray_session

    cfg = load_config(None, [
        "env.replicas_per_actor=8", "env.weight=3",
        "extra_envs=[{name: deepsearch, kwargs: {hops: [2]}, replicas_per_actor: 8}]"])
    with ray_session(cfg.ray):
        summary = collect_demos(cfg, model_path=str(tiny_model_path), episodes=12, out=tmp_path,
                                thought="none", max_turns=12)
    written = json.loads((tmp_path / SUMMARY_FILE).read_text())
    assert summary.episodes == 12
    assert {k: v["episodes"] for k, v in written["per_env"].items()} == {"babyai": 9,
                                                                       "deepsearch": 3}
    trajs = read_trajectories(tmp_path)
    assert sorted({t.env_name for t in trajs}) == ["babyai", "deepsearch"]
    assert written["per_env"]["deepsearch"]["success_rate"] >= 2 / 3
