"""ScalingInter-RL: the horizon schedule and the actor that owns it.

`horizon_at` is a pure function of the number of finished training steps, so a resumed run
computes the same stage as an uninterrupted one (AgentGym-RL's resume skipped most of stage 2).
The adaptive schedule (the paper's future work) raises the horizon from reward statistics.
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass, field
from statistics import fmean
from typing import Any

from horizonrl.actors.config import CurriculumConfig


def stage_at(cfg: CurriculumConfig, step: int) -> int:
    """Stage (0-based) in force for training step `step` (0-based count of finished steps);
    always 0 for the fixed and adaptive schedules."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if cfg.schedule in ("fixed", "adaptive"):
        return 0
    if cfg.boundaries is not None:
        return bisect.bisect_right(cfg.boundaries, step)
    return min(step // cfg.steps_per_stage, len(cfg.horizons) - 1)


def horizon_at(cfg: CurriculumConfig, step: int) -> int:
    """Horizon in force for training step `step` (0-based count of finished steps).

    For the adaptive schedule this is its starting horizon; later ones come from decisions.
    """
    return cfg.horizons[stage_at(cfg, step)]


def env_horizons_at(cfg: CurriculumConfig, step: int) -> dict[str, int]:
    """The env labels with a horizon of their own (`env_horizons`) and that horizon."""
    stage = stage_at(cfg, step)
    return {key: hs[stage] for key, hs in cfg.env_horizons.items()}


def env_weights_at(cfg: CurriculumConfig, step: int) -> dict[str, float]:
    """The env labels with a sampling weight of their own (`env_weights`) and that weight."""
    stage = stage_at(cfg, step)
    return {key: ws[stage] for key, ws in cfg.env_weights.items()}


@dataclass(frozen=True, slots=True)
class Decision:
    """One adaptive decision: the horizon before and after, and why."""

    step: int
    before: int
    after: int
    reason: str


def adaptive_decision(cfg: CurriculumConfig, *, step: int, horizon: int,
                      window: list[tuple[float, float]]) -> Decision:
    """Decide from (success_rate, truncated_at_horizon_rate) per iteration since the last change.

    Raise when episodes keep running out of turns and success has stopped improving: more
    turns are the only way left to solve what is failing. Never beyond horizons[-1].
    """
    lo, hi = cfg.horizons[0], cfg.horizons[-1]
    if len(window) < cfg.window:
        return Decision(step, horizon, horizon, f"hold: {len(window)}/{cfg.window} iterations "
                        "of statistics since the last change")
    recent = window[-cfg.window:]
    half = cfg.window // 2
    trunc = fmean(t for _, t in recent)
    gain = fmean(s for s, _ in recent[half:]) - fmean(s for s, _ in recent[:half])
    figures = f"truncation {trunc:.2f}, success gain {gain:+.3f}"
    if trunc >= cfg.truncation_threshold and gain < cfg.min_improvement:
        if horizon >= hi:
            return Decision(step, horizon, horizon, f"hold: at the maximum {hi} ({figures})")
        new = min(horizon + cfg.horizon_step, hi)
        return Decision(step, horizon, new, f"raise: {figures} (thresholds "
                        f"{cfg.truncation_threshold}, {cfg.min_improvement:+})")
    if cfg.allow_lower and trunc < cfg.lower_threshold and horizon > lo:
        new = max(horizon - cfg.horizon_step, lo)
        return Decision(step, horizon, new, f"lower: {figures} (below {cfg.lower_threshold})")
    return Decision(step, horizon, horizon, f"hold: {figures}")


# How long `register` waits for a generator to take the horizon. A generator registers when it
# is ready and idle (at start, after a restart), so this waits for an acknowledgement, never
# for a rollout.
BROADCAST_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class HorizonSetting:
    """The horizon in force, its version and the per-env horizons (empty: every env uses
    `horizon`): what each rollout call carries to its generator (cluster/train/phases.py)."""

    horizon: int
    version: int
    env_horizons: dict[str, int] = field(default_factory=dict)


def _call(handle: Any, method: str, *args: Any) -> Any:
    """Call a method on a Ray actor handle or on a plain object alike."""
    fn = getattr(handle, method)
    return fn.remote(*args) if hasattr(fn, "remote") else fn(*args)


class CurriculumActor:
    """Owns the schedule. A generator gets the horizon in force when it registers; after that,
    changes reach it with its next rollout call, which carries `setting()`.

    A tick never calls a generator: a generator serves one call at a time, so in async mode a
    push would queue behind the rollout in progress and stall the driver for all of it.
    `version` counts horizon changes, so a generator can tell a stale setting from a new one.
    """

    def __init__(self, cfg: CurriculumConfig, *, step: int = 0,
                 broadcast_timeout_s: float = BROADCAST_TIMEOUT_S) -> None:
        self.cfg = cfg
        self.step = step
        self.horizon = horizon_at(cfg, step)
        self.env_horizons = env_horizons_at(cfg, step)
        self.version = 0
        self.window: list[tuple[float, float]] = []
        self.decisions: list[Decision] = []
        self.generators: dict[str, Any] = {}
        self.broadcast_timeout_s = broadcast_timeout_s

    def ready(self) -> bool:
        return True

    def health(self) -> dict[str, Any]:
        return {"step": self.step, "horizon": self.horizon, "version": self.version,
                "generators": sorted(self.generators)}

    def register(self, name: str, handle: Any) -> tuple[int, int]:
        """Add (or replace, after a restart) a generator and send it the horizon in force;
        returns once it has it."""
        self.generators[name] = handle
        # The per-env table travels only when configured, so generators (and test doubles)
        # that know one horizon keep working.
        args = (self.horizon, self.version) + ((dict(self.env_horizons),)
                                               if self.env_horizons else ())
        self._wait([_call(handle, "set_horizon", *args)])
        return self.horizon, self.version

    def current(self) -> tuple[int, int]:
        return self.horizon, self.version

    def current_env_horizons(self) -> dict[str, int]:
        """The per-env horizons in force (empty when every env uses `horizon`)."""
        return dict(self.env_horizons)

    def setting(self) -> HorizonSetting:
        """What the next rollout call should carry."""
        return HorizonSetting(self.horizon, self.version, dict(self.env_horizons))

    def tick(self, step: int, stats: dict[str, float] | None = None) -> tuple[int, int]:
        """Record that `step` steps are done (with that step's rollout statistics for the
        adaptive schedule); a change bumps the version. Returns at once (see the class)."""
        self.step = step
        if self.cfg.schedule == "adaptive":
            if stats is not None:
                self.window.append((float(stats["success_rate"]),
                                    float(stats["truncated_at_horizon_rate"])))
            decision = adaptive_decision(self.cfg, step=step, horizon=self.horizon,
                                         window=self.window)
            self.decisions.append(decision)
            new = decision.after
        else:
            new = horizon_at(self.cfg, step)
        new_env = env_horizons_at(self.cfg, step)
        if new != self.horizon or new_env != self.env_horizons:
            self.horizon, self.env_horizons = new, new_env
            self.version, self.window = self.version + 1, []
        return self.horizon, self.version

    def last_decision(self) -> dict[str, Any] | None:
        return asdict(self.decisions[-1]) if self.decisions else None

    def _wait(self, results: list[Any]) -> None:
        refs = [r for r in results if type(r).__name__ == "ObjectRef"]
        if refs:
            import ray

            ray.get(refs, timeout=self.broadcast_timeout_s)

    def get_state(self) -> dict[str, Any]:
        return {"step": self.step, "horizon": self.horizon, "version": self.version,
                "window": [list(w) for w in self.window]}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore exactly; stepwise horizons are recomputed from the step (they must agree)."""
        self.step, self.version = int(state["step"]), int(state["version"])
        self.window = [(float(s), float(t)) for s, t in state.get("window", [])]
        self.horizon = (int(state["horizon"]) if self.cfg.schedule == "adaptive"
                        else horizon_at(self.cfg, self.step))
        self.env_horizons = env_horizons_at(self.cfg, self.step)
