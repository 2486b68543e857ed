"""BabyAI levels (minigrid) behind a text interface, AgentGym's BabyAI env rebuilt.

Each turn the agent reads a short text (mission, what it sees in its 7x7 egocentric view with
per-episode object ids, the actions it may take) and answers with one action. High-level actions
(`go to red ball 1`, `pick up grey key 1`, `go through yellow door 1`, ...) are walked out as
sequences of minigrid primitive steps along a shortest path, so success is always judged by
minigrid's own verifier.

    env = BabyAITextEnv(level="BabyAI-GoToRedBall-v0")
    obs, info = env.reset(seed=0)
    result = env.step(parse_action(model_text))
"""

from __future__ import annotations

import contextlib
import io
import random
from collections import deque
from typing import Any, Self

import gymnasium as gym
import minigrid  # noqa: F401  (importing it registers the BabyAI-* ids with gymnasium)
from minigrid.core.constants import DIR_TO_VEC
from minigrid.core.world_object import WorldObj

from horizonrl.envpool.babyai_oracle import macro_oracle_action, primitive_oracle_action
from horizonrl.envpool.base import StepResult, parse_agentgym_action, shaping_weight

# Kwargs that never change an observation (the reward mode and the penalty change rewards only):
# the tiny model's cache key leaves them out (EnvSpec.reward_kwargs).
REWARD_KWARGS = frozenset(("reward", "invalid_penalty"))

SYSTEM_PROMPT = (
    "You are an agent in a grid world. Each turn, answer with one line: Action: followed by "
    "exactly one action copied from the Actions list."
)


def format_action(action: str) -> str:
    """How a well-formed reply carries `action` (AgentGym's "Action: <action>" style)."""
    return f"Action: {action}"

_VIEW = 7  # minigrid's default agent_view_size; the agent sits at view cell (3, 6)
_HALF = _VIEW // 2
_MAX_ACTION_CHARS = 200  # no listed action is longer; anything longer is invalid without parsing
_PRIMITIVES = ("turn left", "turn right", "move forward")
# minigrid.core.actions.Actions values, spelled out so the hot path compares plain ints.
_LEFT, _RIGHT, _FORWARD, _PICKUP, _DROP, _TOGGLE, _DONE = range(7)
_DIRS = [(int(v[0]), int(v[1])) for v in DIR_TO_VEC]  # 0 east, 1 south, 2 west, 3 north


def _normalise(text: str) -> str:
    """Lowercase, collapse whitespace, drop an `action:` prefix and a trailing period."""
    text = " ".join(text.lower().split())
    if text.startswith("action:"):
        text = text[len("action:") :].strip()
    return text.rstrip(".").rstrip()


def parse_action(text: str) -> str:
    """Pull the action out of a model's reply ("Thought: ... Action: X" or a bare first line),
    normalised. Never raises."""
    return _normalise(parse_agentgym_action(text))


def _steps(n: int, forward: str, backward: str) -> str:
    word = forward if n > 0 else backward
    return f"{abs(n)} step{'s' if abs(n) != 1 else ''} {word}"


class BabyAITextEnv:
    """One BabyAI level as a `TextEnv` (see envpool/base.py).

    Objects get ids at reset, numbered per (color, type) in row-major grid order ("red ball 1",
    "grey door 2"); they keep them for the whole episode, also while carried or after a drop.
    Invalid actions use up the turn but not a primitive step.
    """

    env_name = "babyai"

    def __init__(
        self,
        *,
        level: str = "BabyAI-GoToRedBall-v0",
        reward: str = "binary",
        max_primitive_steps: int | None = None,
        expert: str = "primitive",
        invalid_penalty: float = 0.0,
    ) -> None:
        if reward not in ("binary", "scaled"):
            raise ValueError(f"reward must be 'binary' or 'scaled', got {reward!r}")
        if max_primitive_steps is not None and max_primitive_steps < 1:
            raise ValueError(f"max_primitive_steps must be >= 1, got {max_primitive_steps}")
        if expert not in ("primitive", "macro"):
            raise ValueError(f"expert must be 'primitive' or 'macro', got {expert!r}")
        self.level = level
        self.expert = expert
        # Reward -invalid_penalty for an action not in the list: a shaped signal against
        # naming objects that are not there (off by default: AgentGym's reward is the env's).
        self.invalid_penalty = shaping_weight("invalid_penalty", invalid_penalty)
        self.reward_mode = reward
        self.max_primitive_steps = max_primitive_steps
        # Wrappers (order enforcing, env checker) only add per-step cost; we call the raw env.
        self._env = gym.make(level, disable_env_checker=True).unwrapped
        self._labels: dict[int, tuple[WorldObj, str]] = {}
        self._found: dict[tuple[int, int], tuple[int, int, int]] = {}
        self._parents: dict[tuple[int, int, int], Any] = {}
        self._actions: dict[str, tuple[str, Any]] = {}
        self._obs = ""
        self._mission = ""
        self._steps = 0
        self._started = False
        self._terminated = False
        self._truncated = False
        self._success = False
        # The oracle's BabyAIBot and the primitive-step count at which it expects to be asked next.
        self._bot: Any = None
        self._bot_step = -1

    @property
    def unwrapped_env(self) -> Any:
        """The raw minigrid env (for BabyAIBot, rendering, debugging)."""
        return self._env

    @property
    def primitive_steps(self) -> int:
        """Primitive minigrid steps taken so far in this episode."""
        return self._steps

    # ----------------------------------------------------------------------------- gym API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode; the same seed gives the same grid, ids and text."""
        # minigrid prints "Sampling rejected: ..." to stdout while it redraws levels; in a worker
        # process that is pure log noise. (The swap of sys.stdout is process-wide: another
        # thread printing during a reset loses that output.)
        with contextlib.redirect_stdout(io.StringIO()):
            self._env.reset(seed=seed)
        self._label_objects()
        self._mission = str(self._env.mission)
        self._steps = 0
        self._started = True
        self._terminated = self._truncated = self._success = False
        self._bot = None
        self._refresh()
        return self._obs, self._info(invalid=False)

    def step(self, action: str) -> StepResult:
        """Run one text action (one or several primitive steps). Never raises on any string."""
        if not self._started:
            raise RuntimeError("call reset() before step()")
        # Length is checked first so a runaway 1 MB generation is rejected without parsing it.
        ok = isinstance(action, str) and len(action) <= _MAX_ACTION_CHARS * 8
        key = _normalise(action) if ok else ""
        if self._terminated or self._truncated or key not in self._actions:
            return self._invalid()
        kind, arg = self._actions[key]
        total = 0.0
        if kind == "prim":
            _, total = self._prim(arg)
        else:
            total = self._macro(kind, arg)
            if total is None:  # no path after all (cannot happen for listed actions)
                return self._invalid()
        reward = (1.0 if self._success else 0.0) if self.reward_mode == "binary" else total
        self._refresh()
        return StepResult(
            self._obs, float(reward), self._terminated, self._truncated, self._info(invalid=False)
        )

    def oracle_action(self) -> str:
        """The scripted agent's next action (minigrid's BabyAIBot); see `oracle_action`."""
        return oracle_action(self)

    def close(self) -> None:
        """Release the minigrid env."""
        self._env.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------- internals
    def _info(self, *, invalid: bool) -> dict[str, Any]:
        """The step's info. `state_key` (GiGPO's anchor state, actors/rollout.state_key) is the
        observation without the "Invalid action. " note: an invalid action changes nothing, so
        it keeps the key, and no step count enters it."""
        return {
            "state_key": self._obs,
            "invalid_action": invalid,
            "success": self._success,
            "available_actions": list(self._actions),
            "primitive_steps": self._steps,
            "mission": self._mission,
        }

    def _invalid(self) -> StepResult:
        return StepResult(
            "Invalid action. " + self._obs,
            -self.invalid_penalty,
            self._terminated,
            self._truncated,
            self._info(invalid=True),
        )

    def _label_objects(self) -> None:
        """Give every non-wall object an episode-long id, numbered per (color, type)."""
        counts: dict[tuple[str, str], int] = {}
        self._labels = {}
        grid = self._env.grid
        objs = [o for o in grid.grid if o is not None and o.type != "wall"]
        if self._env.carrying is not None:  # some levels start with the agent holding something
            objs.append(self._env.carrying)
        # A box's content (KeyInBox) enters the grid when the box is toggled: label it now.
        objs += [o.contains for o in objs if o.type == "box" and o.contains is not None]
        for obj in objs:
            n = counts.get((obj.color, obj.type), 0) + 1
            counts[(obj.color, obj.type)] = n
            # Keyed by id() with the object kept alive, so an id is never reused mid-episode.
            self._labels[id(obj)] = (obj, f"{obj.color} {obj.type} {n}")

    def _label(self, obj: WorldObj) -> str | None:
        entry = self._labels.get(id(obj))
        return entry[1] if entry is not None and entry[0] is obj else None

    def _refresh(self) -> None:
        """Recompute this turn's visible objects, reachable targets, action table and text."""
        env = self._env
        view, vis = env.gen_obs_grid()
        ax, ay = int(env.agent_pos[0]), int(env.agent_pos[1])
        fx, fy = _DIRS[env.agent_dir]
        rx, ry = -fy, fx
        seen = []  # (distance, forward, lateral, label, obj, world position)
        for j in range(_VIEW):
            for i in range(_VIEW):
                if not vis[i, j] or (i == _HALF and j == _VIEW - 1):
                    continue  # the agent's own cell holds what it carries, not the floor
                obj = view.get(i, j)
                if obj is None or obj.type == "wall":
                    continue
                label = self._label(obj)
                if label is None:
                    continue
                fwd, lat = _VIEW - 1 - j, i - _HALF
                pos = (ax + fx * fwd + rx * lat, ay + fy * fwd + ry * lat)
                seen.append((fwd + abs(lat), fwd, lat, label, obj, pos))
        seen.sort(key=lambda s: s[:4])
        # One search per turn serves both the action list and the walk if one is chosen.
        self._found, self._parents = self._search({s[5] for s in seen})
        reachable = self._found

        front = view.get(_HALF, _VIEW - 2)
        carrying = env.carrying
        actions: dict[str, tuple[str, Any]] = {
            "turn left": ("prim", _LEFT),
            "turn right": ("prim", _RIGHT),
            "move forward": ("prim", _FORWARD),
        }
        if front is not None and front.type in ("door", "box"):
            actions["toggle"] = ("prim", _TOGGLE)
        if carrying is not None:
            actions["drop"] = ("prim", _DROP)
        items = []
        for _, fwd, lat, label, obj, pos in seen:
            where = [_steps(fwd, "forward", "back")] if fwd else []
            if lat:
                where.append(_steps(lat, "right", "left"))
            locked = " (locked)" if obj.type == "door" and obj.is_locked else ""
            items.append(f"{label}{locked}: {', '.join(where)}")
            if pos not in reachable:
                continue
            actions[f"go to {label}"] = ("go to", pos)
            if obj.can_pickup() and carrying is None:
                actions[f"pick up {label}"] = ("pick up", pos)
            if obj.type == "door":
                kind = "go through" if obj.is_open else "toggle and go through"
                actions[f"{kind} {label}"] = (kind, pos)
        if front is not None and front.type == "wall":
            items.append("wall in front")

        lines = [f"Mission: {self._mission}", "You see: " + ("; ".join(items) or "nothing")]
        if carrying is not None:
            lines.append(f"You carry: {self._label(carrying)}")
        lines.append("Actions: " + ", ".join(actions))
        self._actions = actions
        self._obs = "\n".join(lines)

    def _search(self, targets: set[tuple[int, int]]) -> tuple[dict, dict]:
        """Breadth-first search over (x, y, direction) with turn/forward moves.

        Returns ({target: final state}, parents): the final state is the first (so shortest)
        one whose front cell is the target, the state minigrid's GoTo check wants.
        """
        env = self._env
        cells, width, height = env.grid.grid, env.grid.width, env.grid.height
        start = (int(env.agent_pos[0]), int(env.agent_pos[1]), int(env.agent_dir))
        parents: dict[tuple[int, int, int], tuple | None] = {start: None}
        found: dict[tuple[int, int], tuple[int, int, int]] = {}
        remaining = set(targets)
        queue = deque([start])
        while queue and remaining:
            state = queue.popleft()
            x, y, d = state
            dx, dy = _DIRS[d]
            nx, ny = x + dx, y + dy
            if (nx, ny) in remaining:
                found[(nx, ny)] = state
                remaining.discard((nx, ny))
            moves = [((x, y, (d - 1) % 4), _LEFT), ((x, y, (d + 1) % 4), _RIGHT)]
            if 0 <= nx < width and 0 <= ny < height:
                cell = cells[ny * width + nx]
                # Lava can be walked onto but ends the episode; never route through it.
                if cell is None or (cell.can_overlap() and cell.type != "lava"):
                    moves.append(((nx, ny, d), _FORWARD))
            for nxt, act in moves:
                if nxt not in parents:
                    parents[nxt] = (state, act)
                    queue.append(nxt)
        return found, parents

    def _path(self, target: tuple[int, int]) -> list[int] | None:
        """Primitive actions from the current state to facing `target` (this turn's search)."""
        if target not in self._found:
            return None
        path, state = [], self._found[target]
        while self._parents[state] is not None:
            state, act = self._parents[state]
            path.append(act)
        return path[::-1]

    def _prim(self, action: int) -> tuple[bool, float]:
        """One minigrid step; returns (episode over, minigrid reward)."""
        _, reward, terminated, truncated, _ = self._env.step(action)
        self._steps += 1
        if self.max_primitive_steps is not None and self._steps >= self.max_primitive_steps:
            truncated = True
        self._terminated, self._truncated = bool(terminated), bool(truncated)
        self._success = self._terminated and reward > 0
        return self._terminated or self._truncated, float(reward)

    def _macro(self, kind: str, target: tuple[int, int]) -> float | None:
        """Walk to face `target`, then finish `kind`; stops as soon as the episode ends."""
        path = self._path(target)
        if path is None:
            return None
        if not path and kind == "go to":
            # Already facing it: minigrid only checks GoTo after a step, and `done` is its no-op.
            path = [_DONE]
        total = 0.0
        for act in path:
            over, r = self._prim(act)
            total += r
            if over:
                return total
        door = self._env.grid.get(*target)
        if kind == "pick up":
            tail = [_PICKUP]
        elif kind == "go through":
            tail = [_FORWARD, _FORWARD]
        elif kind == "toggle and go through":
            over, r = self._prim(_TOGGLE)
            total += r
            # A locked door without its key stays shut: stop in front of it.
            tail = [] if over or door is None or not door.is_open else [_FORWARD, _FORWARD]
        else:
            tail = []
        for act in tail:
            over, r = self._prim(act)
            total += r
            if over:
                break
        return total


def random_action(info: dict[str, Any], rng: random.Random) -> str:
    """A uniformly random action from `info["available_actions"]` (pre-training data, tests)."""
    return rng.choice(info["available_actions"])


random_valid_action = random_action  # the name the tiny-model builder and older tests use


def oracle_action(env: BabyAITextEnv) -> str:
    """The expert's next action for `env`: the high-level planner (`expert="macro"`) or
    minigrid's BabyAIBot one primitive step at a time (`expert="primitive"`)."""
    if env.expert == "macro":
        return macro_oracle_action(env)
    return primitive_oracle_action(env)
