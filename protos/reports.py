"""What a generator's rollout reports back to the driver (typed, frozen), beside the
trajectories themselves, which travel to the learner over gRPC (protos/trajectory.py).

The driver (training, async training and evaluation alike) reads these fields, so they are a
contract between the roles like the trajectory, not a dict whose keys each side spells.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RolloutSeconds:
    """Where a rollout's wall time went, in seconds: the engine's generate calls, the env
    steps (and resets) the rollout waited for, and pushing finished trajectories to the
    learner. With episodes that run independently, env calls also run while the engine
    generates for other episodes: `overlap` is that env time, hidden behind generation (not
    counted in `env`)."""

    generate: float = 0.0
    env: float = 0.0
    transport: float = 0.0
    overlap: float = 0.0

    def __add__(self, other: RolloutSeconds) -> RolloutSeconds:
        return RolloutSeconds(self.generate + other.generate, self.env + other.env,
                              self.transport + other.transport, self.overlap + other.overlap)


@dataclass(frozen=True, slots=True)
class RolloutReport:
    """One `GeneratorActor.rollout` call: the ids of the trajectories it pushed (the ledger's
    "generated"), the policy and horizon it ran under, its timing, token and step counts, and
    the state of its env pools afterwards."""

    trajectory_ids: tuple[str, ...]
    policy_version: int
    horizon: int
    seconds: RolloutSeconds = RolloutSeconds()
    generated_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, served by the engine's prefix cache
    env_steps: int = 0
    env_restarts: int = 0  # env actors this generator's pools have restarted, in total
    # Per env label: the pool's counters (steps, calls, call_seconds, restarts, errors, ...).
    env_stats: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    rss_bytes: int = 0  # the generator process's resident memory after the rollout
    # Partial rollouts: the version the generator held at the end (above policy_version when
    # it took new weights between turns) and how many times it loaded weights mid-rollout.
    end_policy_version: int = -1
    weight_loads: int = 0


def all_ids(reports: Sequence[RolloutReport]) -> list[str]:
    """Every trajectory id the reports name, in order."""
    return [tid for r in reports for tid in r.trajectory_ids]
