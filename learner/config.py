"""The `learner` section of the run config."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from horizonrl.protos.placement import CustomResources
from horizonrl.protos.precision import dtype_name


class IngestConfig(BaseModel):
    """The gRPC server where generators push finished trajectories."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field("127.0.0.1", description="Bind address; loopback unless you mean it.")
    port: int = Field(0, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    capacity: int = Field(4096, ge=1, description="Most trajectories buffered before pushes wait.")
    max_message_bytes: int = Field(64 << 20, ge=1 << 16, description="gRPC message size limit.")
    dedup_window: int = Field(
        1_000_000, ge=1, description="Latest stored trajectory ids remembered to drop resends "
        "(exactly-once); bounds the ingest's memory on long runs. Must exceed what is in flight.",
    )
    auth_token_env: str = Field(
        "HORIZONRL_INGEST_TOKEN", description="Environment variable holding the token clients "
        "must send; required when host is not loopback. Never put the token in a config file.",
    )
    collect_timeout_s: float = Field(
        300.0, gt=0, description="How long the learner waits for a step's trajectories."
    )
    max_trajectory_bytes: int = Field(
        64 << 20, ge=1 << 16, description="Largest encoded trajectory the ingest reassembles "
        "from chunks (a 32k-token episode is ~0.3 MB); larger ones are rejected.",
    )
    tls_cert_path: str | None = Field(
        None, description="PEM certificate of the ingest; with tls_key_path, serve TLS only.")
    tls_key_path: str | None = Field(None, description="PEM private key for tls_cert_path.")
    tls_ca_path: str | None = Field(
        None, description="PEM CA bundle generators trust for the ingest's certificate "
        "(the certificate itself when self-signed); unset: plaintext.",
    )

    def model_post_init(self, _context: object) -> None:
        # A validator without a new import: pydantic reports this ValueError as a
        # ValidationError like any field error.
        if (self.tls_cert_path is None) != (self.tls_key_path is None):
            raise ValueError("learner.ingest: set tls_cert_path and tls_key_path together "
                             "(both PEM files), or neither for plaintext")


class LearnerConfig(BaseModel):
    """DeepSpeed ZeRO learner group: GRPO, RLOO, REINFORCE++ or PPO (critic + GAE)."""

    model_config = ConfigDict(extra="forbid")

    algorithm: str = Field(
        "grpo", description="The advantage estimator (learner.credit; docs/credit.md). "
        "grpo: group-normalised outcome advantage; rloo: leave-one-out baseline; "
        "reinforce_pp: batch-normalised discounted returns (REINFORCE++); ppo: a critic and "
        "GAE over the multi-turn sequence (env tokens skipped); rejection_sampling: SFT on "
        "each batch's successful episodes; gigpo: GRPO's episode level plus step-level "
        "advantages of turns taken in the same state (GiGPO); turn_rloo: each turn's "
        "discounted return minus the group's leave-one-out mean return."
    )
    decoupled_loss: bool | None = Field(
        None, description="Off-policy correction (decoupled PPO): clip against the learner's "
        "own pre-update logprobs and weight each token by the truncated importance weight "
        "min(exp(pre-update - behaviour logprob), is_cap). None: on in async mode, off in sync."
    )
    is_cap: float = Field(2.0, gt=0, description="Truncation of the behaviour importance "
                          "weight (decoupled loss).")
    seq_mask_band: tuple[float, float] | None = Field(
        None, description="Sequence-level rollout masking, in sync and async mode: a row "
        "(an episode; a turn in window mode) whose geometric-mean ratio exp(mean log(learner "
        "pre-update / vLLM)) falls outside [low, high] gets no policy loss, e.g. [0.5, 2.0]. "
        "Combines with the decoupled loss's token-level truncation (TIS). unset: off.")
    dpo_beta: float = Field(0.1, gt=0, description="DPO (`horizonrl dpo`): beta, the strength "
                            "of the implicit KL to the reference.")
    reinforce_pp_baseline: bool = Field(
        False, description="REINFORCE++: subtract the group's mean return first (the "
        "'with baseline' variant)."
    )
    gamma: float = Field(1.0, ge=0, le=1, description="Discount per model token (REINFORCE++, "
                         "PPO); env tokens cost no discount step.")
    turn_gamma: float = Field(
        0.95, ge=0, le=1, description="gigpo, turn_rloo, and ppo in window context mode: "
        "discount per turn of the turn-level "
        "returns G_k = r_k + turn_gamma * G_(k+1) (GiGPO: 0.95); 1 makes every turn of an "
        "episode with one final reward return the same.")
    step_adv_weight: float = Field(
        1.0, ge=0, description="gigpo: weight of the step-level (anchor-state) advantage "
        "added to the episode-level one; 0 is GRPO.")
    lam: float = Field(1.0, ge=0, le=1, description="PPO: GAE lambda.")
    critic_lr: float = Field(1e-3, gt=0, description="PPO: critic learning rate (AdamW).")
    value_clip: float = Field(0.2, gt=0, description="PPO: clip of the value update around "
                              "the old values.")
    critic_warmup_steps: int = Field(0, ge=0, description="PPO: updates that train only the "
                                     "critic before the policy moves.")
    dual_clip: float | None = Field(None, gt=1, description="Dual-clip PPO bound c for "
                                    "negative advantages (3.0 usual); unset: plain clipping.")
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = Field(
        "token-mean", description="How per-token losses become a scalar (see "
        "learner.algorithms.aggregate).")
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus weight.")
    kl_in_reward: bool = Field(
        False, description="PPO: subtract kl_coef * KL(behaviour || ref) from the per-token "
        "rewards instead of adding a KL loss term.")
    lr_schedule: Literal["constant", "cosine"] = Field(
        "constant", description="After warm-up: constant, or cosine decay to min_lr_ratio * lr "
        "over lr_decay_steps.")
    lr_decay_steps: int = Field(1000, ge=1, description="Cosine: optimizer steps to decay over.")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Cosine: final lr / peak lr.")
    micro_batch_tokens: int = Field(
        0, ge=0, description="Token budget of a micro-batch (gradient accumulation): at most "
        "this many tokens computed per forward pass, padding included; a longer row gets one "
        "of its own. 0: 8192 for the bucketed, packed and shared_prefix layouts, one "
        "micro-batch per minibatch for padded.")
    layout: Literal["auto", "padded", "bucketed", "packed", "shared_prefix"] = Field(
        "auto", description="How a rank's rows become forward passes (learner.layout, "
        "docs/learner.md); all give the same loss and gradients. padded: consecutive rows "
        "padded to the longest; bucketed: rows sorted by length into micro-batches of the "
        "token budget, episodes dealt to ranks by tokens; packed: a micro-batch's rows in one "
        "sequence, attention kept per row (pays off with flash-attention's varlen kernel, not "
        "on CPU); shared_prefix: window-mode turn rows run their episode's prompt once. auto: "
        "shared_prefix for turn rows, else bucketed.")
    dynamic_sampling: bool = Field(
        False, description="Keep sampling more task groups until the batch holds "
        "tasks_per_step groups with reward variance (DAPO-style); bounded by "
        "max_sampling_rounds, reported in metrics.")
    max_sampling_rounds: int = Field(3, ge=1, description="Dynamic sampling: most rollout "
                                     "rounds per iteration.")
    world_size: int = Field(2, ge=1, description="LearnerWorker ranks (one Ray actor each).")
    num_cpus_per_worker: float = Field(0.5, gt=0, description="Logical CPUs Ray reserves per rank.")
    num_gpus_per_worker: float = Field(0.0, ge=0, description="GPUs per rank (0 on CPU).")
    resources_per_worker: CustomResources = Field(
        default_factory=dict, description="Custom Ray resources per rank (in its placement-group "
        "bundle), e.g. {\"learner_node\": 0.1}: ranks run only on nodes that offer them.")
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="Ray placement-group strategy of the ranks: PACK keeps them on as "
        "few nodes as fit (gloo/NCCL traffic stays local), SPREAD one per node where it can.")
    torch_threads: int = Field(1, ge=1, description="Intra-op threads per rank.")
    zero_stage: Literal[1, 2, 3] = Field(2, description="DeepSpeed ZeRO stage.")
    dtype: Literal["float32", "bfloat16", "auto"] = Field(
        "float32", description="Compute precision of the policy (and critic and reference), "
        "named as generator.dtype names it: bfloat16 trains through DeepSpeed's bf16 mode, fp32 "
        "master weights in the optimizer; logprobs and losses are computed in fp32 either way. "
        "Needs bf16 hardware (GPUs from Ampere; CPUs with AVX-512 BF16 or AMX, as "
        "docs/precision.md measures). auto: bfloat16 where each rank's device has it natively, "
        "else float32 (all ranks must agree). The former names fp32 and bf16 are read with a "
        "warning.")
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass (HF gradient "
        "checkpointing): less memory for long sequences, ~30% more compute.")
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
    overlong: Literal["train", "mask", "penalty"] = Field(
        "train", description="Episodes cut by the context limit or the horizon (not ended by "
        "the env): train them with the reward they got (a failure scores like one); mask them "
        "out of the loss and of their group's statistics (the ledger counts them as "
        "`overlong`); or subtract overlong_penalty from their reward (a soft length penalty).")
    overlong_penalty: float = Field(
        0.5, ge=0, description="overlong=penalty: what a cut episode's reward loses.")
    mask_invalid_turns: bool = Field(
        False, description="Leave the turns whose action the env rejected out of positive "
        "updates: in episodes with a positive advantage, and in the episodes rejection "
        "sampling keeps, those turns' tokens get no loss (failed episodes keep them).")
    skip_zero_variance_groups: bool = Field(
        True, description="Drop groups whose rewards are all equal: their advantage is 0."
    )
    shm_allreduce: bool = Field(
        False, description="Build DeepSpeed's CPU shared-memory allreduce (a 1-2 min JIT "
        "compile on first use); gloo alone is enough for small models."
    )
    weight_sync: Literal["object_store", "broadcast"] = Field(
        "object_store", description="How sync-mode runs push weights to the generators: "
        "object_store (rank 0's state dict through Ray, each engine reloads it from a file) or "
        "broadcast (rank 0 broadcasts it in buckets over a process group with the engines: "
        "NCCL when every member has a GPU of its own, else gloo). Async runs always hand "
        "weights over through the object store.")
    weight_sync_timeout_s: float = Field(
        300.0, gt=0, description="Most seconds a weight push may take; also the broadcast "
        "group's collective timeout, so a member that died mid-push frees the others after it.")
    weight_bucket_mb: float = Field(
        64.0, gt=0, description="Broadcast: most MiB per bucket (one flat broadcast each; "
        "bounds the extra memory on both sides); a larger tensor is sent alone.")
    ingest: IngestConfig = Field(default_factory=IngestConfig, description="Trajectory ingest.")

    @field_validator("seq_mask_band")
    @classmethod
    def _band(cls, band: tuple[float, float] | None) -> tuple[float, float] | None:
        if band is not None and not 0 < band[0] <= 1 <= band[1]:
            raise ValueError(f"learner.seq_mask_band {list(band)}: need 0 < low <= 1 <= high "
                             "(ratios of learner to vLLM probabilities; 1 is no mismatch)")
        return band

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype_name(cls, value: object) -> object:
        return dtype_name(value, "learner.dtype")

    @field_validator("algorithm")
    @classmethod
    def _registered(cls, name: str) -> str:
        # The registry, not a Literal: a new estimator is one module and its registration.
        from horizonrl.learner.credit import estimator_class

        estimator_class(name)  # ValueError naming the registered ones
        return name

    @model_validator(mode="after")
    def _layout(self) -> LearnerConfig:
        from horizonrl.learner.layout import resolve_layout

        # The layout's own check, on turn rows, so a bad pairing fails at load, not mid-run.
        resolve_layout(self.layout, {"episode": None}, zero_stage=self.zero_stage,
                       checkpointing=self.gradient_checkpointing)
        return self


def rank_bundle(cfg: LearnerConfig) -> dict[str, float]:
    """One rank's placement-group bundle (what `--dry-run` plans and the group reserves)."""
    gpus = {"GPU": cfg.num_gpus_per_worker} if cfg.num_gpus_per_worker else {}
    return {"CPU": cfg.num_cpus_per_worker, **gpus, **cfg.resources_per_worker}
