"""BabyAITextEnv: determinism, high-level actions, oracle vs random, robustness to bad input."""

from __future__ import annotations

import random

import pytest

from horizonrl.envpool.babyai import (
    SYSTEM_PROMPT,
    BabyAITextEnv,
    oracle_action,
    parse_action,
    random_valid_action,
)
from horizonrl.envpool.base import EVAL_SEED_OFFSET, MAX_ACTION_CHARS, StepResult, TextEnv

EVAL_SEEDS = range(10_000, 10_030)  # 30 seeds, away from the small ones other tests scan
INFO_KEYS = {"invalid_action", "success", "available_actions", "primitive_steps", "mission"}


def _seed_with_action(env: BabyAITextEnv, action: str, limit: int = 200) -> int:
    """The first seed whose opening observation lists `action`."""
    for seed in range(limit):
        _, info = env.reset(seed=seed)
        if action in info["available_actions"]:
            return seed
    raise AssertionError(f"no seed below {limit} offers {action!r}")


def _success_rate(level: str, policy, *, max_turns: int | None) -> float:
    env = BabyAITextEnv(level=level)
    rng = random.Random(0)
    wins = 0
    for seed in EVAL_SEEDS:
        _, info = env.reset(seed=seed)
        turn = 0
        while max_turns is None or turn < max_turns:
            result = env.step(policy(env, info, rng))
            info, turn = result.info, turn + 1
            if result.terminated or result.truncated:
                break
        wins += info["success"]
    env.close()
    return wins / len(EVAL_SEEDS)


def test_protocol_and_reset_info():
    env = BabyAITextEnv()
    assert isinstance(env, TextEnv)
    assert env.env_name == "babyai"
    obs, info = env.reset(seed=3)
    assert set(info) >= INFO_KEYS
    assert info["primitive_steps"] == 0 and not info["success"] and not info["invalid_action"]
    lines = obs.split("\n")
    assert lines[0] == f"Mission: {info['mission']}"
    assert lines[1].startswith("You see: ")
    assert lines[-1] == "Actions: " + ", ".join(info["available_actions"])
    assert info["available_actions"][:3] == ["turn left", "turn right", "move forward"]
    assert "exactly one action" in SYSTEM_PROMPT


def test_same_seed_same_text_different_seeds_differ():
    env_a, env_b = BabyAITextEnv(), BabyAITextEnv()
    for seed in (0, 7, 123):
        assert env_a.reset(seed=seed)[0] == env_b.reset(seed=seed)[0]
        # ... and stays identical under the same actions.
        for action in ("turn left", "move forward", "turn right"):
            assert env_a.step(action).observation == env_b.step(action).observation
    texts = {env_a.reset(seed=seed)[0] for seed in range(10)}
    assert len(texts) > 5


def test_go_to_visible_red_ball_succeeds():
    env = BabyAITextEnv()
    _seed_with_action(env, "go to red ball 1")
    result = env.step("go to red ball 1")
    assert isinstance(result, StepResult)
    assert result.terminated and not result.truncated
    assert result.reward == 1.0
    assert result.info["success"] and not result.info["invalid_action"]
    assert result.info["primitive_steps"] >= 1


def test_scaled_reward_is_minigrid_reward():
    env = BabyAITextEnv(reward="scaled")
    _seed_with_action(env, "go to red ball 1")
    result = env.step("go to red ball 1")
    steps = result.info["primitive_steps"]
    assert result.info["success"]
    assert result.reward == pytest.approx(1 - 0.9 * steps / env.unwrapped_env.max_steps)


def test_pick_up_then_carry_and_drop():
    env = BabyAITextEnv(level="BabyAI-PickupLoc-v0")
    seed = next(
        s
        for s in range(200)
        if any(a.startswith("pick up") for a in env.reset(seed=s)[1]["available_actions"])
    )
    _, info = env.reset(seed=seed)
    action = next(a for a in info["available_actions"] if a.startswith("pick up"))
    result = env.step(action)
    if result.terminated:  # it was the mission's object
        assert result.info["success"]
        return
    carried = action.removeprefix("pick up ")
    assert f"You carry: {carried}" in result.observation
    assert "drop" in result.info["available_actions"]
    assert not any(a.startswith("pick up") for a in result.info["available_actions"])


def test_go_to_when_already_facing_costs_one_noop_step():
    env = BabyAITextEnv()
    _, info = env.reset(seed=0)
    action = next(a for a in info["available_actions"] if a.startswith("go to grey"))
    first = env.step(action)
    assert not first.terminated and not first.info["invalid_action"]
    again = env.step(action)  # already facing it: minigrid's no-op `done`, nothing moves
    assert not again.info["invalid_action"]
    assert again.info["primitive_steps"] == first.info["primitive_steps"] + 1
    assert again.observation == first.observation


def test_toggle_and_go_through_door():
    env = BabyAITextEnv(level="BabyAI-GoTo-v0")
    for seed in range(100):
        _, info = env.reset(seed=seed)
        doors = [a for a in info["available_actions"] if a.startswith("toggle and go through")]
        if doors:
            break
    label = doors[0].removeprefix("toggle and go through ")
    grid = env.unwrapped_env.grid
    index, door = next((i, o) for i, o in enumerate(grid.grid) if o and env._label(o) == label)
    result = env.step(doors[0])
    assert not result.info["invalid_action"] and door.is_open
    # Through and out the other side: off the door cell, the door behind it and out of view.
    x, y = env.unwrapped_env.agent_pos
    assert y * grid.width + x != index
    assert f"{label}:" not in result.observation


def test_observation_never_says_zero_steps():
    env = BabyAITextEnv(level="BabyAI-GoToLocal-v0")
    rng = random.Random(1)
    for seed in range(20):
        obs, info = env.reset(seed=seed)
        for _ in range(5):
            assert "0 steps" not in obs and "0 step " not in obs
            result = env.step(random_valid_action(info, rng))
            obs, info = result.observation, result.info
            if result.terminated or result.truncated:
                break


def test_max_primitive_steps_truncates():
    env = BabyAITextEnv(max_primitive_steps=3)
    env.reset(seed=0)
    results = [env.step("turn left") for _ in range(3)]
    assert [r.truncated for r in results] == [False, False, True]
    assert not results[-1].terminated and results[-1].info["primitive_steps"] == 3
    after = env.step("turn left")  # stepping a finished episode is refused, not a crash
    assert after.info["invalid_action"] and after.truncated


def test_oracle_beats_random():
    for level in ("BabyAI-GoToRedBall-v0", "BabyAI-PickupLoc-v0"):
        oracle = _success_rate(level, lambda env, info, rng: oracle_action(env), max_turns=None)
        rand = _success_rate(
            level, lambda env, info, rng: random_valid_action(info, rng), max_turns=5
        )
        print(f"{level}: oracle {oracle:.2f}, random valid (5 turns) {rand:.2f}")
        assert oracle >= 0.9
        assert rand < oracle - 0.3


def test_macro_expert_solves_the_maze_with_listed_high_level_actions():
    """The planner acts only through actions the observation lists, and needs many turns."""
    env = BabyAITextEnv(level="BabyAI-GoToObjMaze-v0", expert="macro")
    solved, turns, macros = 0, [], 0
    for seed in range(EVAL_SEED_OFFSET, EVAL_SEED_OFFSET + 40):
        _, info = env.reset(seed=seed)
        n = 0
        while n < 40:
            n += 1
            action = env.oracle_action()
            assert action in info["available_actions"]
            macros += action.startswith(("go to", "toggle and go through", "go through"))
            result = env.step(action)
            assert not result.info["invalid_action"]
            info = result.info
            if result.terminated or result.truncated:
                break
        solved += result.info["success"]
        turns.append(n)
    mean_turns = sum(turns) / len(turns)
    print(f"macro expert on GoToObjMaze: {solved}/40 solved, mean turns {mean_turns:.1f}")
    assert solved >= 38 and mean_turns >= 6 and macros >= 40
    with pytest.raises(ValueError, match="expert"):
        BabyAITextEnv(expert="psychic")


def test_malformed_actions_are_invalid_and_harmless():
    env = BabyAITextEnv()
    obs, _ = env.reset(seed=5)
    rng = random.Random(0)
    fixed = [
        "",
        " ",
        "\n\n",
        "x" * 1_000_000,
        "go to",
        "go to purple ball 99",
        "\x00\x07\x1b[2J",
        "turn   left please",
        "pick up",
        "🙂 turn left",
        "action:",
        ".",
    ]
    for i in range(1000):
        if i < len(fixed):
            action = fixed[i]
        else:
            raw = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
            action = raw.decode("utf-8", errors="replace")
        result = env.step(action)
        assert result.info["invalid_action"], action[:80]
        assert result.observation == "Invalid action. " + obs
        assert result.reward == 0.0 and not result.terminated and not result.truncated
        assert result.info["primitive_steps"] == 0
    result = env.step("turn left")
    assert not result.info["invalid_action"] and result.info["primitive_steps"] == 1


def test_step_normalises_the_action():
    env = BabyAITextEnv()
    env.reset(seed=5)
    for action in ("  Turn   LEFT. ", "Action: turn left", "ACTION:turn left."):
        result = env.step(action)
        assert not result.info["invalid_action"], action


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("go to red ball 1", "go to red ball 1"),
        ("  Action: Go To  Red Ball 1.\nsome reasoning", "go to red ball 1"),
        ("\n\n  turn left\nturn right", "turn left"),
        ("action:move forward", "move forward"),
        ("", ""),
        ("\n \n", ""),
        ("Thought: the ball is ahead.\nAction: move forward", "move forward"),
        ("Thought: left. Action: turn left. Action: go to red ball 1\n", "go to red ball 1"),
        ("x" * 1_000_000, "x" * MAX_ACTION_CHARS),
    ],
)
def test_parse_action(text, expected):
    assert parse_action(text) == expected


def test_parse_action_never_raises():
    rng = random.Random(0)
    for _ in range(200):
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 64)))
        assert isinstance(parse_action(raw.decode("utf-8", errors="replace")), str)
    assert parse_action(None) == ""  # type: ignore[arg-type]
