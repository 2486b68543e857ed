"""Turn-level credit math on numpy arrays (checkable by hand): discounted returns per turn, anchor-
state groups and GiGPO's two-level advantage.

An episode is a list of turns; turn k has the reward `r_k` the env gave for its action and the
key `s_k` of the state the action was taken in (`Trajectory.info["state_keys"]`, from
`actors.rollout.state_key`). Episodes of one task group start from the same state, so their
turns revisit states: turns of one group with equal keys form an anchor group, and within it
the turns' discounted returns compare actions taken in the same state (GiGPO, Feng et al. 2025).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def discounted_returns(rewards: Sequence[float], gamma: float) -> np.ndarray:
    """G_k = r_k + gamma * G_{k+1} over the turns of one episode (G after the last turn is 0)."""
    out = np.zeros(len(rewards), dtype=np.float64)
    running = 0.0
    for k in range(len(rewards) - 1, -1, -1):
        running = float(rewards[k]) + gamma * running
        out[k] = running
    return out


@dataclass(frozen=True)
class Anchors:
    """The step-level groups of one update. `groups` lists, per anchor group of at least two
    turns, its members as (episode, turn) pairs; `advantage[e][k]` is turn k's step-level
    advantage (0 for a turn in no such group)."""

    groups: list[list[tuple[int, int]]]
    advantage: list[np.ndarray]


def anchor_groups(task_groups: Sequence[int], state_keys: Sequence[Sequence[str]],
                  returns: Sequence[np.ndarray], *, by_std: bool,
                  from_turn: int = 1) -> Anchors:
    """Group turns by (task group, state key) and normalise their returns within each group.

    A group needs two turns at least; a state that two turns of the same episode reached (a
    loop) counts both. Different task groups are never mixed, even with equal keys: the same
    view in another task is another state (another goal, another layout). Turns before
    `from_turn` join no group: every episode's turn 0 is taken in the task's opening state,
    whose group is the task group itself, which the episode level compares already (counted
    twice, a one-turn episode would get twice GRPO's advantage); a later return to the
    opening state does join its group."""
    members: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for e, (g, keys) in enumerate(zip(task_groups, state_keys)):
        for k, key in enumerate(keys[:len(returns[e])]):
            if k >= from_turn:
                members.setdefault((int(g), key), []).append((e, k))
    advantage = [np.zeros(len(r), dtype=np.float64) for r in returns]
    groups = [m for m in members.values() if len(m) >= 2]
    flat = [(e, k) for m in groups for e, k in m]
    if flat:
        # Each anchor group is a GRPO group of turns: the same normalisation, one call.
        adv = episode_level(np.repeat(np.arange(len(groups)), [len(m) for m in groups]),
                            [returns[e][k] for e, k in flat], by_std=by_std)
        for (e, k), a in zip(flat, adv):
            advantage[e][k] = a
    return Anchors(groups=groups, advantage=advantage)


def episode_level(task_groups: Sequence[int], outcomes: Sequence[float], *,
                  by_std: bool) -> np.ndarray:
    """GRPO's advantage of each member within its group (0 in a group of one):
    `learner.algorithms.grpo_advantages` itself."""
    import torch

    from horizonrl.learner.algorithms import grpo_advantages

    n = len(outcomes)
    return grpo_advantages(torch.tensor(list(outcomes), dtype=torch.float32),
                           torch.as_tensor(np.asarray(task_groups, dtype=np.int64)),
                           torch.ones(n, dtype=torch.bool), norm_by_std=by_std
                           ).double().numpy()


def leave_one_out_baseline(task_groups: Sequence[int], first_returns: Sequence[float]
                           ) -> np.ndarray:
    """Each episode's baseline: the mean G_0 of the other episodes of its task group (RLOO);
    NaN in a group of one (no baseline, no advantage)."""
    g = np.asarray(task_groups)
    r = np.asarray(first_returns, dtype=np.float64)
    out = np.full(len(r), np.nan)
    for gid in np.unique(g):
        idx = np.flatnonzero(g == gid)
        if len(idx) >= 2:
            out[idx] = (r[idx].sum() - r[idx]) / (len(idx) - 1)
    return out


def turn_gae(rewards: Sequence[float], values: Sequence[float], *, gamma: float,
             lam: float) -> tuple[np.ndarray, np.ndarray]:
    """GAE over the turns of one episode with one value per turn (PPO in window mode):
    delta_k = r_k + gamma * V_{k+1} - V_k (V after the last turn is 0),
    A_k = delta_k + gamma * lam * A_{k+1}; returns (advantages, returns = A + V)."""
    v = np.asarray(values, dtype=np.float64)
    adv = np.zeros(len(v), dtype=np.float64)
    next_v = next_a = 0.0
    for k in range(len(v) - 1, -1, -1):
        delta = float(rewards[k]) + gamma * next_v - v[k]
        next_a = delta + gamma * lam * next_a
        adv[k], next_v = next_a, v[k]
    return adv, adv + v
