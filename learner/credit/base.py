"""The contract of an advantage estimator and the registry `learner.algorithm` names.

One object per algorithm owns three decisions the learner and the ledger must agree on: the
advantage of every trained token, which episodes an update learns from, and why the others are
not learned from (the run ledger's reasons). `LearnerGroup` asks it and nothing else, so a new
estimator is one module with a class under `@register("name")`, imported in `credit/__init__`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from horizonrl.learner.batch import model_turn_ranges, valid_mask
from horizonrl.learner.config import LearnerConfig
from horizonrl.protos.trajectory import Trajectory


@dataclass(frozen=True)
class Credit:
    """An estimator's verdict on one update's trajectories.

    `keep`: indices of the episodes to learn from, in order. `advantages[i]` belongs to
    `keep[i]`: one number for every token of the episode, or an array with one value per
    `response_ids` token (turn-level estimators). `turn_advantages[i]`: the per-turn values
    behind such an array (None for episode-level ones), used to leave rejected commands out of
    positive turns only. `stats`: the estimator's metrics for this update.
    """

    keep: list[int]
    advantages: list[float | np.ndarray]
    turn_advantages: list[np.ndarray | None] = field(default_factory=list)
    stats: dict[str, float] = field(default_factory=dict)


class Estimator:
    """Base class: subclasses implement `assign`; class attributes say what they need."""

    name: ClassVar[str] = ""
    needs_critic: ClassVar[bool] = False  # PPO: the ranks run a value model and GAE
    whole_episodes: ClassVar[bool] = False  # refuses window contexts (one row per turn)
    not_kept: ClassVar[str] = "zero_variance"  # the ledger's reason for valid, unkept episodes
    # Added to the config error when whole_episodes refuses window mode.
    window_hint: ClassVar[str] = ""

    def __init__(self, cfg: LearnerConfig) -> None:
        self.cfg = cfg

    def assign(self, trajs: Sequence[Trajectory]) -> Credit:
        raise NotImplementedError

    def min_episodes(self) -> int:
        """The fewest kept episodes an update needs: one per rank and minibatch, since
        minibatches are made of whole episodes (`learner.batch.shard_episodes`)."""
        return self.cfg.world_size * self.cfg.minibatches

    def token_advantages(self, kept: Sequence[Trajectory], batch: dict[str, np.ndarray]
                         ) -> np.ndarray | None:
        """Advantages computed on the padded batch instead (REINFORCE++'s batch-normalised
        returns); None: `assign`'s stand."""
        return None

    def signal_groups(self, trajs: Sequence[Trajectory]) -> list[str]:
        """Task groups with something to learn from, in order (dynamic sampling fills a step
        with them): by default those whose valid episodes' rewards differ."""
        return groups_with_signal(trajs)

    def fates(self, trajs: Sequence[Trajectory]) -> dict[str, list[int]]:
        """What an update does with each episode, for the run's ledger: "trained", or why not
        ("env_error", "timeout", "generator_lost", "overlong", `not_kept`, "update_skipped").
        Indices into `trajs`."""
        out: dict[str, list[int]] = {}
        valid = valid_mask(trajs)
        for i, t in enumerate(trajs):
            if not valid[i]:
                reason = "generator_lost" if t.failure.value == "generator_error" else \
                    "overlong" if t.failure.value == "none" else t.failure.value
                out.setdefault(reason, []).append(i)
        keep = self.assign(trajs).keep
        kept = set(keep)
        rest = [i for i in range(len(trajs)) if valid[i] and i not in kept]
        if rest:
            out[self.not_kept] = rest
        if keep:
            out["update_skipped" if len(keep) < self.min_episodes() else "trained"] = keep
        return out


_REGISTRY: dict[str, type[Estimator]] = {}


def register(name: str) -> Callable[[type[Estimator]], type[Estimator]]:
    """Class decorator: make `learner.algorithm=name` build this estimator."""
    def add(cls: type[Estimator]) -> type[Estimator]:
        if name in _REGISTRY:
            raise ValueError(f"estimator {name!r} is registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return add


def estimator_class(name: str) -> type[Estimator]:
    if name not in _REGISTRY:
        raise ValueError(f"unknown learner.algorithm {name!r}; use one of "
                         f"{', '.join(repr(n) for n in sorted(_REGISTRY))}")
    return _REGISTRY[name]


def estimator_names() -> list[str]:
    return sorted(_REGISTRY)


def make_estimator(cfg: LearnerConfig) -> Estimator:
    return estimator_class(cfg.algorithm)(cfg)


def groups_with_signal(trajs: Sequence[Trajectory], scores: Sequence[Any] | None = None
                       ) -> list[str]:
    """Group ids whose valid episodes do not all score the same (by default their rewards;
    turn-level estimators pass a per-episode summary of their advantages), in order."""
    seen: dict[str, set[Any]] = {}
    for i, (t, ok) in enumerate(zip(trajs, valid_mask(trajs))):
        if ok:
            value = t.reward if scores is None else scores[i]
            seen.setdefault(t.group_id, set()).add(round(float(value), 9))
    return [g for g, r in seen.items() if len(r) > 1]


def episode_stats(values: Sequence[float]) -> dict[str, float]:
    """Episode-level advantage statistics over the kept episodes (one value each)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return {}
    return {"episode_adv_abs_mean": float(np.abs(v).mean()), "episode_adv_std": float(v.std())}


def spread_over_turns(t: Trajectory, per_turn: np.ndarray, fallback: float) -> np.ndarray | float:
    """Per-turn advantages -> one per `response_ids` token (each turn's sampled tokens get
    their turn's value; observation tokens carry no loss anyway). An episode whose turns cannot
    be located (`model_turn_ranges` is None) gets `fallback` on every token."""
    ranges = model_turn_ranges(t)
    if ranges is None or len(ranges) != len(per_turn):
        return fallback
    out = np.zeros(len(t.response_ids), dtype=np.float32)
    for (start, end), a in zip(ranges, per_turn):
        out[start:end] = a
    return out
