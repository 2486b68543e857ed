"""Turn-level estimators: each turn of an episode gets its own advantage.

`gigpo` (Group-in-Group Policy Optimization, Feng et al. 2025): the episode-level GRPO
advantage of the whole episode plus `step_adv_weight` x a step-level advantage: turns of one
task group taken in the same state (equal state keys: an anchor state) form a step-level group
and their discounted returns G_k = r_k + turn_gamma * G_{k+1} are normalised within it. A turn
in no anchor group gets the episode level alone. With one-turn episodes every anchor group is
the task group's opening state and the returns are the rewards, so the step level repeats the
episode level: `gigpo` then equals GRPO up to the factor (1 + step_adv_weight).

`turn_rloo`: A_k = G_k - mean of G_0 over the group's other episodes. The baseline depends
only on other episodes, so it is unbiased for every turn (a baseline that included the
episode's own return, as a naive per-turn GRPO does, would correlate with its actions).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from horizonrl.learner.batch import group_index, valid_mask
from horizonrl.learner.credit.anchors import (
    anchor_groups,
    discounted_returns,
    episode_level,
    leave_one_out_baseline,
)
from horizonrl.learner.credit.base import (
    Credit,
    Estimator,
    episode_stats,
    register,
    spread_over_turns,
)
from horizonrl.protos.trajectory import Trajectory

_TINY = 1e-9


def turn_rewards(t: Trajectory) -> np.ndarray:
    """One reward per turn: the env's, plus what `learner.overlong=penalty` took off the
    episode on its last turn (as `learner.batch.token_rewards` places it). An episode whose
    rewards do not match its turns (an infrastructure failure) has its reward on the last."""
    n = max(t.num_turns, 1)
    if len(t.rewards) == n:
        out = np.asarray(t.rewards, dtype=np.float64)
        out[-1] += t.reward - t.info.get("env_reward", t.reward)
        return out
    out = np.zeros(n, dtype=np.float64)
    out[-1] = t.reward
    return out


class _TurnLevel(Estimator):
    """Shared plumbing: per-turn advantages of the valid episodes -> kept episodes (groups
    where some turn's advantage is not 0, when skipping flat groups) and token arrays."""

    def turn_values(self, trajs: Sequence[Trajectory], groups: np.ndarray,
                    stats: dict[str, float]) -> list[np.ndarray]:
        raise NotImplementedError

    def signal_groups(self, trajs: Sequence[Trajectory]) -> list[str]:
        """Groups where some turn's advantage is not 0: a group of successes whose paths
        differ counts, though its rewards are equal."""
        flat = self.cfg.model_copy(update={"skip_zero_variance_groups": True})
        keep = type(self)(flat).assign(trajs).keep
        return list(dict.fromkeys(trajs[i].group_id for i in keep))

    def assign(self, trajs: Sequence[Trajectory]) -> Credit:
        valid = valid_mask(trajs)
        idx = [i for i in range(len(trajs)) if valid[i]]
        stats: dict[str, float] = {}
        per_turn = [np.zeros(0)] * len(trajs)
        if idx:
            sub = [trajs[i] for i in idx]
            for i, v in zip(idx, self.turn_values(sub, group_index(sub), stats)):
                per_turn[i] = v
        keep = idx
        if self.cfg.skip_zero_variance_groups:
            # A group is flat when every turn of every episode has advantage 0.
            signal = {trajs[i].group_id for i in idx
                      if np.abs(per_turn[i]).max(initial=0.0) > _TINY}
            keep = [i for i in idx if trajs[i].group_id in signal]
        return Credit(keep=keep,
                      # Turns that cannot be located: the first turn's value on every token
                      # (gigpo: the episode level, as turn 0 joins no anchor group).
                      advantages=[spread_over_turns(trajs[i], per_turn[i],
                                                    float(per_turn[i][0]) if len(per_turn[i])
                                                    else 0.0)
                                  for i in keep],
                      turn_advantages=[per_turn[i] for i in keep], stats=stats)


@register("gigpo")
class GiGPO(_TurnLevel):
    """Episode-level GRPO plus step-level advantages from anchor-state groups."""

    def turn_values(self, trajs: Sequence[Trajectory], groups: np.ndarray,
                    stats: dict[str, float]) -> list[np.ndarray]:
        by_std = self.cfg.norm_adv_by_std
        outcome = episode_level(groups, [t.reward for t in trajs], by_std=by_std)
        returns = [discounted_returns(turn_rewards(t), self.cfg.turn_gamma) for t in trajs]
        keys = [list(t.info.get("state_keys") or ()) for t in trajs]
        anchors = anchor_groups(groups, keys, returns, by_std=by_std)
        step = np.concatenate(anchors.advantage) if anchors.advantage else np.zeros(0)
        sizes = [len(m) for m in anchors.groups]
        stats.update(anchor_groups=float(len(sizes)),
                     anchor_group_size_mean=float(np.mean(sizes)) if sizes else 0.0,
                     anchor_group_size_max=float(max(sizes, default=0)),
                     step_adv_nonzero_share=float((np.abs(step) > _TINY).mean())
                     if len(step) else 0.0,
                     step_adv_abs_mean=float(np.abs(step).mean()) if len(step) else 0.0,
                     step_adv_std=float(step.std()) if len(step) else 0.0)
        stats.update(episode_stats(outcome))
        w = self.cfg.step_adv_weight
        return [outcome[e] + w * anchors.advantage[e] for e in range(len(trajs))]


@register("turn_rloo")
class TurnRLOO(_TurnLevel):
    """Discounted return of each turn minus the leave-one-out mean return of the group."""

    def turn_values(self, trajs: Sequence[Trajectory], groups: np.ndarray,
                    stats: dict[str, float]) -> list[np.ndarray]:
        returns = [discounted_returns(turn_rewards(t), self.cfg.turn_gamma) for t in trajs]
        base = leave_one_out_baseline(groups, [r[0] if len(r) else 0.0 for r in returns])
        return [np.zeros_like(r) if np.isnan(b) else r - b for r, b in zip(returns, base)]
