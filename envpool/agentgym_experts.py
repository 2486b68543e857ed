"""Scripted experts for AgentGym's own servers, acting from what the server shows (the same text
the model sees), for tests, benchmarks and demonstrations against those servers.

- TextCraft: reads the "Crafting commands" lines of the first observation and plans the gets
  and crafts the goal needs (`TextCraftPlanner`).
- BabyAI: reads the goal and the "Available actions" list each turn: go to / pick up the
  goal's object when it is listed, else turn to look for it (`babyai_action`). It solves the
  one-room GoTo and PickUp levels, not mazes, doors or keys.
- SciWorld: the game's own gold path for the server's task index (`sciworld_gold_path`), from
  the `scienceworld` package, enumerated as the server does (its `games` list).
"""

from __future__ import annotations

import math
import re
from collections import Counter

_CRAFT = re.compile(r"^craft (\d+) (.+?) using (.+)$")
_INGREDIENT = re.compile(r"^(\d+) (.+)$")
_GOAL = re.compile(r"Goal: craft (.+?)\.\s*$", re.MULTILINE)


class TextCraftPlanner:
    """The actions that craft a TextCraft goal from the recipe lines the server lists.

    Each listed recipe is `craft N OUT using k1 A, k2 B`; an item no listed recipe makes is
    fetched with `get`. Crafts repeat the listed command (the server takes a recipe exactly as
    listed); distractor recipes are never used unless they make what the goal needs."""

    def __init__(self, observation: str) -> None:
        goal = _GOAL.search(observation)
        if goal is None:
            raise ValueError("no 'Goal: craft ...' line in the observation")
        self.goal = goal.group(1)
        self.recipes: dict[str, tuple[int, list[tuple[int, str]], str]] = {}
        for line in observation.splitlines():
            m = _CRAFT.match(line.strip())
            if m and m.group(2) not in self.recipes:  # the first recipe for an item wins
                ins = [_INGREDIENT.match(part.strip()) for part in m.group(3).split(",")]
                if all(ins):
                    self.recipes[m.group(2)] = (
                        int(m.group(1)), [(int(i.group(1)), i.group(2)) for i in ins], line.strip())

    def plan(self) -> list[str]:
        actions: list[str] = []
        self._obtain(self.goal, 1, Counter(), actions, depth=0)
        return actions

    def _obtain(self, item: str, n: int, have: Counter, actions: list[str], *,
                depth: int) -> None:
        if have[item] >= n:
            return
        if depth > 12:
            raise ValueError(f"the recipes for {self.goal!r} nest deeper than 12")
        if item not in self.recipes:
            actions.append(f"get {n - have[item]} {item}")
            have[item] = n
            return
        made, ingredients, command = self.recipes[item]
        for _ in range(math.ceil((n - have[item]) / made)):
            for k, ingredient in ingredients:
                self._obtain(ingredient, k, have, actions, depth=depth + 1)
                have[ingredient] -= k
            actions.append(command)
            have[item] += made


_AVAILABLE = re.compile(r"Available actions: \[(.*)\]", re.DOTALL)
_MISSION = re.compile(r"Your goal: (go to|pick up) (?:the|a) (.+)$", re.MULTILINE)


def babyai_action(observation: str, mission: str) -> str:
    """The next action for a one-room GoTo/PickUp mission (`mission`: the "Your goal: ..."
    line of the first observation): the goal's object when listed, else turn left."""
    m = _MISSION.search(mission)
    listed = _AVAILABLE.search(observation)
    if m is None or listed is None:
        raise ValueError("expected 'Your goal: go to|pick up ...' and an 'Available actions' list")
    verb, target = m.group(1), m.group(2).strip()
    actions = re.findall(r'"([^"]*)"', listed.group(1))
    for action in (f"pickup {target} 1", f"go to {target} 1") if verb == "pick up" else (
            f"go to {target} 1",):
        if action in actions:
            return action
    return "turn left"


# The server's excluded tasks (agentenv_sciworld/environment.py): their games are not listed.
_SCIWORLD_EXCLUDED = {"5-1", "5-2", "9-1", "9-2", "9-3", "10-1", "10-2"}


def sciworld_games() -> list[tuple[str, int]]:
    """The server's task index -> (task name, variation), built as the server builds it."""
    from scienceworld import ScienceWorldEnv

    env = ScienceWorldEnv()
    try:
        return [(name, v) for key, name in env.tasks.items() if key not in _SCIWORLD_EXCLUDED
                for v in range(env.get_max_variations(name))]
    finally:
        env.close()


def sciworld_gold_path(task: str, variation: int) -> list[str]:
    """The game's gold action sequence for a (task, variation) (a solution to score 100)."""
    from scienceworld import ScienceWorldEnv

    env = ScienceWorldEnv()
    try:
        env.load(task, variation, generateGoldPath=True)
        return list(env.get_gold_action_sequence())
    finally:
        env.close()
