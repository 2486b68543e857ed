"""The `learner` section of the run config."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class IngestConfig(BaseModel):
    """The gRPC server where generators push finished trajectories."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field("127.0.0.1", description="Bind address; loopback unless you mean it.")
    port: int = Field(0, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    capacity: int = Field(4096, ge=1, description="Most trajectories buffered before pushes wait.")
    max_message_bytes: int = Field(64 << 20, ge=1 << 16, description="gRPC message size limit.")
    auth_token_env: str = Field(
        "HORIZONRL_INGEST_TOKEN", description="Environment variable holding the token clients "
        "must send; required when host is not loopback. Never put the token in a config file.",
    )
    collect_timeout_s: float = Field(
        300.0, gt=0, description="How long the learner waits for a step's trajectories."
    )


class LearnerConfig(BaseModel):
    """DeepSpeed ZeRO learner group running GRPO."""

    model_config = ConfigDict(extra="forbid")

    algorithm: Literal["grpo"] = Field("grpo", description="Policy-gradient algorithm.")
    world_size: int = Field(2, ge=1, description="LearnerWorker ranks (one Ray actor each).")
    num_cpus_per_worker: float = Field(0.5, gt=0, description="Logical CPUs Ray reserves per rank.")
    num_gpus_per_worker: float = Field(0.0, ge=0, description="GPUs per rank (0 on CPU).")
    torch_threads: int = Field(1, ge=1, description="Intra-op threads per rank.")
    zero_stage: Literal[1, 2, 3] = Field(2, description="DeepSpeed ZeRO stage.")
    lr: float = Field(3e-4, gt=0, description="Peak learning rate (AdamW).")
    warmup_steps: int = Field(5, ge=0, description="Optimizer steps of linear LR warm-up.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, gt=0, description="Global gradient-norm clip.")
    clip_ratio: float = Field(0.2, gt=0, lt=1, description="PPO-style ratio clip epsilon.")
    kl_coef: float = Field(
        0.001, ge=0, description="Weight of the KL term to the frozen reference model "
        "(AgentGym-RL: 0.001); 0 skips the reference forward."
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3", description="KL estimator in the loss (k3 = low-variance, verl's low_var_kl)."
    )
    norm_adv_by_std: bool = Field(
        True, description="GRPO: divide by the group's reward std (False = Dr.GRPO style)."
    )
    epochs: int = Field(1, ge=1, description="Passes over each batch.")
    minibatches: int = Field(2, ge=1, description="Optimizer steps per epoch (per rank).")
    skip_zero_variance_groups: bool = Field(
        True, description="Drop groups whose rewards are all equal: their advantage is 0."
    )
    shm_allreduce: bool = Field(
        False, description="Build DeepSpeed's CPU shared-memory allreduce (a 1-2 min JIT "
        "compile on first use); gloo alone is enough for small models."
    )
    ingest: IngestConfig = Field(default_factory=IngestConfig, description="Trajectory ingest.")
