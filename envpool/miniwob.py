"""MiniWoB++ (Liu et al., 2018) web tasks in a headless Chromium, as a horizonrl text environment.

Each env owns one browser: the system `chromium` driven by the system `chromedriver` through
selenium, the task pages from the `miniwob` package loaded from disk (no network). Each turn the
agent reads the task's utterance and a compact text rendering of the page (one line per visible
element that shows text or takes input) and answers with one action:

    click [ref]           click the element (buttons, links, checkboxes, tabs, tree items, ...)
    type [ref] [text]     replace the text of an input field with `text`
    press [key]           press a key in the focused element: enter, tab, backspace, delete,
                          escape, space, up, down, left, right

The brackets around `ref` and `key` may be left out; the ones around `text` too, unless the text
starts or ends with a bracket (the text is then ambiguous and the action is invalid). Anything
else is an invalid action: the turn is used up and nothing happens on the page.

    env = MiniWoBEnv(tasks=["click-button", "login-user"])
    obs, info = env.reset(seed=0)      # 'Task: Click on the "Yes" button.\\n[4] input_text ...'
    result = env.step(parse_action(model_text))

Seeds: task = tasks[index % len(tasks)] (index within the seed's split, base.task_split), and
the page's random generator is seeded from the seed itself, so train, eval and train-new seeds
draw different instances of the same tasks. The reward is MiniWoB's own raw reward when the task
ends (1 on success, -1 on a wrong answer, partial credit on a few tasks), 0 before; success is a
raw reward > 0. MiniWoB's time-scaled reward is not used: it measures the wall clock, which here
is mostly the model thinking, not the agent's skill. `reward="success"` scores a wrong answer 0,
as running out of turns is (the raw reward where it is positive): with the raw reward a policy
gains by never answering (0) rather than answering wrongly (-1), and RL taught it exactly that
(docs/credit.md, MiniWoB). `invalid_penalty` (shaping, off by default) rewards each invalid action
-invalid_penalty on its own turn, where a turn-level estimator can place it.

The in-page timer: every MiniWoB page ends its episode after `core.EPISODE_MAX_TIME` of wall
clock (10 s by default) with reward -1. With a model reading and writing between turns on a busy
CPU that timer, not the agent, would decide most episodes, so by default it is set to a day and
the turn budget (the agent loop's max turns, or `max_steps`) bounds the episode;
`episode_time_s` restores a real limit.
"""

from __future__ import annotations

import os
import random
import re
from typing import Any, Self

from horizonrl.envpool.base import (
    MAX_ACTION_CHARS,
    StepResult,
    parse_agentgym_action,
    shaping_weight,
    task_split,
)
from horizonrl.envpool.miniwob_browser import Browser
from horizonrl.envpool.miniwob_tasks import ORACLES, TASKS, TEXT_INPUTS, OraclePage, page_elements

# selenium's driver manager looks for drivers online unless told not to; we name ours.
os.environ.setdefault("SE_OFFLINE", "true")
os.environ.setdefault("SE_AVOID_STATS", "true")

# Kwargs that never change an observation (the reward mode and the penalty change rewards only):
# the tiny model's cache key leaves them out (EnvSpec.reward_kwargs).
REWARD_KWARGS = frozenset(("reward", "invalid_penalty"))

SYSTEM_PROMPT = (
    "You are a web agent. Each message gives a task and the page: one line per element, "
    "[ref] tag \"text\" and its state. Actions:\n"
    "- click [ref]: click an element\n"
    "- type [ref] [text]: replace the text of an input field\n"
    "- press [key]: press enter, tab, backspace, delete, escape, space, up, down, left or right\n"
    "Each turn, answer with one line: Action: followed by exactly one action."
)
KEYS = {"enter": "\ue007", "tab": "\ue004", "backspace": "\ue003", "delete": "\ue017",
        "escape": "\ue00c", "space": " ", "up": "\ue013", "down": "\ue015", "left": "\ue012",
        "right": "\ue014"}  # names -> WebDriver key codes (selenium Keys)  # fmt: skip
_MAX_TEXT_CHARS = 200  # no task asks for more; longer `type` text is invalid
_DAY_S = 86_400.0  # "no limit" for the page timer (JS setTimeout caps delays at ~24.8 days)
_CLICK_RE = re.compile(r"click\s*\[?\s*(-?\d+)\s*\]?", re.IGNORECASE)
# The ref in brackets, or bare and followed by a space: "type 5Keli" is no action.
_TYPE_RE = re.compile(r"type\s*(?:\[\s*(-?\d+)\s*\]|(-?\d+)(?=\s|$))\s*(.*)", re.IGNORECASE)
_PRESS_RE = re.compile(r"press\s*\[?\s*([a-z]+)\s*\]?", re.IGNORECASE)
_RANDOM_KEYS = ("press [enter]", "press [tab]")  # what a random agent presses besides clicks


def format_action(action: str) -> str:
    """How a well-formed reply carries `action` (AgentGym's "Action: <action>" style)."""
    return f"Action: {action}"


def parse_action(text: str) -> str:
    """The action in a model's reply ("Thought: ... Action: X" or a bare first line). Case is
    kept: typed text is typed as written. Never raises."""
    return parse_agentgym_action(text).strip()


def parse_command(action: str) -> tuple[str, Any, Any] | str:
    """("click", ref, None), ("type", ref, text) or ("press", key_name, None); for anything
    else the reason it is invalid (a str)."""
    if not isinstance(action, str) or len(action) > MAX_ACTION_CHARS:
        return "Answer with one short action."
    action = action.strip()
    if m := _CLICK_RE.fullmatch(action):
        return ("click", int(m[1]), None)
    if m := _PRESS_RE.fullmatch(action):
        key = m[1].lower()
        if key not in KEYS:
            return f"Unknown key {key!r}; keys: {', '.join(KEYS)}."
        return ("press", key, None)
    if m := _TYPE_RE.fullmatch(action):
        text = m[3].strip()
        if text.startswith("[") or text.endswith("]"):  # then exactly one pair around it
            if not (len(text) >= 2 and text[0] == "[" and text[-1] == "]"
                    and "[" not in text[1:-1] and "]" not in text[1:-1]):
                return "Ambiguous text: write type [ref] [text], no brackets inside the text."
            text = text[1:-1]
        if len(text) > _MAX_TEXT_CHARS or not text.isprintable():
            return f"The text must be printable and at most {_MAX_TEXT_CHARS} characters."
        return ("type", int(m[1] or m[2]), text)
    return "Use click [ref], type [ref] [text] or press [key]."


def task_for_seed(seed: int | None, tasks: tuple[str, ...] | list[str] = TASKS) -> str:
    """The MiniWoB task a task seed plays: tasks[index % len(tasks)], index within its split."""
    return tasks[task_split(seed)[1] % len(tasks)]


class MiniWoBEnv:
    """MiniWoB++ tasks (see envpool/miniwob_tasks.py for the set) as a `TextEnv`.

    One headless Chromium per env, rebuilt every `recycle_every` episodes (0: never) and
    whenever it died (the next `reset` starts a new one). A call that finds the browser dead
    raises; with a hung page a call blocks until the pool's call timeout kills the worker
    process, and a watchdog then kills the browser (see miniwob_browser.py).
    """

    env_name = "miniwob"

    def __init__(
        self,
        *,
        tasks: list[str] | tuple[str, ...] | None = None,
        recycle_every: int = 50,
        episode_time_s: float | None = None,
        max_steps: int | None = None,
        chromium: str = "/usr/bin/chromium",
        chromedriver: str = "/usr/bin/chromedriver",
        call_timeout_s: float = 30.0,
        allow_script: bool = False,
        reward: str = "raw",
        invalid_penalty: float = 0.0,
    ) -> None:
        self.tasks = tuple(tasks) if tasks is not None else TASKS
        if not self.tasks or any(t not in ORACLES for t in self.tasks):
            raise ValueError(f"tasks must be a non-empty list of {list(TASKS)}; "
                             f"got {list(self.tasks)}")
        if reward not in ("raw", "success"):
            raise ValueError(f"reward must be 'raw' or 'success', got {reward!r}")
        self.reward_mode = reward
        self.invalid_penalty = shaping_weight("invalid_penalty", invalid_penalty)
        if recycle_every < 0:
            raise ValueError(f"recycle_every must be >= 0 (0: never), got {recycle_every}")
        if episode_time_s is not None and not 1 <= episode_time_s <= _DAY_S:
            raise ValueError(f"episode_time_s must be in [1, {_DAY_S:.0f}] or None, "
                             f"got {episode_time_s}")
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.recycle_every = recycle_every
        self.episode_time_s = episode_time_s
        self.max_steps = max_steps
        # `script [js]` actions run JavaScript in the page: only for tests and drills (a hung
        # page on demand), never for an agent.
        self.allow_script = allow_script
        self._browser_args = (chromium, chromedriver, call_timeout_s)
        self._browser = Browser(*self._browser_args)
        self.episodes = 0  # since the browser was (re)started
        self.restarts = 0  # browsers replaced after dying
        self._task: str | None = None
        self._fields: dict[str, str] = {}
        self._utterance = ""
        self._elements: dict[int, Any] = {}
        self._history: list[str] = []
        self._obs = ""
        self._steps = 0
        self._done = self._truncated = self._success = False
        self._raw = 0.0

    # ----------------------------------------------------------------------------- gym API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Load the seed's task and instance; the same seed gives the same page and text."""
        if options:
            raise ValueError(f"MiniWoBEnv.reset takes no options, got {sorted(options)}")
        alive = self._browser.alive()
        if not alive or (self.recycle_every and self.episodes >= self.recycle_every):
            self.restarts += not alive
            self._browser.close()
            self._browser = Browser(*self._browser_args)
            self.episodes = 0
        self._task = task_for_seed(seed, self.tasks)
        limit_ms = int(1000 * (self.episode_time_s or _DAY_S))
        self._browser.start_task(self._task, seed=f"horizonrl-{0 if seed is None else seed}",
                                 limit_ms=limit_ms)
        self.episodes += 1
        self._utterance, self._fields = self._browser.utterance(self._task)
        self._history, self._steps, self._raw = [], 0, 0.0
        self._done = self._truncated = self._success = False
        self._obs = self._render()
        return self._obs, self._info(invalid=False)

    def step(self, action: str) -> StepResult:
        """Run one action in the page. Raises only when the browser is gone or broken."""
        if self._task is None:
            raise RuntimeError("call reset() before step()")
        if self._done or self._truncated:
            return self._invalid("The episode has ended.")
        self._steps += 1
        command = parse_command(action)
        if (isinstance(command, str) and self.allow_script and isinstance(action, str)
                and action.startswith("script ")):
            self._browser.script(action[len("script "):])
            command = ("script", None, None)
        if isinstance(command, str):
            return self._invalid(command)
        verb, target, text = command
        if verb in ("click", "type") and target not in self._elements:
            return self._invalid(f"There is no element [{target}] on the page.")
        if verb == "type" and self._elements[target].tag not in TEXT_INPUTS:
            return self._invalid(f"[{target}] is a {self._elements[target].tag}, not a text field.")
        if not self._browser.done():  # the page timer may have ended the episode meanwhile
            if verb == "click":
                self._browser.click(target)
            elif verb == "type":
                self._browser.type(target, text)
            elif verb == "press":
                self._browser.press(KEYS[target])
        self._history.append(action.strip())
        done, raw = self._browser.result()
        if done:
            self._done, self._raw, self._success = True, raw, raw > 0
            self._obs = f"The task is over: {'success' if raw > 0 else 'failure'} (reward {raw:g})."
        else:
            self._obs = self._render()
        reward = (max(raw, 0.0) if self.reward_mode == "success" else raw) if done else 0.0
        return self._result(self._obs, reward, invalid=False)

    def oracle_action(self) -> str:
        """The scripted expert's next action for this page (miniwob_tasks.ORACLES)."""
        if self._task is None:
            raise RuntimeError("call reset() before oracle_action()")
        if self._done or self._truncated:
            return "press [enter]"
        page = OraclePage(self._browser.script, self._history)
        return ORACLES[self._task](self._fields, list(self._elements.values()), page)

    def process_ids(self) -> list[int]:
        """The chromedriver's and the browser's pids while they run; [] after close()."""
        return self._browser.process_ids()

    def close(self) -> None:
        """Stop the browser and its driver (no process left behind). Safe to call twice."""
        self._browser.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------- internals
    def _render(self) -> str:
        elements = page_elements(self._browser.dom())
        self._elements = {e.ref: e for e in elements}
        return "\n".join([f"Task: {self._utterance}", *(e.line() for e in elements)])

    def _invalid(self, why: str) -> StepResult:
        return self._result(f"Invalid action. {why}\n\n{self._obs}", -self.invalid_penalty,
                            invalid=True)

    def _result(self, observation: str, reward: float, *, invalid: bool) -> StepResult:
        if self.max_steps is not None and self._steps >= self.max_steps and not self._done:
            self._truncated = True
        return StepResult(observation, reward, self._done, self._truncated,
                          self._info(invalid=invalid))

    def _info(self, *, invalid: bool) -> dict[str, Any]:
        """The step's info. `state_key` (GiGPO's anchor state, actors/rollout.state_key) is the
        page text without the invalid-action note: an invalid action does nothing on the page,
        so it keeps the key."""
        return {"state_key": self._obs, "invalid_action": invalid, "success": self._success,
                "raw_reward": self._raw, "task": self._task, "fields": dict(self._fields),
                "steps": self._steps, "available_actions": self._available_actions()}

    def _available_actions(self) -> list[str]:
        """Clicks on every element on its line, and typing each of the task's field values
        into each text field: with them a random agent can act from `info` alone."""
        if self._done or self._truncated:
            return []
        actions = [f"click [{ref}]" for ref in self._elements]
        values = list(dict.fromkeys(self._fields.values()))
        for e in self._elements.values():
            if e.tag in TEXT_INPUTS:
                actions += [f"type [{e.ref}] [{v}]" for v in values]
        return actions


def random_action(info: dict[str, Any], rng: random.Random) -> str:
    """A uniformly random action from `info["available_actions"]` and two key presses."""
    return rng.choice([*(info.get("available_actions") or []), *_RANDOM_KEYS])
