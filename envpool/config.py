"""The `env` section of the run config."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class EnvConfig(BaseModel):
    """Which environment to run and how its replicas are spread over Ray actors."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("babyai", description="Registered environment name (see envpool.registry).")
    kwargs: dict[str, Any] = Field(
        default_factory=lambda: {"level": "BabyAI-GoToRedBall-v0", "reward": "binary"},
        description="Keyword arguments for the environment's constructor.",
    )
    num_actors: int = Field(1, ge=1, description="Env actors per generator (Ray processes).")
    replicas_per_actor: int = Field(
        64, ge=1, description="Environment instances hosted by each env actor."
    )
    num_cpus_per_actor: float = Field(
        0.5, gt=0, description="Logical CPUs Ray reserves for each env actor."
    )
    call_timeout_s: float = Field(
        60.0, gt=0, description="Deadline for one batched reset/step call to an env actor; a "
        "call past it fails its episodes with failure=timeout and the actor is restarted.",
    )
    eval_seed_offset: int = Field(
        1_000_000, ge=1, description="Task seeds at or above this belong to the eval split; "
        "training tasks are drawn below it.",
    )

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        from envpool.registry import env_names

        if v not in env_names():
            raise ValueError(f"unknown env {v!r}; known: {', '.join(env_names())}")
        return v
