"""Advantage estimators, one per `learner.algorithm` (see credit.base for the contract).

Importing the package registers the built-in ones: grpo, rloo, reinforce_pp, ppo,
rejection_sampling (credit.outcome) and the turn-level gigpo and turn_rloo (credit.turns).
"""

from horizonrl.learner.credit import outcome, turns  # noqa: F401  (registration)
from horizonrl.learner.credit.base import (
    Credit,
    Estimator,
    estimator_class,
    estimator_names,
    groups_with_signal,
    make_estimator,
    register,
)

__all__ = ["Credit", "Estimator", "estimator_class", "estimator_names", "groups_with_signal",
           "make_estimator", "register"]
