"""Evaluation metrics for `horizonrl eval`: one record per episode in, nested summaries out.

Everything here is a small pure function over `EpisodeRecord`s so each number in a report can be
checked by hand. Failed episodes (`failure != ""`: env errors, timeouts) are excluded from every
statistic, because an infrastructure fault says nothing about the policy, and are counted apart.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

TaskKey = tuple[str, str, str, int]
"""(model, env, task_id, max_turns): the samples of one task that pass@k draws from."""


@dataclass(frozen=True, slots=True)
class EpisodeRecord:
    """One evaluated episode, as the eval runner writes it."""

    model: str
    """Label of the evaluated model, e.g. "base" or "trained"."""
    env: str
    """Registered env name."""
    task_id: str
    """The task the episode played (the same id for every sample of a task)."""
    seed: int
    """The seed the env was reset with."""
    sample: int
    """Index of this sample among the task's samples (0-based)."""
    max_turns: int
    """The interaction budget the episode ran under."""
    success: bool
    """Whether the env reported the goal achieved."""
    reward: float
    """Episode return."""
    num_turns: int
    """Turns taken (one action each)."""
    actions: tuple[str, ...]
    """The parsed action of every turn, in order."""
    invalid_actions: int
    """Turns the env flagged `invalid_action`."""
    failure: str
    """"" for a normal episode, else why it failed ("env_error", "timeout", ...)."""
    goal_turn: int | None
    """The turn after which the goal was reachable/achieved when the env can tell, else None."""

    def __post_init__(self) -> None:
        # Inconsistent records would silently skew rates; reject them where they are made.
        if self.num_turns < 0 or len(self.actions) != self.num_turns:
            raise ValueError(f"num_turns={self.num_turns} but {len(self.actions)} actions")
        if not 0 <= self.invalid_actions <= self.num_turns:
            raise ValueError(f"invalid_actions={self.invalid_actions} not in [0, num_turns]")
        if self.goal_turn is not None and not 0 <= self.goal_turn <= self.num_turns:
            raise ValueError(f"goal_turn={self.goal_turn} not in [0, {self.num_turns}]")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EpisodeRecord:
        """Rebuild a record from its JSON form (`dataclasses.asdict` output)."""
        return cls(**{**d, "actions": tuple(d["actions"])})


def valid(records: Iterable[EpisodeRecord]) -> list[EpisodeRecord]:
    """The records every statistic uses: those with `failure == ""`."""
    return [r for r in records if not r.failure]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c successes (Chen et al. 2021).

    pass@k = 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k / i),
    the product form avoiding huge binomials; it is 1 when n - c < k (every k-subset has a success).
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def task_counts(records: Iterable[EpisodeRecord]) -> dict[TaskKey, tuple[int, int]]:
    """(n, c) per task: valid samples and successes grouped by (model, env, task_id, max_turns)."""
    counts: dict[TaskKey, list[int]] = defaultdict(lambda: [0, 0])
    for r in valid(records):
        nc = counts[(r.model, r.env, r.task_id, r.max_turns)]
        nc[0] += 1
        nc[1] += int(r.success)
    return {key: (n, c) for key, (n, c) in sorted(counts.items())}


def pass_at_k_tasks(records: Iterable[EpisodeRecord], k: int) -> float:
    """Mean over tasks of pass_at_k(n_task, c_task, k).

    A task whose failed episodes left it fewer than k valid samples is skipped (its estimate is
    undefined); ValueError if no task has k valid samples.
    """
    scores = [pass_at_k(n, c, k) for n, c in task_counts(records).values() if n >= k]
    if not scores:
        raise ValueError(f"no task has {k} valid samples")
    return sum(scores) / len(scores)


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def accuracy(records: Iterable[EpisodeRecord]) -> float | None:
    """Mean success over valid samples: #successes / #episodes (None without episodes)."""
    return _mean([float(r.success) for r in valid(records)])


def mean_turns(records: Iterable[EpisodeRecord]) -> float | None:
    """Mean num_turns over valid episodes."""
    return _mean([r.num_turns for r in valid(records)])


def repeated_action_rate(records: Iterable[EpisodeRecord]) -> float | None:
    """#{turns t >= 2 with action_t == action_{t-1}, same episode} / #turns, over valid episodes.

    A policy stuck in a loop repeats itself; the first turn of an episode can never repeat.
    """
    eps = valid(records)
    turns = sum(len(r.actions) for r in eps)
    repeats = sum(a == b for r in eps for a, b in zip(r.actions, r.actions[1:]))
    return repeats / turns if turns else None


def invalid_action_rate(records: Iterable[EpisodeRecord]) -> float | None:
    """sum(invalid_actions) / sum(num_turns) over valid episodes."""
    eps = valid(records)
    turns = sum(r.num_turns for r in eps)
    return sum(r.invalid_actions for r in eps) / turns if turns else None


def over_interaction(records: Iterable[EpisodeRecord]) -> tuple[float | None, float | None, int]:
    """(mean turns after the goal, share of episodes with any, episodes with a known goal_turn).

    Over valid episodes whose goal_turn is known: mean of (num_turns - goal_turn), and the share
    with num_turns > goal_turn; the agent kept acting although it had already won.
    """
    extra = [r.num_turns - r.goal_turn for r in valid(records) if r.goal_turn is not None]
    share = _mean([float(e > 0) for e in extra])
    return _mean(extra), share, len(extra)


def failures(records: Iterable[EpisodeRecord]) -> dict[str, int]:
    """Failed episodes per failure kind (sorted by kind)."""
    return dict(sorted(Counter(r.failure for r in records if r.failure).items()))


def _pass_at_ks(records: list[EpisodeRecord], ks: Sequence[int]) -> dict[str, dict[str, Any]]:
    """pass@k and how many tasks it averages over, for each k some task has samples for."""
    sizes = [n for n, _ in task_counts(records).values()]
    return {str(k): {"value": pass_at_k_tasks(records, k), "tasks": sum(n >= k for n in sizes)}
            for k in sorted(set(ks)) if k <= max(sizes, default=0)}


def cell_metrics(records: list[EpisodeRecord], ks: Sequence[int]) -> dict[str, Any]:
    """Every metric for one (model, env, max_turns) cell; None where undefined."""
    over_turns, over_share, goal_known = over_interaction(records)
    fails = failures(records)
    return {
        "episodes": len(valid(records)),
        "tasks": len({r.task_id for r in records}),
        "failed_episodes": sum(fails.values()),
        "failures": fails,
        "accuracy": accuracy(records),
        "mean_reward": _mean([r.reward for r in valid(records)]),
        "mean_turns": mean_turns(records),
        "repeated_action_rate": repeated_action_rate(records),
        "invalid_action_rate": invalid_action_rate(records),
        "over_interaction_turns": over_turns,
        "over_interaction_share": over_share,
        "goal_known_episodes": goal_known,
        "pass_at_k": _pass_at_ks(records, ks),
    }


def summarise(records: Iterable[EpisodeRecord], ks: Sequence[int]) -> dict[str, Any]:
    """results[model][env][str(max_turns)] = cell_metrics(...), JSON-serialisable.

    Models and envs are sorted by name and max_turns numerically, so the same records in any
    order give the same dict (and the same JSON). pass@k appears for each k in `ks` up to the
    largest number of valid samples a task has, averaged over the tasks with at least k.
    """
    if any(k < 1 for k in ks):
        raise ValueError(f"every k must be >= 1, got {list(ks)}")
    cells: dict[tuple[str, str, int], list[EpisodeRecord]] = defaultdict(list)
    for r in records:
        cells[(r.model, r.env, r.max_turns)].append(r)
    results: dict[str, Any] = {}
    for (model, env, max_turns), group in sorted(cells.items()):
        group.sort(key=lambda r: (r.task_id, r.sample, r.seed))
        per_env = results.setdefault(model, {}).setdefault(env, {})
        per_env[str(max_turns)] = cell_metrics(group, ks)
    return results
