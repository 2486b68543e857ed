"""MiniWoBEnv: action syntax, page rendering, seeds, invalid actions, oracles, random play, the
page timer and the browser's lifecycle (recycling, a killed browser, nothing left after close).

Real headless Chromium, no Ray. The suite shares one browser (module fixture); the lifecycle
tests start their own short-lived ones.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import psutil
import pytest
from selenium.common.exceptions import WebDriverException

from horizonrl.envpool.base import EVAL_SEED_OFFSET, MAX_ACTION_CHARS, TextEnv
from horizonrl.envpool.miniwob import (
    SYSTEM_PROMPT,
    MiniWoBEnv,
    format_action,
    parse_action,
    parse_command,
    random_action,
)
from horizonrl.envpool.miniwob_tasks import TASKS, page_elements
from horizonrl.envpool.registry import env_spec

pytestmark = pytest.mark.timeout(180)

ORACLE_SEEDS = 3  # eval instances per task here; the pool tests run more


@pytest.fixture(scope="module")
def env():
    with MiniWoBEnv() as env:
        yield env


def _gone(pids: list[int]) -> bool:
    """No process of `pids` runs any more (zombies awaiting their reaper count as gone)."""
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


def _play(env: MiniWoBEnv, seed: int, choose, max_turns: int) -> tuple[bool, int]:
    _, info = env.reset(seed=seed)
    turn = 0
    while turn < max_turns:
        turn += 1
        result = env.step(parse_action(format_action(choose(info))))
        info = result.info
        if result.terminated or result.truncated:
            break
    return bool(info["success"]), turn


@pytest.mark.parametrize("text, want", [
    ("click [12]", ("click", 12, None)),
    ("Click 12", ("click", 12, None)),
    ("click [ 7 ]", ("click", 7, None)),
    ("type [5] [Keli]", ("type", 5, "Keli")),
    ("type [5] Hello World.", ("type", 5, "Hello World.")),
    ("type 5 abc", ("type", 5, "abc")),
    ("type [5] []", ("type", 5, "")),
    ("type [5] a[1]b", ("type", 5, "a[1]b")),
    ("press [enter]", ("press", "enter", None)),
    ("press Tab", ("press", "tab", None)),
])
def test_parse_command_accepts_the_documented_forms(text, want):
    assert parse_command(text) == want


@pytest.mark.parametrize("text", [
    "", "click", "click [x]", "click [3] now", "type", "type 5Keli", "type [5] [a] [b]",
    "type [5] [abc", "type [5] abc]", "press [f13]", "scroll down", "go back",
    "type [5] " + "x" * 300, "type [5] \x07", "x" * (MAX_ACTION_CHARS + 1),
])
def test_parse_command_rejects_the_rest_with_a_reason(text):
    assert isinstance(parse_command(text), str)


def test_parse_action_takes_the_action_line_and_keeps_case():
    assert parse_action("Thought: the Yes button.\nAction: type [4] [Keli Ma]") == \
        "type [4] [Keli Ma]"
    assert parse_action(format_action("click [3]")) == "click [3]"
    assert "click [ref]" in SYSTEM_PROMPT and "type [ref] [text]" in SYSTEM_PROMPT


def test_page_elements_keep_what_an_agent_reads_or_acts_on():
    t = lambda text: {"tag": "t", "ref": -1, "text": text, "children": []}  # noqa: E731
    dom = {"tag": "BODY", "ref": 1, "focused": True, "children": [
        {"tag": "DIV", "ref": 2, "id": "wrap", "children": [
            {"tag": "DIV", "ref": 3, "text": "", "children": []},  # an empty layout box
            {"tag": "LABEL", "ref": 4, "children": [
                {"tag": "INPUT_checkbox", "ref": 5, "value": True, "children": []},
                t("apples")]},
            {"tag": "INPUT_text", "ref": 6, "value": "hi", "focused": True, "children": []},
            {"tag": "BUTTON", "ref": 7, "text": "Submit", "children": []},
        ]}]}
    lines = [e.line() for e in page_elements(dom)]
    assert lines == ['[4] label "apples"', "  [5] input_checkbox (checked)",
                     '[6] input_text value="hi" (focused)', '[7] button "Submit"']


def test_env_meets_the_contract_and_seeds_pick_task_and_instance(env):
    assert isinstance(env, TextEnv)
    spec = env_spec("miniwob")
    assert spec.factory is MiniWoBEnv and spec.random_action is random_action
    obs, info = env.reset(seed=1)
    assert info["task"] == TASKS[1] and obs.startswith("Task: ")
    assert {"invalid_action", "success", "available_actions", "task", "fields"} <= set(info)
    assert all(line.lstrip().startswith("[") for line in obs.splitlines()[1:])
    again, _ = env.reset(seed=1)
    assert again == obs  # same seed, same page
    other, other_info = env.reset(seed=EVAL_SEED_OFFSET + 1)
    assert other_info["task"] == TASKS[1] and other != obs  # eval: same task, a new instance
    assert env.reset(seed=len(TASKS) + 1)[1]["task"] == TASKS[1]


def test_invalid_actions_use_the_turn_and_change_nothing(env):
    obs, _ = env.reset(seed=EVAL_SEED_OFFSET + TASKS.index("enter-text"))
    button = next(line.split()[0] for line in obs.splitlines() if ' button "Submit"' in line)
    for action in ["dance", "click [999]", "type [999] [x]", "press [f13]", "type [5] [a] [b]",
                   "\ud800", "x" * 100_000, f"type {button} [x]"]:
        result = env.step(action)
        assert result.info["invalid_action"], action
        assert result.observation.startswith("Invalid action") and obs in result.observation
        assert result.reward == 0.0 and not result.terminated
    assert result.info["steps"] == 8
    assert not env.step(env.oracle_action()).info["invalid_action"]


@pytest.mark.parametrize("task", TASKS)
def test_oracle_solves_its_task_on_eval_seeds(env, task):
    seeds = [EVAL_SEED_OFFSET + TASKS.index(task) + k * len(TASKS) for k in range(ORACLE_SEEDS)]
    for seed in seeds:
        won, turns = _play(env, seed, lambda info: env.oracle_action(), max_turns=10)
        assert won, (task, seed, turns)


def test_a_random_agent_mostly_fails(env):
    rng, wins, episodes = random.Random(0), 0, 2 * len(TASKS)
    for seed in range(EVAL_SEED_OFFSET, EVAL_SEED_OFFSET + episodes):
        wins += _play(env, seed, lambda info: random_action(info, rng), max_turns=5)[0]
    print(f"random agent, 5 turns: {wins}/{episodes}")
    assert wins / episodes <= 0.5


def test_episode_end_and_truncation(env):
    env.max_steps = 2
    try:
        env.reset(seed=EVAL_SEED_OFFSET + TASKS.index("login-user"))
        env.step("press [tab]")
        result = env.step("press [tab]")
        assert result.truncated and not result.terminated
        assert env.step("press [tab]").info["invalid_action"]
    finally:
        env.max_steps = None
    env.reset(seed=TASKS.index("click-test-2"))
    result = env.step(env.oracle_action())
    assert result.terminated and result.reward == 1.0 and result.info["success"]
    assert result.info["available_actions"] == []
    after = env.step("click [4]")
    assert after.info["invalid_action"] and after.terminated


def test_the_page_timer_is_off_by_default_and_an_option():
    with MiniWoBEnv(tasks=["click-test-2"], episode_time_s=1.0) as env:
        env.reset(seed=0)
        time.sleep(1.3)
        result = env.step(env.oracle_action())
        assert result.terminated and result.reward == -1.0 and not result.info["success"]
        env.episode_time_s = None
        env.reset(seed=0)
        time.sleep(1.3)
        assert env.step(env.oracle_action()).info["success"]


def test_the_success_reward_scores_a_wrong_answer_as_no_answer():
    """reward="success": a wrong answer (raw -1) scores 0, as running out of turns does, and
    success keeps its reward; the raw reward stays in info."""
    with MiniWoBEnv(tasks=["click-test-2"], episode_time_s=1.0, reward="success") as env:
        env.reset(seed=0)
        time.sleep(1.3)  # the page timer ends the episode: raw -1
        result = env.step(env.oracle_action())
        assert result.terminated and result.reward == 0.0 and result.info["raw_reward"] == -1.0
        env.episode_time_s = None
        env.reset(seed=0)
        result = env.step(env.oracle_action())
        assert result.reward == 1.0 and result.info["success"]
    with pytest.raises(ValueError, match="reward must be"):
        MiniWoBEnv(reward="binary")


def test_the_invalid_penalty_lands_on_the_invalid_turn_only():
    """invalid_penalty: each invalid action's own turn is rewarded -penalty; valid turns and the
    final reward are unchanged."""
    with MiniWoBEnv(tasks=["click-test-2"], reward="success", invalid_penalty=0.05) as env:
        env.reset(seed=0)
        result = env.step("dance")
        assert result.info["invalid_action"] and result.reward == -0.05
        result = env.step(env.oracle_action())
        assert result.terminated and result.reward == 1.0 and result.info["success"]
    with pytest.raises(ValueError, match="invalid_penalty must be >= 0"):
        MiniWoBEnv(invalid_penalty=-0.1)


def test_lifecycle_recycling_a_killed_browser_and_close():
    with MiniWoBEnv(tasks=["click-button"], recycle_every=2) as env:
        first = env.process_ids()
        assert len(first) >= 3  # chromedriver, chromium and its helpers
        env.reset(seed=0)
        env.reset(seed=1)
        env.reset(seed=2)  # the third episode gets a new browser
        second = env.process_ids()
        assert _gone(first) and set(second).isdisjoint(first)
        # A browser killed mid-episode: the next step raises, the next reset starts a new one.
        browser = psutil.Process(second[0]).children()[0]
        os.kill(browser.pid, signal.SIGKILL)
        with pytest.raises(WebDriverException):
            env.step("click [4]")
        obs, _ = env.reset(seed=0)
        assert obs.startswith("Task: ") and env.restarts == 1
        assert env.step(env.oracle_action()).info["success"]
        third = env.process_ids()
        profile = Path(env._browser._profile)
        assert profile.is_dir()
    assert env.process_ids() == []
    deadline = time.monotonic() + 5
    while not _gone(second + third) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(second + third) and not profile.exists()
