"""Partial rollouts: where the async driver posts each new policy version, and where a generator
looks between turns so the episodes it has in flight continue with the new weights.

The driver posts (version, the weights' ObjectRef, the curriculum's horizon setting) after
every update that trained; a generator running a rollout asks, between turns, whether anything
newer than what it holds was posted (one small call), and only then fetches the weights from
the object store. The board also holds the admission frontier (AReaL's bound on how far
generation runs ahead of the learner): the last step whose episodes may start now, at most
`max_staleness` updates past the learner's; `CLOSED` tells rollouts to start nothing more. Data
flows one way: learner -> driver -> board -> generators. A plain class, made a Ray actor by the
driver (`PolicyBoard` holds no tensors, only the reference).
"""

from __future__ import annotations

from typing import Any

from horizonrl.actors.curriculum import HorizonSetting

CLOSED = -1  # the frontier of a run that is ending: episodes not started yet never start
News = tuple[int, list[Any], HorizonSetting | None, int | None]


class PolicyBoard:
    """The newest policy version, its weights (an ObjectRef kept inside a list so Ray passes
    it along unresolved), the horizon setting in force and the admission frontier (None: no
    bound)."""

    def __init__(self) -> None:
        self.version = -1
        self.state: list[Any] = []
        self.setting: HorizonSetting | None = None
        self.frontier: int | None = None

    def post(self, version: int, state: list[Any], setting: HorizonSetting | None) -> None:
        """A newer version (with its weights) replaces the posted one, an older or equal one
        is ignored; a newer horizon setting replaces the posted one. `state` may be empty to
        post a setting alone."""
        if state and version > self.version:
            self.version, self.state = int(version), list(state)
        if setting is not None and (self.setting is None
                                    or setting.version >= self.setting.version):
            self.setting = setting

    def admit(self, frontier: int) -> None:
        """Episodes of steps up to `frontier` may start (`CLOSED`: none may any more)."""
        self.frontier = int(frontier)

    def news(self, version: int, horizon_version: int,
             frontier: int | None = None) -> News | None:
        """What is newer than a generator's `version`, `horizon_version` and `frontier`:
        (version, [ref] or [] when the weights are not newer, setting or None, the frontier),
        or None when nothing is."""
        newer_weights = self.version > version
        setting = self.setting if (self.setting is not None
                                   and self.setting.version > horizon_version) else None
        if not newer_weights and setting is None and self.frontier == frontier:
            return None
        return (self.version if newer_weights else version,
                self.state if newer_weights else [], setting, self.frontier)

    def ready(self) -> bool:
        return True


class PolicyFeed:
    """One rollout's view of the board, for the generator that runs it: `pending` asks
    (at most every `poll_s` seconds) whether a newer version or horizon was posted, `take`
    fetches it (the weights from the object store); `admits` and `closed` read the frontier
    the last answer carried. Works on a Ray actor handle or on a plain PolicyBoard (tests)."""

    def __init__(self, board: Any, *, version: int, horizon_version: int,
                 poll_s: float = 0.0) -> None:
        self.board = board
        self.version, self.horizon_version = version, horizon_version
        self.poll_s = poll_s
        self.frontier: int | None = None  # unknown until the first answer: no bound
        self._asked = float("-inf")
        self._news: News | None = None

    def pending(self) -> bool:
        """Whether newer weights or a newer horizon wait to be taken (a new frontier alone
        is kept at once: it needs no reload)."""
        import time

        if self._news is None and time.monotonic() - self._asked >= self.poll_s:
            self._asked = time.monotonic()
            news = _remote(self.board.news, self.version, self.horizon_version, self.frontier)
            if news is not None:
                self.frontier = news[3]
                if news[0] > self.version or news[2] is not None:
                    self._news = news
        return self._news is not None

    def admits(self, step: int | None) -> bool:
        """Whether an episode of `step` may start (None: a task outside any step's count)."""
        return step is None or self.frontier is None or step <= self.frontier

    @property
    def closed(self) -> bool:
        return self.frontier == CLOSED

    def take(self) -> tuple[int, Any | None, HorizonSetting | None]:
        """(version, its state dict or None when only the horizon is new, setting or None);
        call after `pending` said so."""
        if self._news is None:
            raise RuntimeError("PolicyFeed.take without pending news")
        version, state, setting, _ = self._news
        self._news = None
        self.version = version
        if setting is not None:
            self.horizon_version = setting.version
        return version, _resolve(state[0]) if state else None, setting


def _remote(fn: Any, *args: Any) -> Any:
    """Call an actor method (and wait for it) or a plain method alike."""
    if hasattr(fn, "remote"):
        import ray

        return ray.get(fn.remote(*args))
    return fn(*args)


def _resolve(ref: Any) -> Any:
    """An ObjectRef's value (fetched from the object store), or the value itself."""
    import ray

    return ray.get(ref) if isinstance(ref, ray.ObjectRef) else ref
