"""The generators of a run and the one policy version.

A `Fleet` owns the generator actors: it spawns them, replaces one that died (same index, the
newest weights, registered with the curriculum), syncs weights to them, and keeps the policy
version: the run's (`version`, advanced once per update that changed the weights) and the one
each generator holds (`held`). Nothing else changes a version; the phases (cluster/train/)
ask the fleet to advance it and to get the weights out, the driver reads it.
"""

from __future__ import annotations

import time
from typing import Any

from horizonrl.actors.generator import GeneratorActor
from horizonrl.cluster.config import RunConfig
from horizonrl.cluster.ops.plan import placement_plan, wait_started
from horizonrl.envpool.pool import EnvPool
from horizonrl.learner.weights import SyncStats, WeightSync, make_weight_sync


class GeneratorLost(RuntimeError):
    """A generator died and no node could host its replacement (its node was lost and no other
    offers the resources): the run saves a checkpoint and stops."""


class Fleet:
    """`cfg.generator.num_generators` generator actors, started at `version` (a resume's) and
    registered with `curriculum` by `wait_ready()`; `connect(learner)` attaches the weight sync.
    The constructor only spawns them, so the caller can start other actors (the learner ranks)
    while their engines load."""

    def __init__(self, cfg: RunConfig, *, model_path: str, ingest: tuple[str, str | None],
                 curriculum: Any, version: int = 0) -> None:
        self.cfg, self.model_path, self.curriculum = cfg, model_path, curriculum
        self.ingest_address, self.ingest_token = ingest
        self.version = version
        self.restarts = 0
        self.generators = [self._spawn(i) for i in range(cfg.generator.num_generators)]
        self.held = [version] * len(self.generators)  # the version each generator holds
        self.weights: WeightSync | None = None

    def wait_ready(self) -> None:
        """Every generator running (DoesNotFit past generator.restart_timeout_s) and
        registered with the curriculum."""
        import ray

        wait_started({f"generator gen{i}": g for i, g in enumerate(self.generators)},
                     timeout_s=self.cfg.generator.restart_timeout_s,
                     needs=placement_plan(self.cfg)[0][2], knob="generator.restart_timeout_s")
        ray.get([self.curriculum.register.remote(f"gen{i}", g)
                 for i, g in enumerate(self.generators)])

    def connect(self, learner: Any) -> None:
        """Weights go from `learner` to the generators from now on (the strategy the config
        names; it holds this fleet's own list, so a replaced generator is in it)."""
        self.weights = make_weight_sync(self.cfg.learner, learner, self.generators)

    def _spawn(self, i: int) -> Any:
        import ray

        g = self.cfg.generator
        remote = ray.remote(num_cpus=g.num_cpus, num_gpus=g.num_gpus,
                            resources=g.resources or None)(GeneratorActor)
        return remote.remote(name=f"gen{i}", cfg=g, model_path=self.model_path,
                             env_pools=[EnvPool(e, name=f"gen{i}-{e.key}", index=i,
                                                agent=self.cfg.agent.callable)
                                        for e in self.cfg.envs],
                             agent=self.cfg.agent if self.cfg.agent.callable else None,
                             ingest_address=self.ingest_address,
                             ingest_token=self.ingest_token,
                             ingest_tls_ca=self.cfg.learner.ingest.tls_ca_path,
                             seed=self.cfg.seed * 1000 + i, policy_version=self.version)

    # -- the policy version ---------------------------------------------------------------------
    def advance(self) -> int:
        """The learner changed the weights: the run's version + 1 (generators get it by `push`,
        `hand_off` or the policy board)."""
        self.version += 1
        return self.version

    def push(self) -> SyncStats:
        """Every generator reloads the run's version now (sync mode's lock-step)."""
        stats = self.weights.push(self.version)
        self.held = [self.version] * len(self.generators)
        return stats

    def hand_off(self, i: int) -> Any | None:
        """Generator i gets the run's version before its next rollout, if it lags (async
        mode): the ObjectRef of its reload seconds, or None when it is current."""
        if self.held[i] >= self.version:
            return None
        self.held[i] = self.version
        return self.weights.hand_off(i, self.version)

    def loaded(self, i: int, version: int) -> None:
        """Generator i reported holding `version` (partial rollouts load from the board)."""
        self.held[i] = max(self.held[i], version)

    def versions(self) -> list[int]:
        """What each generator says it holds (for checks; `held` is the fleet's own record)."""
        import ray

        return ray.get([g.get_policy_version.remote() for g in self.generators])

    # -- a generator lost -----------------------------------------------------------------------
    def restart(self, i: int) -> None:
        """Replace dead generator i: the run's version, then the curriculum's current horizon."""
        import ray

        limit = self.cfg.generator.restart_timeout_s
        deadline = time.monotonic() + limit
        while (left := deadline - time.monotonic()) > 0:
            new = self._spawn(i)
            try:
                ray.get(new.ready.remote(), timeout=left)
                break
            except ray.exceptions.GetTimeoutError:
                ray.kill(new)  # pending for a node that is gone: never let it start later
            except ray.exceptions.RayActorError:
                # Placed on a node that was dying but not yet declared dead: try again.
                time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
        else:
            raise GeneratorLost(
                f"generator gen{i} died and its replacement was not running within {limit:g}s "
                f"(generator.restart_timeout_s): no node has room for it (free now: "
                f"{ray.available_resources()}; each generator needs "
                f"{placement_plan(self.cfg)[0][2]}). A lost node takes its resources with it; "
                "bring nodes back, then continue with `horizonrl train --config ... --resume "
                "auto`") from None
        self.generators[i] = new  # the weight sync holds this same list
        self.weights.resync(i, self.version)
        self.held[i] = self.version
        ray.get(self.curriculum.register.remote(f"gen{i}", new))
        self.restarts += 1

    def close(self) -> None:
        """Leave a broadcast group (before its learner rank goes); the actors are the
        driver's to kill with the rest."""
        if self.weights is not None:
            self.weights.close()
