"""ScienceWorld (Wang et al., 2022) as a horizonrl text environment, AgentGym's SciWorld.

The game is the `scienceworld` package's simulator, a Scala program in its own JVM that we drive
over py4j on loopback, one JVM per env. We talk to the simulator's `PythonInterface` directly
instead of through `scienceworld.ScienceWorldEnv` because its `step` rebuilds the look text, the
inventory and the full valid-action list every turn (160-370 ms); a bare `step` plus score and
completion checks costs a few milliseconds. It also lets us set the JVM heap and really stop the
JVM on `close()`.

    env = SciWorldEnv(tasks=["find-animal"])
    obs, info = env.reset(seed=0)      # "Task Description:\\n...\\n\\nThis room is called ..."
    result = env.step(parse_action(model_text))

Rewards: the game scores 0-100; each step's reward is the increase of score / 100, so an
episode's rewards sum to its final score / 100. A failed task (the game sets a negative score,
e.g. after focusing on the wrong object) ends the episode and counts as score 0: that step's
reward takes back the progress made so far, so a failed episode returns 0.
"""

from __future__ import annotations

import contextlib
import random
import re
import subprocess
import weakref
from typing import Any, Self

from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway
from py4j.protocol import Py4JJavaError
from scienceworld.constants import BASEPATH, ID2TASK, JAR_PATH

from horizonrl.envpool.base import MAX_ACTION_CHARS, StepResult, parse_agentgym_action, task_split

SYSTEM_PROMPT = (
    "You are an agent in ScienceWorld, a text simulation of a house with rooms, objects, "
    "substances, plants, animals and electrical parts. The first message gives your task and "
    "what you see. Commands (OBJ and LOC are names as the game writes them):\n"
    "- look around; look at OBJ; look in OBJ; inventory; task (repeat the task)\n"
    "- go to LOC; teleport to LOC; open OBJ; close OBJ\n"
    "- pick up OBJ; put down OBJ; move OBJ to OBJ; pour OBJ in OBJ; dunk OBJ in OBJ; mix OBJ\n"
    "- activate OBJ; deactivate OBJ; use OBJ on OBJ; connect OBJ to OBJ; disconnect OBJ\n"
    "- read OBJ; eat OBJ; flush OBJ; wait (10 time steps); wait1 (1 time step)\n"
    "- focus on OBJ: marks the object the task is about. Focusing on the wrong object fails "
    "the task, so focus only when sure.\n"
    "If the game answers with a numbered list of possible meanings, reply with the number of "
    "the one you intended. Each turn, answer with two lines:\n"
    "Thought: <your reasoning>\nAction: <one command>"
)

# Short tasks from five of ScienceWorld's topics: gold paths of 3-23 steps, loads under 0.4 s.
DEFAULT_TASKS = (
    "find-animal",
    "chemistry-mix-paint-secondary-color",
    "power-component",
    "use-thermometer",
    "test-conductivity",
    "lifespan-longest-lived",
)
SPLITS = ("train", "dev", "test")
_MAX_COMMAND_CHARS = 300  # valid commands are under ~120 characters; longer never reaches the JVM
# The game's replies to input its parser rejects (unknown verb or object, bad number answer).
_REJECTED = ("No known action matches that input.", "Unknown action.")
_AMBIGUOUS = "Ambiguous request"  # the game then waits for a number; anything else cancels
_CHOICE_RE = re.compile(r"^(\d+):\t", re.MULTILINE)
_ELECTRICAL = ("power-component", "conductivity")  # tasks that need the connect actions
# The simulator's simplifications ("easy" = all of them, except noElectricalAction on the
# electrical tasks); listed here so a bad config fails before a JVM starts.
_SIMPLIFICATIONS = ("easy", "teleportAction", "selfWateringFlowerPots", "openContainers",
                    "openDoors", "noElectricalAction")  # fmt: skip
# The simulator keeps objects in hash sets keyed by identity hash codes, which HotSpot draws at
# random: the same (task, variation) then lists its objects in a different order on every load
# (24 of 30 tasks differed). A constant identity hash makes every set iterate in insertion order,
# so the same seed and actions give the same text in any JVM; measured cost: none (all 30 gold
# paths took 68 s with the flag, 69 s without). The gold paths it generates can still differ
# between JVMs that ran other tasks before (seen for boil); the game text does not.
_DETERMINISTIC_JVM = ("-XX:+UnlockExperimentalVMOptions", "-XX:hashCode=2")
# What a random agent tries when the env does not list valid actions (valid_actions=False).
_GENERIC_ACTIONS = (
    "look around", "inventory", "wait1", "go to kitchen", "go to hallway", "go to outside",
    "open door to kitchen", "pick up thermometer", "focus on water", "activate stove",
    "look at table", "open cupboard", "0",
)  # fmt: skip


def format_action(action: str) -> str:
    """How a well-formed reply carries `action` (AgentGym's "Action: <action>" style)."""
    return f"Action: {action}"


def _normalise(text: str) -> str:
    """Lowercase (the game ignores case; one spelling makes commands comparable), collapse
    whitespace (the game's parser does not), drop an `action:` prefix, quotes, a final period."""
    text = " ".join(text.lower().split())
    if text.startswith("action:"):
        text = text[len("action:") :]
    return text.strip().strip("`'\"").rstrip(".").strip()


def parse_action(text: str) -> str:
    """The command in a model's reply ("Thought: ... Action: X" or a bare first line),
    normalised. Never raises."""
    return _normalise(parse_agentgym_action(text))


def _check_config(tasks: tuple[str, ...], simplification: str) -> None:
    """Errors a user can act on for unknown task names and simplifications."""
    known = sorted(ID2TASK.values())  # the package's task table, the JVM's names
    if not tasks or any(t not in known for t in tasks):
        raise ValueError(f"tasks must be a non-empty list of {known}; got {list(tasks)}")
    parts = [p for p in simplification.split(",") if p]
    if any(p not in _SIMPLIFICATIONS for p in parts):
        raise ValueError(
            f"simplification {simplification!r}: comma-separated parts of {_SIMPLIFICATIONS}"
        )
    if "noElectricalAction" in parts and any(e in t for t in tasks for e in _ELECTRICAL):
        raise ValueError("noElectricalAction removes actions the electrical tasks need")


def _start_jvm(heap_mb: int) -> tuple[JavaGateway, subprocess.Popen]:
    """Launch the simulator's JVM on a free loopback port and connect to it."""
    # --die-on-broken-pipe (die_on_exit): the JVM exits when our end of its stdin closes, so it
    # never outlives this process, and closing stdin is how `_stop_jvm` ends it.
    port, proc = launch_gateway(
        classpath=JAR_PATH,
        die_on_exit=True,
        cwd=BASEPATH,
        javaopts=[f"-Xmx{heap_mb}m", *_DETERMINISTIC_JVM],
        return_proc=True,
    )
    gateway = JavaGateway(
        gateway_parameters=GatewayParameters(port=port, auto_field=True), java_process=proc
    )
    return gateway, proc


def _stop_jvm(gateway: JavaGateway, proc: subprocess.Popen) -> None:
    """Close the py4j connection, then end the JVM (killing it if it does not exit in 5 s)."""
    with contextlib.suppress(Exception):  # the JVM may already be gone; shutdown is best effort
        gateway.shutdown()
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


class SciWorldEnv:
    """ScienceWorld tasks as a `TextEnv` (see envpool/base.py).

    A seed picks one (task, variation) pair: train seeds from the game's train variations,
    eval seeds from its test variations (`options={"split": "dev"}` picks dev ones). Each split
    is one fixed list that interleaves the tasks (task 1 variation 1, task 2 variation 1, ...),
    so a run of consecutive seeds covers every task; an index wraps modulo the list's length.
    """

    env_name = "sciworld"

    def __init__(
        self,
        *,
        tasks: list[str] | tuple[str, ...] | None = None,
        simplification: str = "easy",
        valid_actions: bool = False,
        max_steps: int | None = None,
        jvm_heap_mb: int = 512,
    ) -> None:
        self.tasks = tuple(tasks) if tasks is not None else DEFAULT_TASKS
        _check_config(self.tasks, simplification)
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if jvm_heap_mb < 64:
            raise ValueError(f"jvm_heap_mb must be >= 64, got {jvm_heap_mb}")
        self.simplification = simplification
        self.valid_actions = valid_actions
        self.max_steps = max_steps
        self._gateway, self._proc = _start_jvm(jvm_heap_mb)
        self._closer = weakref.finalize(self, _stop_jvm, self._gateway, self._proc)
        self._server = self._gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()
        try:
            self._splits = self._read_splits()
        except BaseException:
            self.close()
            raise
        self._task: str | None = None
        self._variation = -1
        self._history: list[str] = []  # commands sent to the game this episode, for replays
        self._gold: list[str] | None = None  # the gold path, generated when the oracle is asked
        self._gold_pos = 0
        self._actions: list[str] | None = None  # valid actions in this state, once computed
        self._obs = ""
        self._steps = 0
        self._score = 0
        self._pending_choice = False
        self._terminated = self._truncated = self._success = self._failed = False

    @property
    def splits(self) -> dict[str, list[tuple[str, int]]]:
        """Each split's (task, variation) list in seed order (index = seed within its split)."""
        return {split: list(pairs) for split, pairs in self._splits.items()}

    # ----------------------------------------------------------------------------- gym API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Load the seed's (task, variation); the same seed gives the same text."""
        options = dict(options or {})
        split, index = task_split(seed)
        split = options.pop("split", "train" if split == "train" else "test")
        if options or split not in SPLITS:
            raise ValueError(
                f"options may only hold 'split' (one of {SPLITS}); got extra keys "
                f"{sorted(options)} and split {split!r}"
            )
        self._task, self._variation = self._splits[split][index % len(self._splits[split])]
        self._load(gold=False)
        self._history, self._gold, self._gold_pos = [], None, 0
        self._actions, self._steps, self._score, self._pending_choice = None, 0, 0, False
        self._terminated = self._truncated = self._success = self._failed = False
        look = str(self._server.freeActionLook()).rstrip()  # as the `look around` reply is
        self._obs = f"{self._server.freeActionTaskDesc()}\n\n{look}"
        return self._obs, self._info(invalid=False)

    def step(self, action: str) -> StepResult:
        """Send one command to the game. Never raises on any string."""
        if self._task is None:
            raise RuntimeError("call reset() before step()")
        if self._terminated or self._truncated:
            return self._result("Invalid action. The episode has ended.", 0.0, invalid=True)
        self._steps += 1
        # Length is checked first so a runaway 1 MB generation is rejected without parsing it.
        ok = isinstance(action, str) and len(action) <= MAX_ACTION_CHARS
        command = _normalise(action) if ok else ""
        if not (
            0 < len(command) <= _MAX_COMMAND_CHARS and command.isascii() and command.isprintable()
        ):
            if self._pending_choice:  # the game would read any bad answer as "cancel"
                self._send("")
            return self._result(
                "Invalid action. Answer with one short plain-text command, e.g. look around.",
                0.0,
                invalid=True,
            )
        try:
            reply = self._send(command)
        except Py4JJavaError as err:  # the simulator choked on this input; its state is unchanged
            return self._result(f"Invalid action. {err.java_exception}", 0.0, invalid=True)
        if reply.startswith(_REJECTED):
            return self._result(f"Invalid action. {reply}", 0.0, invalid=True)
        return self._result(reply, self._update_score(), invalid=False)

    def oracle_action(self) -> str:
        """The next action of the game's gold path (a solution that reaches score 100).

        The path is generated on the first call of an episode (a reload and a replay of the
        commands so far, a few ms each). It only advances when the gold action is taken, so
        after other actions the oracle still proposes the next gold action rather than replan.
        """
        if self._task is None:
            raise RuntimeError("call reset() before oracle_action()")
        if self._gold is None:
            self._load(gold=True)
            self._gold = [str(a) for a in self._server.getGoldActionSequence()]
            self._gold_pos = 0
            history, self._history = self._history, []
            for command in history:  # the simulator is deterministic: same commands, same state
                self._send(command)
        if self._gold_pos < len(self._gold):
            return self._gold[self._gold_pos]
        return "look around"

    def process_ids(self) -> list[int]:
        """The JVM's pid while it runs (for RSS measurements); [] after close()."""
        return [self._proc.pid] if self._proc.poll() is None else []

    def close(self) -> None:
        """Stop the JVM and free its port. Safe to call twice."""
        self._closer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------- internals
    def _read_splits(self) -> dict[str, list[tuple[str, int]]]:
        """Each split's (task, variation) list, tasks interleaved. One quick load per task."""
        per_task: dict[str, list[list[int]]] = {s: [] for s in SPLITS}
        for task in self.tasks:
            self._server.load(task, 0, self.simplification, False)
            per_task["train"].append([int(v) for v in self._server.getVariationsTrain()])
            per_task["dev"].append([int(v) for v in self._server.getVariationsDev()])
            per_task["test"].append([int(v) for v in self._server.getVariationsTest()])
        splits = {}
        for split, lists in per_task.items():
            longest = max(len(v) for v in lists)
            pairs = list(zip(self.tasks, lists, strict=True))
            splits[split] = [(t, v[k]) for k in range(longest) for t, v in pairs if k < len(v)]
        return splits

    def _load(self, *, gold: bool) -> None:
        error = self._server.load(self._task, self._variation, self.simplification, gold)
        if error:
            raise RuntimeError(
                f"ScienceWorld could not load {self._task}/{self._variation}: {error}"
            )
        if gold:  # making the gold path plays it through; reset() puts the start state back
            self._server.reset()

    def _send(self, command: str) -> str:
        """One game step on the fast path (no look, inventory or valid-action rebuild)."""
        reply = str(self._server.step(command))
        self._history.append(command)
        self._pending_choice = reply.startswith(_AMBIGUOUS)
        if not reply.startswith(_REJECTED):
            self._actions = None  # the state may have changed
        # Gold names keep capitals ("substance B"); the game ignores case. A few gold actions
        # are rejected by the game (seen in the genetics tasks); the gold run just goes on.
        gold = self._gold
        if gold and self._gold_pos < len(gold) and command == _normalise(gold[self._gold_pos]):
            self._gold_pos += 1
        return reply

    def _update_score(self) -> float:
        raw = round(100 * float(self._server.getScore()))
        completed = bool(self._server.getCompleted())
        self._failed = raw < 0
        score = max(raw, 0)  # a failed task counts as score 0 (see the module docstring)
        reward = (score - self._score) / 100
        self._score = score
        self._success = completed and score >= 100
        self._terminated = completed or self._failed
        return reward

    def _result(self, observation: str, reward: float, *, invalid: bool) -> StepResult:
        if not invalid:
            self._obs = observation
        if self.max_steps is not None and self._steps >= self.max_steps and not self._terminated:
            self._truncated = True
        return StepResult(
            observation, reward, self._terminated, self._truncated, self._info(invalid=invalid)
        )

    def _info(self, *, invalid: bool) -> dict[str, Any]:
        """The step's info. `state_key` (GiGPO's anchor state, actors/rollout.state_key) is the
        last valid game text (the opening after reset): an invalid action leaves the game as it
        was, so it keeps the key instead of sharing one "Invalid action." key with every state."""
        info: dict[str, Any] = {
            "state_key": self._obs,
            "invalid_action": invalid,
            "success": self._success,
            "score": self._score,
            "failed": self._failed,
            "task": self._task,
            "variation": self._variation,
            "steps": self._steps,
        }
        if self.valid_actions:
            info["available_actions"] = self._available_actions()
        return info

    def _available_actions(self) -> list[str]:
        """The game's valid commands here (15-300 ms to build, so cached per state)."""
        if self._terminated or self._truncated:
            return []
        if self._pending_choice:  # only a number answers the game's question
            return _CHOICE_RE.findall(self._obs)
        if self._actions is None:
            self._actions = [str(a) for a in self._server.getValidActionObjectCombinations()]
        return list(self._actions)


def random_action(info: dict[str, Any], rng: random.Random) -> str:
    """A random action: from `info["available_actions"]` when the env lists them
    (valid_actions=True), else from a small list of generic commands."""
    return rng.choice(info.get("available_actions") or _GENERIC_ACTIONS)
