"""The `generator` and `curriculum` sections of the run config."""

from __future__ import annotations

from itertools import pairwise
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from horizonrl.protos.placement import CustomResources


class ContextConfig(BaseModel):
    """What the model sees each turn: the whole episode, or a window of the latest turns."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["full", "window"] = Field(
        "full", description="full: every turn's prompt is the whole conversation so far (one "
        "training row per episode; the episode ends `truncated` when the next turn would not "
        "fit max_context_tokens). window: the system prompt, the task (first observation) and "
        "the last keep_turns turns, sliced from the ids already sampled and observed; one "
        "training row per turn, so cost grows linearly with the turns.")
    keep_turns: int = Field(
        4, ge=1, description="window: earlier turns (each the model's reply and the "
        "observation that answered it) kept in the prompt; fewer when they would not fit "
        "max_context_tokens. At least the horizon: the same prompts as full mode.")


class GeneratorConfig(BaseModel):
    """Rollout: vLLM generator actors running the multi-turn agent loop."""

    model_config = ConfigDict(extra="forbid")

    num_generators: int = Field(1, ge=1, description="GeneratorActor replicas (one vLLM each).")
    num_cpus: float = Field(1.0, gt=0, description="Logical CPUs Ray reserves per generator.")
    num_gpus: float = Field(0.0, ge=0, description="GPUs per generator (0 on CPU machines).")
    resources: CustomResources = Field(
        default_factory=dict, description="Custom Ray resources per generator, e.g. "
        "{\"gpu_node\": 0.1}: generators run only on nodes that offer them (placement by role).")
    restart_timeout_s: float = Field(
        300.0, gt=0, description="How long a generator may take to be placed and load its "
        "model, at the start of a run or as the replacement for a dead one. Past it at the "
        "start the run stops with exit 2 naming the generator; for a replacement (a lost node "
        "whose resources no other node offers) the run saves a checkpoint and stops with exit "
        "3, resumable with --resume auto.")
    tasks_per_step: int = Field(8, ge=1, description="Distinct tasks (env seeds) per iteration.")
    group_size: int = Field(
        8, ge=1, description="Episodes per task: a GRPO group shares one task and one seed."
    )
    temperature: float = Field(
        1.0, gt=0, description="Sampling temperature, in training and in eval. The learner divides "
        "its logits by it, so its logprobs are of the distribution the tokens were drawn from.")
    max_tokens_per_turn: int = Field(
        16, ge=1, description="Cap on tokens the model may write in one turn (an action is short)."
    )
    max_context_tokens: int = Field(
        2048, ge=64, description="vLLM max_model_len. Full context: an episode whose next "
        "turn would not fit ends truncated (cut by the context); window: older turns leave "
        "the window first.",
    )
    loop: Literal["lockstep", "independent"] = Field(
        "lockstep", description="lockstep: one batched generate for every live episode, then "
        "one batched env step, turn by turn; episodes beyond the env's replicas run in later "
        "waves. independent: every episode is its own loop over vLLM's continuous batching: a "
        "reply goes to its env at once, an env result back to the engine at once (env steps "
        "run while others generate), a finished episode frees its replica for the next "
        "(actors/episodes.py). Measured (docs/rollout.md): independent is faster where env "
        "steps take real time (remote servers, with env.step_threads > 1), lockstep where "
        "they are cheap local Python.")
    max_episodes_in_flight: int = Field(
        0, ge=0, description="independent: episodes started and not yet finished at once per "
        "generator (0: as many as the env replicas allow); bounds the engine's batch and the "
        "KV cache in use.")
    partial_rollouts: bool = Field(
        False, description="mode=async: episodes in flight take each new policy version (and "
        "horizon) at their next turn instead of finishing on the weights their rollout began "
        "with; each turn records the version that sampled it (Trajectory.turn_versions), a "
        "turn never spans two. The engine finishes the generations in flight, then reloads. "
        "The driver then also takes trajectories as they arrive and trains on groups as soon "
        "as they are complete, and queues a second rollout on each generator (docs/rollout.md, "
        "the long tail).")
    rollout_steps: int = Field(
        1, ge=1, description="mode=async: each rollout call carries this many steps' worth of "
        "tasks (tasks_per_step x rollout_steps groups), so a generator's episodes run one after "
        "another within max_episodes_in_flight and it idles on a rollout's last stragglers "
        "less often. The learner still takes tasks_per_step groups per update.")
    context: ContextConfig = Field(default_factory=ContextConfig,
                                   description="Full or window context per turn.")
    prefix_caching: bool = Field(
        True, description="vLLM automatic prefix caching: a turn's prompt reuses the KV blocks "
        "of the previous turn's (full mode) or of the shared system prompt and task (window).")
    kv_cache_gib: int = Field(1, ge=1, description="VLLM_CPU_KVCACHE_SPACE (whole GiB) on CPU.")
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        "float32", description="Engine dtype: float32 on AVX2 CPUs (bf16 is 2x slower there). "
        "auto: bfloat16 where the generator's device has native bf16 (the learner's `auto` "
        "rule), else float32 (not vLLM's own auto, which follows the checkpoint). The "
        "learner's logprobs match the engine's closely only in the same precision.",
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="GPU: the share of its GPU the vLLM engine takes for "
        "weights and KV cache (vLLM's own default 0.9); lower it when another role shares the "
        "GPU. Ignored on CPU (kv_cache_gib sizes the cache there).")
    tensor_parallel_size: int = Field(
        1, ge=1, description="GPU: vLLM tensor parallelism; needs num_gpus at least this.")
    enforce_eager: bool | None = Field(
        None, description="vLLM without CUDA graphs. Unset: eager on CPU (compiling took 79 s "
        "there and was not faster), CUDA graphs on GPU.")
    send_deadline_s: float = Field(60.0, gt=0, description="gRPC deadline for one push.")
    trim_heap: bool = Field(
        True, description="After each rollout, give freed heap memory back to the OS (glibc "
        "malloc_trim, ~10 ms): keeps a long run's generator RSS flat. No-op off glibc.",
    )

    @model_validator(mode="after")
    def _parallel_fits(self) -> GeneratorConfig:
        if self.tensor_parallel_size > 1 and self.num_gpus < self.tensor_parallel_size:
            raise ValueError(f"generator.tensor_parallel_size ({self.tensor_parallel_size}) "
                             f"needs generator.num_gpus >= it (got {self.num_gpus})")
        return self


class CurriculumConfig(BaseModel):
    """ScalingInter-RL: the max interaction turns (horizon) as a function of training step."""

    model_config = ConfigDict(extra="forbid")

    schedule: Literal["fixed", "stepwise", "adaptive"] = Field(
        "stepwise", description="fixed: always horizons[0]; stepwise: horizons[k] for steps "
        "[k*steps_per_stage, (k+1)*steps_per_stage), or from `boundaries`, the last one "
        "thereafter; adaptive: start at horizons[0], raise by horizon_step (up to horizons[-1]) "
        "when episodes keep hitting the horizon while success has stopped improving.",
    )
    horizons: list[int] = Field(
        default_factory=lambda: [6, 13, 20],
        description="Horizon of each stage (AgentGym-RL's BabyAI: 6, 13, 20); for adaptive, "
        "the first and last entries are the bounds.",
    )
    steps_per_stage: int = Field(100, ge=1, description="Training steps per stage (D).")
    boundaries: list[int] | None = Field(
        None, description="Stepwise: the steps at which stage 2, 3, ... begin (one fewer "
        "than horizons, rising); overrides steps_per_stage.",
    )
    window: int = Field(
        10, ge=2, description="Adaptive: iterations of statistics behind each decision, "
        "counted since the last change.",
    )
    truncation_threshold: float = Field(
        0.3, ge=0, le=1, description="Adaptive: raise only if at least this share of episodes "
        "ran out of turns (truncated at the horizon) over the window.",
    )
    min_improvement: float = Field(
        0.02, description="Adaptive: raise only if success in the window's second half beat "
        "its first half by less than this (learning at this horizon has stalled).",
    )
    horizon_step: int = Field(2, ge=1, description="Adaptive: turns added per raise.")
    env_horizons: dict[str, list[int]] = Field(
        default_factory=dict, description="Multi-env runs: an env label's own horizon in each "
        "stage (one entry per stage of `horizons`; one for a fixed schedule), so a 3-turn "
        "BabyAI task and a 15-turn TextCraft task need not share one horizon. Envs not named "
        "use `horizons`. Not with the adaptive schedule.",
    )
    env_weights: dict[str, list[float]] = Field(
        default_factory=dict, description="Task-difficulty schedule: an env label's sampling "
        "weight in each stage (replacing its env.weight), e.g. TextCraft depths 1-4 as four "
        "labelled envs whose weights shift to the deep ones stage by stage, as the paper mixes "
        "difficulties. Not with the adaptive schedule.",
    )
    allow_lower: bool = Field(
        False, description="Adaptive: lower the horizon by horizon_step when almost no "
        "episode uses it (truncation below lower_threshold); off, as in ScalingInter-RL.",
    )
    lower_threshold: float = Field(
        0.02, ge=0, le=1, description="Adaptive with allow_lower: truncation share below "
        "which the horizon is lowered.",
    )

    @model_validator(mode="after")
    def _monotone(self) -> CurriculumConfig:
        if not self.horizons or min(self.horizons) < 1:
            raise ValueError(f"curriculum.horizons must be positive turn counts, got "
                             f"{self.horizons}")
        if self.schedule in ("stepwise", "adaptive") and any(
            b <= a for a, b in zip(self.horizons, self.horizons[1:])
        ):
            raise ValueError(f"curriculum.horizons must rise strictly for a {self.schedule} "
                             f"schedule (h1 < h2 < h3), got {self.horizons}")
        stages = 1 if self.schedule == "fixed" else len(self.horizons)
        for name, table in (("env_horizons", self.env_horizons),
                            ("env_weights", self.env_weights)):
            if table and self.schedule == "adaptive":
                raise ValueError(f"curriculum.{name} needs stages: use a fixed or stepwise "
                                 "schedule (the adaptive one decides from one env's statistics)")
            least, what = (1, "horizon >= 1") if name == "env_horizons" else (0, "weight >= 0")
            for key, values in table.items():
                if len(values) != stages or min(values) < least:
                    raise ValueError(f"curriculum.{name}.{key} must give one {what} per stage "
                                     f"({stages}), got {values}")
        if self.boundaries is not None:
            b = self.boundaries
            if len(b) != len(self.horizons) - 1 or any(y <= x for x, y in pairwise(b)) or (
                b and b[0] < 1
            ):
                raise ValueError(f"curriculum.boundaries must be {len(self.horizons) - 1} rising "
                                 f"steps >= 1 (one per stage after the first), got {b}")
        return self


class AgentConfig(BaseModel):
    """Outside agents: the user's own agent code, talking to each generator's OpenAI-compatible
    endpoint, plays the episodes (docs/agents.md)."""

    model_config = ConfigDict(extra="forbid")

    callable: str | None = Field(
        None, description="`module:function` of the agent: it gets an `AgentTask` (task seed, "
        "`task.client()` an OpenAI client for the episode, `task.env` the env replica) and "
        "returns the episode's reward, or None for the env's; sync or async. Unset: "
        "horizonrl's own agent loop plays.", pattern=r"^[\w.]+:\w+$")
    tool_parser: str = Field(
        "hermes", description="How tool calls are read from a reply: hermes, "
        "`<tool_call>{\"name\", \"arguments\"}</tool_call>` blocks (Qwen2.5, the tiny "
        "model), or a `module:function` of your own (actors.tool_calls.ToolParser) for "
        "another model's format.", pattern=r"^(hermes|[\w.]+:\w+)$")
    host: str = Field("127.0.0.1", description="Address the endpoint binds to. Off loopback, "
                      "only the per-episode keys (random, valid while the episode runs) "
                      "guard it; put TLS in front of it across untrusted networks.")
    port: int = Field(0, ge=0, le=65535, description="Endpoint port; 0 picks a free one per "
                      "generator.")
    served_model_name: str = Field("horizonrl", description="The model name /v1/models "
                                   "lists and replies carry.")
    episode_timeout_s: float = Field(
        600.0, gt=0, description="Deadline for one agent episode (its whole run); past it the "
        "episode fails with failure=timeout and its env actor is restarted.")
    request_timeout_s: float = Field(300.0, gt=0, description="How long the endpoint waits "
                                     "for a reply before answering 504.")
    max_request_bytes: int = Field(4 << 20, ge=1024, description="Largest request body; "
                                   "bigger ones get 413.")
