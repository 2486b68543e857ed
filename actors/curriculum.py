"""ScalingInter-RL: the horizon schedule and the actor that broadcasts it.

`horizon_at` is a pure function of the number of finished training steps, so a resumed run
computes the same stage as an uninterrupted one (AgentGym-RL's resume skipped most of stage 2).
"""

from __future__ import annotations

from typing import Any

from actors.config import CurriculumConfig


def horizon_at(cfg: CurriculumConfig, step: int) -> int:
    """Horizon in force for training step `step` (0-based count of finished steps)."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if cfg.schedule == "fixed":
        return cfg.horizons[0]
    return cfg.horizons[min(step // cfg.steps_per_stage, len(cfg.horizons) - 1)]


def _call(handle: Any, method: str, *args: Any) -> Any:
    """Call a method on a Ray actor handle or on a plain object alike."""
    fn = getattr(handle, method)
    return fn.remote(*args) if hasattr(fn, "remote") else fn(*args)


class CurriculumActor:
    """Owns the schedule; pushes `(horizon, version)` to every registered generator.

    `version` counts horizon changes, so a generator can tell a stale broadcast from a new one.
    """

    def __init__(self, cfg: CurriculumConfig, *, step: int = 0,
                 broadcast_timeout_s: float = 60.0) -> None:
        self.cfg = cfg
        self.step = step
        self.horizon = horizon_at(cfg, step)
        self.version = 0
        self.generators: dict[str, Any] = {}
        self.broadcast_timeout_s = broadcast_timeout_s

    def ready(self) -> bool:
        return True

    def health(self) -> dict[str, Any]:
        return {"step": self.step, "horizon": self.horizon, "version": self.version,
                "generators": sorted(self.generators)}

    def register(self, name: str, handle: Any) -> tuple[int, int]:
        """Add (or replace, after a restart) a generator and send it the horizon in force."""
        self.generators[name] = handle
        self._wait([_call(handle, "set_horizon", self.horizon, self.version)])
        return self.horizon, self.version

    def current(self) -> tuple[int, int]:
        return self.horizon, self.version

    def tick(self, step: int) -> tuple[int, int]:
        """Record that `step` steps are done; broadcast if the horizon changes."""
        self.step = step
        new = horizon_at(self.cfg, step)
        if new != self.horizon:
            self.horizon, self.version = new, self.version + 1
            self._wait([_call(h, "set_horizon", new, self.version)
                        for h in self.generators.values()])
        return self.horizon, self.version

    def _wait(self, results: list[Any]) -> None:
        refs = [r for r in results if type(r).__name__ == "ObjectRef"]
        if refs:
            import ray

            ray.get(refs, timeout=self.broadcast_timeout_s)

    def get_state(self) -> dict[str, Any]:
        return {"step": self.step, "horizon": self.horizon, "version": self.version}

    def set_state(self, state: dict[str, Any]) -> None:
        self.step, self.version = int(state["step"]), int(state["version"])
        self.horizon = horizon_at(self.cfg, self.step)
