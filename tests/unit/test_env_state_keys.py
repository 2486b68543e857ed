"""Envs' `info["state_key"]` (GiGPO's anchor states) and TextCraft's subgoal shaping.

Real envs, no mocks. A key names the state the agent is in after a step: an invalid action
keeps it, no step counter enters it, and the same state gives the same key in another episode.
"""

from __future__ import annotations

import pytest

from horizonrl.envpool.babyai import BabyAITextEnv
from horizonrl.envpool.deepsearch import DeepSearchEnv
from horizonrl.envpool.miniwob import MiniWoBEnv
from horizonrl.envpool.sciworld import SciWorldEnv
from horizonrl.envpool.textcraft import TextCraftEnv, task_list

GATE = "minecraft:acacia_fence_gate"  # depth 2: sticks and acacia planks, then the gate
GATE_SEED = [t.goal for t in task_list("train", (2,))].index(GATE)  # train seed = list index
# The gate's recipe tree, with the shaping each step earns at subgoal_reward=0.1.
GATE_PLAY = [
    ("get 4 bamboo", 0.0),  # fetched, not crafted
    ("craft 1 stick using 2 bamboo", 0.1),  # first stick: a node of the tree
    ("craft 1 stick using 2 bamboo", 0.0),  # the same node again
    ("get 4 bamboo", 0.0),
    ("craft 1 stick using 2 bamboo", 0.0),
    ("craft 1 stick using 2 bamboo", 0.0),
    ("get 2 acacia logs", 0.0),
    ("craft 4 acacia planks using 1 acacia logs", 0.1),  # acacia planks, also "planks"
    ("craft 1 acacia button using 1 acacia planks", 0.0),  # a distractor: not on the tree
    ("get 1 oak logs", 0.0),
    ("craft 4 oak planks using 1 oak logs", 0.0),  # another kind of planks: node already paid
    ("craft 1 acacia fence gate using 4 stick, 2 acacia planks", 1.0),  # the goal: success only
]


# ------------------------------------------------------------------------------------ BabyAI
def test_babyai_key_is_the_view_without_note_or_step_count():
    env = BabyAITextEnv()
    obs, info = env.reset(seed=0)
    key = info["state_key"]
    assert key == obs and "Invalid action" not in key
    assert BabyAITextEnv().reset(seed=0)[1]["state_key"] == key  # same seed, same key
    bad = env.step("fly to the moon")
    assert bad.info["invalid_action"] and bad.observation.startswith("Invalid action. ")
    assert bad.info["state_key"] == key
    turned = env.step("turn left")
    assert turned.info["state_key"] == turned.observation != key
    for _ in range(3):  # back to the start pose: same view, more primitive steps
        last = env.step("turn left")
    assert last.info["primitive_steps"] == 4 and last.info["state_key"] == key


# --------------------------------------------------------------------------------- TextCraft
def test_textcraft_key_is_the_inventory():
    env = TextCraftEnv(depths=[2])
    _, info = env.reset(seed=GATE_SEED)
    assert info["state_key"] == "inventory: empty"
    got = env.step("get 4 bamboo").info["state_key"]
    assert got == "inventory: bamboo:4"
    for bad in ("get 1 acacia fence gate", "craft 4 acacia planks using 1 acacia logs",
                "xyzzy"):  # not gettable; no logs held; no command
        result = env.step(bad)
        assert result.info["invalid_action"] and result.info["state_key"] == got
    looked = env.step("inventory")  # a valid command that changes nothing
    assert not looked.info["invalid_action"] and looked.info["state_key"] == got


def test_textcraft_same_inventory_same_key_whatever_the_order():
    keys = []
    for gets in (["get 1 oak logs", "get 2 bamboo", "get 1 oak logs"],
                 ["get 2 bamboo", "get 2 oak logs"]):
        env = TextCraftEnv(depths=[2])
        env.reset(seed=GATE_SEED + len(keys))  # another episode, another goal: same key
        for command in gets:
            result = env.step(command)
        keys.append(result.info["state_key"])
    assert keys[0] == keys[1] == "inventory: bamboo:2, oak logs:2"


def test_textcraft_subgoal_reward_pays_each_tree_node_once():
    env = TextCraftEnv(depths=[2], subgoal_reward=0.1)
    for _ in range(2):  # the second episode pays again: nodes are per episode
        env.reset(seed=GATE_SEED)
        assert env.task.goal == GATE
        results = [env.step(command) for command, _ in GATE_PLAY]
        assert [r.reward for r in results] == pytest.approx([want for _, want in GATE_PLAY])
        assert not any(r.info["invalid_action"] for r in results)
        assert [r.info["success"] for r in results] == [False] * (len(GATE_PLAY) - 1) + [True]
        assert results[-1].reward == 1.0 and results[-1].terminated


def test_textcraft_subgoal_payments_stop_at_what_the_solver_earns():
    env = TextCraftEnv(depths=[2], subgoal_reward=0.1)
    env.reset(seed=GATE_SEED)  # the solver's plan pays twice: stick, acacia planks
    play = [
        ("get 2 birch logs", 0.0),
        ("craft 4 birch planks using 1 birch logs", 0.1),  # "planks", for the sticks
        ("craft 4 stick using 2 birch planks", 0.1),
        ("get 1 acacia logs", 0.0),
        ("craft 4 acacia planks using 1 acacia logs", 0.0),  # a new node, but over the cap
        ("craft 1 acacia fence gate using 4 stick, 2 acacia planks", 1.0),
    ]
    rewards = [env.step(command).reward for command, _ in play]
    assert rewards == pytest.approx([want for _, want in play])


def test_textcraft_rewards_unchanged_without_subgoal_reward():
    env = TextCraftEnv(depths=[2])
    env.reset(seed=GATE_SEED)
    rewards = [env.step(command).reward for command, _ in GATE_PLAY]
    assert rewards == [0.0] * (len(GATE_PLAY) - 1) + [1.0]
    with pytest.raises(ValueError, match="subgoal_reward"):
        TextCraftEnv(subgoal_reward=-0.1)


# ------------------------------------------------------------------------------- Deep Search
def test_deepsearch_key_drops_the_turn_counter():
    env = DeepSearchEnv(world_seed=0, hops=(2,))
    _, info = env.reset(seed=0)
    start = info["state_key"]
    assert start == f"Question: {info['question']}"
    bad = env.step("look around")
    assert bad.info["invalid_action"] and bad.info["state_key"] == start
    query = f"search[{info['question']}]"
    first = env.step(query)
    again = env.step(query)  # the same results two turns later
    assert "turns left" in first.observation and first.observation != again.observation
    assert first.info["state_key"] == again.info["state_key"] != start
    assert "turns left" not in first.info["state_key"]


# ------------------------------------------------------------------ SciWorld (JVM), MiniWoB
def test_sciworld_invalid_action_keeps_the_key():
    with SciWorldEnv(tasks=["find-animal"]) as env:
        obs, info = env.reset(seed=0)
        assert info["state_key"] == obs
        assert env.step("xyzzy").info["state_key"] == obs
        looked = env.step("look around")
        assert looked.info["state_key"] == looked.observation != obs
        bad = env.step("xyzzy")
        assert bad.info["invalid_action"] and bad.info["state_key"] == looked.observation


@pytest.mark.timeout(120)
def test_miniwob_invalid_action_keeps_the_key():
    with MiniWoBEnv(tasks=["click-checkboxes"]) as env:
        obs, info = env.reset(seed=0)
        assert info["state_key"] == obs
        bad = env.step("click [9999]")
        assert bad.info["invalid_action"] and bad.info["state_key"] == obs
        assert bad.observation != obs
