"""BabyAI experts: minigrid's BabyAIBot one primitive step at a time, and a planner that acts
with the high-level actions (`go to X`, `pick up X`, `toggle and go through X`, ...) a text
agent is offered, so an expert episode is as short in turns as a good agent's.

The macro planner sees the whole grid (an expert may be privileged); it acts only through the
actions listed in the current observation, so every action it takes is one the model could
have copied from its context. Supported instructions: go to, pick up and open, and sequences of
them (`... then ...`, `... after you ...`, `... and ...`); locked doors are opened with their key.
Other instructions (put next to) fall back to the primitive bot. Its success and turns per
level: `bench/experts.py` (docs/long-horizon/experts.json); it does not solve levels whose key
hides in another room (Unlock, KeyCorridor).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from minigrid.core.constants import DIR_TO_VEC
from minigrid.envs.babyai.core.verifier import (
    AfterInstr,
    AndInstr,
    BeforeInstr,
    GoToInstr,
    OpenInstr,
    PickupInstr,
)
from minigrid.utils.baby_ai_bot import BabyAIBot

if TYPE_CHECKING:
    from horizonrl.envpool.babyai import BabyAITextEnv

_LEFT, _RIGHT, _FORWARD, _PICKUP, _DROP, _TOGGLE, _DONE = range(7)
_DIRS = [(int(v[0]), int(v[1])) for v in DIR_TO_VEC]
_PRIM_TEXT = {_LEFT: "turn left", _RIGHT: "turn right", _FORWARD: "move forward"}


def primitive_oracle_action(env: BabyAITextEnv) -> str:
    """The next primitive action minigrid's BabyAIBot suggests, as one of env's action strings.

    Every action returned costs exactly one primitive step when passed to `env.step`, which is
    what the bot assumes. If other actions were taken since the last call the bot is rebuilt
    (it then forgets what it had explored). The bot itself cannot solve the *Carrying and
    KeyInBox levels (it asserts) and can loop forever on a few seeds of others (seen:
    UnlockToUnlock seed 102), so use it on levels that were checked.
    """
    if env._bot is None or env._bot_step != env.primitive_steps:
        env._bot = BabyAIBot(env.unwrapped_env)
    act = int(env._bot.replan())
    env._bot_step = env.primitive_steps + 1
    simple = {**_PRIM_TEXT, _TOGGLE: "toggle", _DROP: "drop"}
    if act in simple:
        return simple[act]
    # pickup and done act on the object in front: `pick up X` / `go to X` while already facing
    # X cost exactly one primitive step (pickup / done).
    u = env.unwrapped_env
    front = u.grid.get(*u.front_pos)
    label = env._label(front) if front is not None else None
    verb = "pick up" if act == _PICKUP else "go to"
    if label is not None and f"{verb} {label}" in env._actions:
        return f"{verb} {label}"
    env._bot = None  # the bot's plan no longer matches what will happen
    return "turn left"


def _active_leaf(instr: Any) -> Any:
    """The sub-instruction to work on now (minigrid's verifiers record which parts are done)."""
    if isinstance(instr, BeforeInstr):
        return _active_leaf(instr.instr_b if instr.a_done == "success" else instr.instr_a)
    if isinstance(instr, AfterInstr):
        return _active_leaf(instr.instr_a if instr.b_done == "success" else instr.instr_b)
    if isinstance(instr, AndInstr):
        return _active_leaf(instr.instr_b if instr.a_done == "success" else instr.instr_a)
    return instr


def macro_oracle_action(env: BabyAITextEnv) -> str:
    """The planner's next action, always one listed in the current observation."""
    u = env.unwrapped_env
    leaf = _active_leaf(u.instrs)
    if not isinstance(leaf, GoToInstr | PickupInstr | OpenInstr):
        return primitive_oracle_action(env)
    goals = [tuple(p) for p in leaf.desc.obj_poss]
    if isinstance(leaf, PickupInstr):
        goals = [p for p in goals if p != tuple(u.agent_pos)]
    carrying = u.carrying
    if isinstance(leaf, PickupInstr) and any(carrying is o for o in leaf.desc.obj_set):
        return _primitive_toward(env, goals)  # holds it already: cannot happen mid-episode
    path, blocked_by = _cell_path(u, goals)
    if path is not None and isinstance(leaf, OpenInstr) and _locked(u.grid.get(*path[-1])) \
            and not _passable(u, u.grid.get(*path[-1]), keys=False):
        path, blocked_by = None, u.grid.get(*path[-1])  # a locked door to open: key first
    if path is None:
        if blocked_by is None:
            return _primitive_toward(env, goals)
        # The way is shut by a locked door: fetch its key first (dropping what is held).
        if carrying is not None:
            return _drop_or_turn(env)
        return _act_on(env, _key_cells(u, blocked_by.color), verb="pick up")
    locked_ahead = any(_locked(u.grid.get(*c)) for c in path[1:-1])
    if isinstance(leaf, PickupInstr) and carrying is not None and not locked_ahead:
        return _drop_or_turn(env)  # hands free for the goal once past the last locked door
    verb = {GoToInstr: "go to", PickupInstr: "pick up", OpenInstr: "toggle and go through"}[
        type(leaf)]
    goal = path[-1]
    if _listed(env, goal, verb):
        return _listed(env, goal, verb)
    for cell in path[1:-1]:  # the first door on the way, if the agent can act on it
        obj = u.grid.get(*cell)
        if obj is not None and obj.type == "door":
            for door_verb in ("go through", "toggle and go through"):
                if _listed(env, cell, door_verb):
                    return _listed(env, cell, door_verb)
            return _primitive_toward(env, [cell])
    return _primitive_toward(env, [goal])


def _listed(env: BabyAITextEnv, cell: tuple[int, int], verb: str) -> str | None:
    obj = env.unwrapped_env.grid.get(*cell)
    label = env._label(obj) if obj is not None else None
    action = f"{verb} {label}"
    if label is not None and action in env._actions:
        return action
    if verb == "toggle and go through" and label is not None and f"go through {label}" in \
            env._actions:
        return f"go through {label}"
    return None


def _act_on(env: BabyAITextEnv, cells: list[tuple[int, int]], *, verb: str) -> str:
    for c in cells:
        if _listed(env, c, verb):
            return _listed(env, c, verb)
    path, _ = _cell_path(env.unwrapped_env, cells)
    for cell in (path or [])[1:-1]:
        obj = env.unwrapped_env.grid.get(*cell)
        if obj is not None and obj.type == "door" and _listed(env, cell, "go through"):
            return _listed(env, cell, "go through")
    return _primitive_toward(env, cells)


def _locked(obj: Any) -> bool:
    return obj is not None and obj.type == "door" and obj.is_locked


def _key_cells(u: Any, color: str) -> list[tuple[int, int]]:
    return [(i % u.grid.width, i // u.grid.width) for i, o in enumerate(u.grid.grid)
            if o is not None and o.type == "key" and o.color == color]


def _drop_or_turn(env: BabyAITextEnv) -> str:
    u = env.unwrapped_env
    return "drop" if u.grid.get(*u.front_pos) is None and "drop" in env._actions else "turn left"


def _passable(u: Any, obj: Any, *, keys: bool) -> bool:
    if obj is None:
        return True
    if obj.type == "door":
        if not obj.is_locked:
            return True
        c = u.carrying
        return keys or (c is not None and c.type == "key" and c.color == obj.color)
    return obj.can_overlap() and obj.type != "lava"


def _cell_path(u: Any, goals: list[tuple[int, int]]) -> tuple[list | None, Any]:
    """Shortest 4-connected cell path from the agent to a goal cell (goal included), through
    doors it can open; if only a locked door stands in the way, (None, that door)."""
    for keys in (False, True):
        path = _bfs(u, set(goals), keys=keys)
        if path is not None and not keys:
            return path, None
        if path is not None:
            locked = [d for d in (u.grid.get(*c) for c in path[1:-1]) if _locked(d)]
            return None, (locked[0] if locked else None)
    return None, None


def _bfs(u: Any, goals: set[tuple[int, int]], *, keys: bool) -> list | None:
    start = (int(u.agent_pos[0]), int(u.agent_pos[1]))
    parents: dict[tuple[int, int], tuple[int, int] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        for dx, dy in _DIRS:
            nxt = (cell[0] + dx, cell[1] + dy)
            if nxt in parents or not (0 <= nxt[0] < u.grid.width and 0 <= nxt[1] < u.grid.height):
                continue
            parents[nxt] = cell
            if nxt in goals:
                path = [nxt]
                while parents[path[-1]] is not None:
                    path.append(parents[path[-1]])
                return path[::-1]
            if _passable(u, u.grid.get(*nxt), keys=keys):
                queue.append(nxt)
    return None


def _primitive_toward(env: BabyAITextEnv, cells: list[tuple[int, int]]) -> str:
    """First turn/forward step of a shortest walk to face one of `cells` (used while the
    next waypoint is out of sight, so the agent never wanders)."""
    u = env.unwrapped_env
    start = (int(u.agent_pos[0]), int(u.agent_pos[1]), int(u.agent_dir))
    targets = set(cells)
    parents: dict[tuple, tuple | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        x, y, d = state
        dx, dy = _DIRS[d]
        if (x + dx, y + dy) in targets:
            first = None
            while parents[state] is not None:
                state, first = parents[state]
            return _PRIM_TEXT[first] if first is not None else "turn left"
        moves = [((x, y, (d - 1) % 4), _LEFT), ((x, y, (d + 1) % 4), _RIGHT)]
        nx, ny = x + dx, y + dy
        front = u.grid.get(nx, ny) if 0 <= nx < u.grid.width and 0 <= ny < u.grid.height \
            else False
        # A walk needs open ground: a closed door is passed by a `toggle and go through` macro.
        if front is None or (front is not False and front.can_overlap() and front.type != "lava"):
            moves.append(((nx, ny, d), _FORWARD))
        for nxt, act in moves:
            if nxt not in parents:
                parents[nxt] = (state, act)
                queue.append(nxt)
    return "turn left"
