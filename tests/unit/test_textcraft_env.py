"""TextCraftEnv: contract, fixed splits, oracle vs random, robustness to bad input."""

from __future__ import annotations

import collections
import hashlib
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from horizonrl.envpool.base import EVAL_SEED_OFFSET, NEW_INSTANCE_OFFSET, StepResult, TextEnv
from horizonrl.envpool.textcraft import (
    DEPTHS,
    SYSTEM_PROMPT,
    TextCraftEnv,
    format_action,
    parse_action,
    random_action,
    task_list,
)

INFO_KEYS = {"invalid_action", "success", "goal", "depth", "steps", "candidate_actions"}
CAP = 40  # turns per episode for both agents; the oracle needs at most 23 on the eval split


def _run(env: TextCraftEnv, seed: int, policy, rng: random.Random) -> dict:
    """One episode of `policy(env, info, rng)` under CAP turns, replies parsed as a model's."""
    _, info = env.reset(seed=seed)
    for _ in range(CAP):
        result = env.step(parse_action(format_action(policy(env, info, rng))))
        info = result.info
        if result.terminated or result.truncated:
            break
    return info


def _rates(policy, depths: tuple[int, ...]) -> tuple[float, dict[int, str]]:
    env = TextCraftEnv(depths=depths)
    rng = random.Random(0)
    wins, counts = collections.Counter(), collections.Counter()
    for i in range(len(task_list("eval", depths))):
        info = _run(env, EVAL_SEED_OFFSET + i, policy, rng)
        wins[info["depth"]] += info["success"]
        counts[info["depth"]] += 1
    per_depth = {d: f"{wins[d]}/{counts[d]}" for d in sorted(counts)}
    return sum(wins.values()) / sum(counts.values()), per_depth


def test_protocol_reset_text_and_info():
    env = TextCraftEnv()
    assert isinstance(env, TextEnv)
    obs, info = env.reset(seed=3)
    assert set(info) >= INFO_KEYS
    assert not info["success"] and not info["invalid_action"] and info["steps"] == 0
    assert info["depth"] in DEPTHS
    head, goal_line = obs.split("\n\n")
    assert head.startswith("Crafting commands:\ncraft ")
    assert goal_line == f"Goal: craft {info['goal']}."
    shown = head.split("\n")[1:]
    assert any(line.startswith("craft ") and f" {info['goal']} using " in line for line in shown)
    assert set(shown) <= set(info["candidate_actions"])
    assert "Thought:" in SYSTEM_PROMPT and "Action:" in SYSTEM_PROMPT


def test_same_seed_same_text_different_seeds_differ():
    env_a, env_b = TextCraftEnv(), TextCraftEnv()
    for seed in (0, 7, EVAL_SEED_OFFSET + 5):
        assert env_a.reset(seed=seed)[0] == env_b.reset(seed=seed)[0]
        for _ in range(4):  # ... and stays identical under the same actions
            action = env_a.oracle_action()
            assert env_a.step(action).observation == env_b.step(action).observation
    assert len({env_a.reset(seed=s)[0] for s in range(20)}) == 20


def test_text_and_splits_are_the_same_in_another_process():
    """The package orders its text by string hashes and its recipes by directory order."""
    code = textwrap.dedent("""
        import hashlib
        from horizonrl.envpool.textcraft import TextCraftEnv, task_list
        env = TextCraftEnv()
        texts = [env.reset(seed=s)[0] for s in (*range(30), *range(1_000_000, 1_000_030))]
        texts += [repr(task_list("train")), repr(task_list("eval"))]
        print(hashlib.sha256("|".join(texts).encode()).hexdigest())
    """)
    digests = set()
    for hash_seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
            env={"PYTHONHASHSEED": hash_seed}, cwd=Path(__file__).parents[2],
        )
        digests.add(out.stdout.strip())
    env = TextCraftEnv()
    texts = [env.reset(seed=s)[0] for s in (*range(30), *range(EVAL_SEED_OFFSET, 1_000_030))]
    texts += [repr(task_list("train")), repr(task_list("eval"))]
    digests.add(hashlib.sha256("|".join(texts).encode()).hexdigest())
    assert len(digests) == 1


def test_splits_disjoint_stable_and_stratified():
    train, held_out = task_list("train"), task_list("eval")
    assert task_list("train") == train and task_list("eval") == held_out
    train_goals, eval_goals = {t.goal for t in train}, {t.goal for t in held_out}
    assert len(train_goals) == len(train) and len(eval_goals) == len(held_out)
    assert not train_goals & eval_goals
    for depth in DEPTHS:
        n_train = sum(t.depth == depth for t in train)
        n_eval = sum(t.depth == depth for t in held_out)
        assert n_train > 0 and n_eval > 0, depth
        assert n_eval <= 0.3 * (n_train + n_eval), depth
    env = TextCraftEnv()
    # The index wraps modulo the split: the same goal, in a new instance (distractors, order).
    wrapped, first = env.reset(seed=len(train)), env.reset(seed=0)
    assert wrapped[1]["goal"] == first[1]["goal"] and wrapped[0] != first[0]
    new = env.reset(seed=NEW_INSTANCE_OFFSET)  # train goals in instances training never draws
    assert new[1]["goal"] == first[1]["goal"] and new[0] != first[0]
    assert new[0].split("\n\n")[1] == first[0].split("\n\n")[1]
    _, info = env.reset(seed=EVAL_SEED_OFFSET + 2)
    assert info["goal"] == held_out[2].goal.removeprefix("minecraft:").replace("_", " ")


def test_depths_and_max_steps():
    env = TextCraftEnv(depths=[3])
    assert {env.reset(seed=s)[1]["depth"] for s in range(30)} == {3}
    for bad in ((), (0,), (5,), (1, 9)):
        with pytest.raises(ValueError):
            TextCraftEnv(depths=bad)
    with pytest.raises(ValueError):
        TextCraftEnv(max_steps=0)
    env = TextCraftEnv(max_steps=3)
    env.reset(seed=1)
    results = [env.step("inventory") for _ in range(3)]
    assert [r.truncated for r in results] == [False, False, True]
    after = env.step("inventory")  # over: no more turns
    assert after.info["invalid_action"] and after.truncated


def test_oracle_reward_termination_and_episode_end():
    env = TextCraftEnv(depths=(3,))
    env.reset(seed=4)
    rewards = []
    for _ in range(CAP):
        result = env.step(env.oracle_action())
        assert isinstance(result, StepResult) and not result.info["invalid_action"]
        rewards.append(result.reward)
        if result.terminated:
            break
    assert result.terminated and not result.truncated and result.info["success"]
    assert rewards[-1] == 1.0 and sum(rewards) == 1.0
    after = env.step(env.oracle_action())
    assert after.observation.startswith("Invalid action") and after.reward == 0.0


def test_oracle_succeeds_and_random_does_not():
    oracle, oracle_depths = _rates(lambda env, info, rng: env.oracle_action(), DEPTHS)
    # Depth-1 goals take one get and one craft from a menu of a few commands, so a random agent
    # often wins them (~0.8); the package itself only uses goals of depth >= 2.
    rand, rand_depths = _rates(lambda env, info, rng: random_action(info, rng), (2, 3, 4))
    print(f"\noracle {oracle:.2f} {oracle_depths}; random (depth 2-4) {rand:.2f} {rand_depths}")
    assert sum(int(v.split("/")[1]) for v in oracle_depths.values()) >= 40
    assert oracle >= 0.9
    assert rand < 0.2


def test_parse_thought_action_replies():
    reply = "Thought: I need logs first.\nAction: get 1 oak logs"
    assert parse_action(reply) == "get 1 oak logs"
    assert parse_action("Thought: x\nAction:  Craft 4 Oak Planks using 1 oak logs.\n") == (
        "craft 4 oak planks using 1 oak logs"
    )
    assert parse_action("action: `inventory`") == "inventory"
    assert parse_action("get 2 stick\nmore text") == "get 2 stick"
    env = TextCraftEnv()
    _, info = env.reset(seed=11)
    for action in [env.oracle_action(), *info["candidate_actions"]]:
        assert parse_action(format_action(action)) == action


def _malformed(rng: random.Random, n: int) -> list[str]:
    near_miss = [
        "get 1 oak logz", "get one oak logs", "gett 1 oak logs", "get 1", "get 0 oak logs",
        "get 1000 oak logs", "get -1 oak logs", "get 1 planks", "get 1 crafting table",
        "craft 1 crafting table", "craft 1 crafting table using 4 planks",
        "craft 4 oak planks using 1 oak logs", "craft using", "inventory please", "inventor",
        "craft 1 stick using 2 oak planks, 2 oak planks", "get 99999999999999 oak logs",
    ]
    out = ["", " ", "\n\t", "x" * 1_000_000, "get 1 oak logs" * 200, *near_miss]
    while len(out) < n:
        kind = rng.randrange(3)
        if kind == 0:
            out.append("".join(chr(rng.randrange(32)) for _ in range(rng.randrange(1, 40))))
        elif kind == 1:
            raw = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 60)))
            out.append(raw.decode("utf-8", errors="replace"))
        else:
            word = rng.choice(near_miss)
            i = rng.randrange(len(word) + 1)
            out.append(word[:i] + rng.choice(["\x00", "\ufffd", "#", ""]) + word[i:] + "!")
    return out[:n]


def test_malformed_actions_are_invalid_and_never_raise():
    env = TextCraftEnv()
    env.reset(seed=2)
    for action in _malformed(random.Random(0), 1_000):
        result = env.step(action)
        assert result.observation.startswith("Invalid action"), repr(action[:80])
        assert result.info["invalid_action"] and result.reward == 0.0
        assert not result.terminated and not result.truncated
        assert isinstance(parse_action(action), str)
    assert env.inventory == {}


def test_envs_do_not_share_state_or_touch_global_random():
    a, b = TextCraftEnv(), TextCraftEnv()
    random.seed(123)
    state = random.getstate()
    a.reset(seed=0)
    b.reset(seed=0)
    a.step(a.oracle_action())
    assert random.getstate() == state
    assert a.inventory and not b.inventory
    first = a.reset(seed=0)[0]
    for _ in range(20):  # the package's own reset grows the recipe lists it walks
        b.reset(seed=0)
    assert a.reset(seed=0)[0] == first


def test_invalid_penalty_is_the_reward_of_a_rejected_command_only():
    env = TextCraftEnv(depths=[1], invalid_penalty=0.25)
    env.reset(seed=5)
    assert env.step("craft 1 nothing using 2 air").reward == -0.25
    rewards = []
    for _ in range(10):  # the solver finishes a depth-1 goal in a few valid commands
        result = env.step(env.oracle_action())
        rewards.append(result.reward)
        if result.terminated:
            break
    assert result.terminated and rewards[-1] == 1.0 and set(rewards[:-1]) <= {0.0}
    with pytest.raises(ValueError, match="invalid_penalty"):
        TextCraftEnv(invalid_penalty=-1)
