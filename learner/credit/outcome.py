"""The episode-level estimators: one outcome per episode, the same advantage on every token
(GRPO, RLOO), or token-level ones computed on the padded batch (REINFORCE++) or by the ranks'
critic (PPO), and rejection sampling's choice of successes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from horizonrl.learner import algorithms as alg
from horizonrl.learner.batch import group_index, valid_mask
from horizonrl.learner.credit.base import (
    Credit,
    Estimator,
    episode_stats,
    groups_with_signal,
    register,
)
from horizonrl.protos.trajectory import Trajectory


class _Outcome(Estimator):
    """Keeps valid episodes; with `skip_zero_variance_groups`, only groups whose rewards differ
    when `drops_flat_groups` (their advantage would be 0 everywhere)."""

    drops_flat_groups = True
    per_episode = True  # the advantages are the episodes' own (not computed on the batch)

    def episode_advantages(self, trajs: Sequence[Trajectory]) -> np.ndarray:
        return np.zeros(len(trajs), dtype=np.float32)

    def assign(self, trajs: Sequence[Trajectory]) -> Credit:
        adv = self.episode_advantages(trajs)
        valid = valid_mask(trajs)
        keep = [i for i in range(len(trajs)) if valid[i]]
        if self.cfg.skip_zero_variance_groups and self.drops_flat_groups:
            signal = set(groups_with_signal(trajs))
            keep = [i for i in keep if trajs[i].group_id in signal]
        return Credit(keep=keep, advantages=[float(adv[i]) for i in keep],
                      turn_advantages=[None] * len(keep),
                      stats=episode_stats([adv[i] for i in keep]) if self.per_episode else {})


def _tensors(trajs: Sequence[Trajectory]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.tensor([t.reward for t in trajs], dtype=torch.float32),
            torch.from_numpy(group_index(trajs)), torch.from_numpy(valid_mask(trajs)))


@register("grpo")
class GRPO(_Outcome):
    """(r - mean(r_group)) / (std(r_group) + eps) per episode; Dr.GRPO without the std."""

    def episode_advantages(self, trajs: Sequence[Trajectory]) -> np.ndarray:
        return alg.grpo_advantages(*_tensors(trajs), norm_by_std=self.cfg.norm_adv_by_std).numpy()


@register("rloo")
class RLOO(_Outcome):
    """r - mean of the other episodes of the group."""

    def episode_advantages(self, trajs: Sequence[Trajectory]) -> np.ndarray:
        return alg.rloo_advantages(*_tensors(trajs)).numpy()


@register("reinforce_pp")
class ReinforcePP(_Outcome):
    """Batch-normalised discounted returns per token, on the padded batch; with the group
    baseline a flat group's returns cancel, so it is dropped like GRPO's."""

    per_episode = False

    @property
    def drops_flat_groups(self) -> bool:  # type: ignore[override]
        return self.cfg.reinforce_pp_baseline

    def token_advantages(self, kept: Sequence[Trajectory], batch: dict[str, np.ndarray]
                         ) -> np.ndarray:
        return alg.reinforce_pp_advantages(
            torch.from_numpy(batch["token_rewards"]), torch.from_numpy(batch["loss_mask"]),
            gamma=self.cfg.gamma, baseline="group" if self.cfg.reinforce_pp_baseline else None,
            groups=torch.from_numpy(group_index(kept))).numpy()


@register("ppo")
class PPO(_Outcome):
    """GAE on the critic's values, computed by the ranks (`LearnerWorker._ppo_targets`): per
    model token over a whole-episode row, per turn across window mode's turn rows; learns from
    every valid episode, flat groups included."""

    drops_flat_groups = False
    per_episode = False
    needs_critic = True  # window rows: one value per turn, GAE across them (turn_gae_targets)


@register("rejection_sampling")
class RejectionSampling(Estimator):
    """SFT on each batch's successes, one per distinct response in a group."""

    not_kept = "not_selected"
    whole_episodes = True
    window_hint = "it fine-tunes on whole episodes, longer than the context; use mode=full"

    def assign(self, trajs: Sequence[Trajectory]) -> Credit:
        from horizonrl.learner.auxiliary import rejection_sampling_indices

        keep = rejection_sampling_indices(trajs)
        return Credit(keep=keep, advantages=[1.0] * len(keep), turn_advantages=[None] * len(keep))

    def min_episodes(self) -> int:
        return self.cfg.world_size  # one SFT step: one example per rank at least
