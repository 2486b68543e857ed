"""The run config: one pydantic tree whose sections mirror the folders, from YAML + overrides."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from horizonrl.actors.config import AgentConfig, CurriculumConfig, GeneratorConfig
from horizonrl.envpool.config import EnvConfig
from horizonrl.learner.config import LearnerConfig

# Sizes of the locally built model (hidden, layers); parameters and throughput on 2 cores in
# docs/presets.json (bench/presets.py): xs 0.50M, s 4.9M, m 25.6M.
TINY_PRESETS = {"xs": (128, 2), "s": (256, 6), "m": (512, 8)}
TINY_MAX_POSITIONS = 4096  # the locally built model's max_position_embeddings


def renamed_fields(data: Any, renames: dict[str, str], section: str) -> Any:
    """A section's raw mapping with its former field names (`renames`: old -> new) moved to the
    new ones, warning once per name; both names at once is an error. One vocabulary: `horizon`
    is the interaction budget wherever a user sets one."""
    if not isinstance(data, dict) or not set(renames) & set(data):
        return data
    data = dict(data)
    for old, new in renames.items():
        if old not in data:
            continue
        if new in data:
            raise ValueError(f"{section}.{old} and {section}.{new} are one setting (its former "
                             f"and its new name): give only {section}.{new}")
        warnings.warn(f"{section}.{old} is now {section}.{new} (the old name is read for one "
                      "release)", FutureWarning, stacklevel=2)
        data[new] = data.pop(old)
    return data


class TinyModelConfig(BaseModel):
    """The locally built stand-in for a pretrained base model (used when model.path is unset)."""

    model_config = ConfigDict(extra="forbid")

    preset: Literal["xs", "s", "m"] | None = Field(
        None, description="Model size: xs (~0.5M params, hidden 128 x 2 layers), s (~5M, 256 x "
        "6) or m (~25M, 512 x 8); overrides hidden_size and num_layers. Unset: those fields.")
    tokenizer: Literal["phrase", "word"] = Field(
        "phrase", description="phrase: BPE merges may span words (\"red ball 1\" is one token; "
        "short transcripts); word: merges stop at spaces, so names seen in the corpus stay "
        "whole words and new names are spelled from word pieces (GPT-2 style).")
    thought: Literal["short", "none"] = Field(
        "none", description="Reply format of the pre-training transcripts: the action line "
        "alone, or with the short templated thought `horizonrl demos` writes (use the format "
        "the demonstrations and RL will use, so the tokenizer has learned its words).")

    vocab_size: int = Field(
        1024, ge=300, description="BPE vocabulary incl. 3 ChatML specials (1024: every frequent "
        "phrase of the BabyAI text, role names included, becomes one token).")
    hidden_size: int = Field(128, ge=16, description="Qwen2 hidden size (4 heads, 2 KV heads).")
    num_layers: int = Field(2, ge=1, description="Transformer layers.")
    transcripts: int = Field(6000, ge=10, description="Random-policy episodes to pre-train on.")
    horizon: int = Field(6, ge=1, description="Longest transcript, in turns (formerly "
                         "max_turns).")
    pretrain_steps: int = Field(
        600, ge=0, description="Next-token steps on the transcripts (~3 min on 2 cores)."
    )
    batch_size: int = Field(32, ge=1, description="Sequences per pre-training step.")
    lr: float = Field(2e-3, gt=0, description="Pre-training peak learning rate (cosine).")
    reading: int = Field(
        0, ge=0, description="Synthetic reading tasks mixed into pre-training "
        "(cluster/model/reading.py: find the line that mentions a word and copy it, count lines, "
        "track an inventory; names "
        "partly made up), so the model copies from its context before it sees a demonstration. "
        "0: none. Raise pretrain_steps with it: the steps are shared.")
    names: bool = Field(
        False, description="Add the env's own names (its `vocabulary`: Deep Search's made-up "
        "entity words) to the tokenizer's corpus, so that every name word is one token and "
        "copying a name from a passage is copying one token. Needs tokenizer=word and a "
        "vocab_size the names fit in (the build prints how many are whole; BPE stops adding "
        "entries once every word is whole, so a generous vocab_size costs nothing).")

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        return renamed_fields(data, {"max_turns": "horizon"}, "model.tiny")

    @model_validator(mode="after")
    def _names_need_words(self) -> TinyModelConfig:
        if self.names and self.tokenizer != "word":
            raise ValueError("model.tiny.names=true needs model.tiny.tokenizer=word (phrase "
                             "merges span words, so a name would not be a token of its own)")
        return self


class ModelConfig(BaseModel):
    """Which checkpoint the generators and learner start from."""

    model_config = ConfigDict(extra="forbid")

    path: str | None = Field(
        None, description="A save_pretrained folder (HF format). Unset: build the tiny model "
        "into cache_dir on first use (no download ever happens).",
    )
    cache_dir: str = Field(".cache/models", description="Where built tiny models are kept.")
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig, description="Tiny model.")


class RayConfig(BaseModel):
    """Where the Ray cluster is."""

    model_config = ConfigDict(extra="forbid")

    address: str | None = Field(
        None, description="Existing cluster (e.g. 'auto' under ray job submit). Unset: start a "
        "private local Ray on 127.0.0.1 and stop it at the end (a Ray the process already "
        "joined with ray.init is used as it is and left running).",
    )
    num_cpus: int = Field(
        4, ge=1, description="Logical CPUs of a local Ray: a scheduling budget, not cores; in "
        "sync mode the phases take turns on the real cores.",
    )
    wait_for_resources_s: float = Field(
        0.0, ge=0, description="At the start of a run, how long to wait for the cluster's free "
        "resources to hold the run's actors (an autoscaling cluster adds nodes meanwhile), "
        "printing what is missing; 0 fails at once with what is missing.",
    )
    log_to_driver: bool = Field(
        False, description="Stream every actor's stdout and stderr to this console (vLLM's, "
        "DeepSpeed's and Triton's start-up notices included). Off: the console shows progress, "
        "decisions and errors, and actor output stays in Ray's session logs, which the run "
        "dir links as ray-logs.")


class MetricsConfig(BaseModel):
    """Prometheus export from the driver (it sees every iteration's figures)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Serve /metrics for Prometheus during training.")
    host: str = Field(
        "127.0.0.1", description="Bind address; 0.0.0.0 only inside a pod (deploy/ sets it)."
    )
    port: int = Field(9464, ge=0, le=65535, description="Port of /metrics; 0 picks a free one.")
    wandb: bool = Field(
        False, description="Also log to Weights & Biases (`pip install wandb`); offline unless "
        "WANDB_MODE says otherwise, so a run never needs the network.",
    )


class EvalConfig(BaseModel):
    """Periodic evaluation during training, on each env's fixed eval split."""

    model_config = ConfigDict(extra="forbid")

    every: int = Field(0, ge=0, description="Evaluate every N training steps (and after the "
                       "last); 0 turns periodic evaluation off.")
    tasks: int = Field(16, ge=1, description="Eval tasks per env (the first seeds of its eval "
                       "split, the same every time).")
    samples: int = Field(1, ge=1, description="Episodes per task (pass@samples is logged).")
    horizons: list[int] = Field(
        default_factory=list, description="Horizons (turn budgets) to evaluate; empty: the "
        "curriculum's current horizon (formerly max_turns).")

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        return renamed_fields(data, {"max_turns": "horizons"}, "eval")


class InitConfig(BaseModel):
    """Warm start before RL (AgentGym's recipe): expert demonstrations, behaviour cloning (SFT
    on the learner group), an evaluation on the eval split, then RL from the cloned model."""

    model_config = ConfigDict(extra="forbid")

    sft_epochs: float = Field(
        0.0, ge=0, description="Passes of SFT over the demonstrations; 0 turns the warm start "
        "off (RL starts from model.path or the tiny model).")
    demos: str | None = Field(
        None, description="Demonstrations to clone (a trajectory .jsonl or a folder of them, "
        "e.g. from `horizonrl demos`). Unset: collect demo_episodes with the env's expert.")
    demo_episodes: int = Field(0, ge=0, description="Expert episodes to collect (train-split "
                               "seeds drawn from the run seed) when `demos` is unset.")
    demo_noise: float = Field(0.0, ge=0, lt=1, description="Probability of a random valid "
                              "action per demo turn (kept in context, masked out of the loss).")
    demo_horizon: int = Field(30, ge=1, description="Turn cap of an expert episode (formerly "
                              "demo_max_turns).")
    thought: Literal["short", "none"] = Field(
        "short", description="Demo reply format: 'Thought: I will X.\\nAction: X', or the "
        "action line alone.")
    only_successful: bool = Field(True, description="Clone only episodes the expert solved.")
    sft_batch_size: int = Field(32, ge=1, description="Episodes per SFT step.")
    sft_lr: float = Field(1e-3, gt=0, description="SFT peak learning rate (warm-up, cosine "
                          "to 10%).")
    eval_tasks: int = Field(32, ge=0, description="Eval-split tasks to score the base and the "
                            "cloned model on before RL (0: skip).")
    eval_horizon: int | None = Field(
        None, ge=1, description="Horizon (turn budget) of that evaluation; unset: the "
        "curriculum's last horizon (formerly eval_max_turns).")
    replay_batch: int = Field(
        0, ge=0, description="Demonstrations replayed during RL: after every RL update, one "
        "SFT step (at the RL learning rate) on this many episodes drawn from the demos "
        "(init.demos, or those the warm start collected); 0: off.")

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        return renamed_fields(data, {"demo_max_turns": "demo_horizon",
                                     "eval_max_turns": "eval_horizon"}, "init")

    @model_validator(mode="after")
    def _has_data(self) -> InitConfig:
        if self.sft_epochs > 0 and self.demos is None and self.demo_episodes == 0:
            raise ValueError("init: sft_epochs > 0 needs demonstrations: set init.demos (a "
                             "path) or init.demo_episodes (collect with the expert)")
        if self.replay_batch and self.demos is None and not (
                self.sft_epochs > 0 and self.demo_episodes > 0):
            raise ValueError("init.replay_batch > 0 needs demonstrations to replay: set "
                             "init.demos, or a warm start that collects them (init.sft_epochs "
                             "> 0 and init.demo_episodes > 0)")
        return self


class RunConfig(BaseModel):
    """Everything a training run needs; saved resolved as config.yaml in the run directory."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        "babyai-local", description="Run name; the run dir is runs/<name>__<seed>__<time>."
    )
    seed: int = Field(0, description="Seeds task sampling, sampling and initialisation.")
    iterations: int = Field(60, ge=1, description="Training iterations (policy updates).")
    run_root: str = Field("runs", description="Parent folder of run directories.")
    checkpoint_every: int = Field(
        20, ge=0, description="Save a checkpoint every N steps (0: at the end only)."
    )
    save_trajectories: bool = Field(
        False, description="Write every trained trajectory to <run>/trajectories/"
        "step_N.jsonl (protobuf JSON): data for `horizonrl sft|rs|dpo` and for inspection."
    )
    keep_checkpoints: int = Field(
        3, ge=1, description="Keep the newest K checkpoints of the run; older ones are deleted "
        "after a new one is complete."
    )
    mode: Literal["sync", "async"] = Field(
        "sync", description="sync: generation and training take turns (AgentGym-RL); async: "
        "generators keep producing with the weights they hold while the learner trains on what "
        "arrives, with the decoupled loss correcting for the lag.")
    max_staleness: int = Field(
        1, ge=0, description="Async: trajectories more than this many policy versions behind "
        "the learner are dropped (and counted) instead of trained on; and generation runs at "
        "most this many steps ahead of the learner (AReaL's bound): a rollout starts only once "
        "its first step is within it, and with partial rollouts each episode only once its own "
        "step is.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Starting checkpoint.")
    ray: RayConfig = Field(default_factory=RayConfig, description="Ray cluster.")
    metrics: MetricsConfig = Field(default_factory=MetricsConfig, description="Prometheus.")
    env: EnvConfig = Field(default_factory=EnvConfig, description="Environment and its pool.")
    extra_envs: list[EnvConfig] = Field(
        default_factory=list, description="More environments mixed into the run beside `env`: "
        "each task is drawn from env i with probability weight_i / sum(weights); every GRPO "
        "group stays within one env; metrics are labelled by env label. The tiny model (if "
        "built) learns from `env`'s transcripts only.",
    )
    generator: GeneratorConfig = Field(default_factory=GeneratorConfig, description="Rollout.")
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig, description="Horizon.")
    agent: AgentConfig = Field(default_factory=AgentConfig,
                               description="Outside agents through an OpenAI endpoint.")
    learner: LearnerConfig = Field(default_factory=LearnerConfig, description="Learner group.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Periodic evaluation.")
    init: InitConfig = Field(default_factory=InitConfig, description="Warm start (demos + "
                             "behaviour cloning) before RL.")

    @property
    def envs(self) -> list[EnvConfig]:
        """Every environment of the run, `env` first."""
        return [self.env, *self.extra_envs]

    @model_validator(mode="after")
    def _unique_env_labels(self) -> RunConfig:
        keys = [e.key for e in self.envs]
        if len(set(keys)) != len(keys):
            raise ValueError(f"env labels must be unique across env and extra_envs, got {keys}; "
                             "set `label` on envs that share a name")
        cur = self.curriculum
        for name, table in (("env_horizons", cur.env_horizons), ("env_weights", cur.env_weights)):
            unknown = sorted(set(table) - set(keys))
            if unknown:
                raise ValueError(f"curriculum.{name} names {unknown}, which are not env labels "
                                 f"of this run ({keys})")
        if self.model.path is None and self.generator.max_context_tokens > TINY_MAX_POSITIONS:
            raise ValueError(f"generator.max_context_tokens ({self.generator.max_context_tokens}) "
                             f"exceeds the tiny model's {TINY_MAX_POSITIONS} positions; lower it "
                             "or set model.path to a model with a longer context")
        stages = len(next(iter(cur.env_weights.values()), []))  # the curriculum checked lengths
        for stage in range(stages):
            weights = [cur.env_weights.get(e.key, [e.weight] * stages)[stage] for e in self.envs]
            if sum(weights) <= 0:
                raise ValueError(f"curriculum.env_weights: stage {stage} gives every env "
                                 "weight 0")
        self._window_fits()
        self._async_fits()
        self._urls_fit()
        return self

    def _urls_fit(self) -> None:
        """`env.kwargs.urls` gives every replica of the run its own server: exactly one each."""
        for e in self.envs:
            urls = e.kwargs.get("urls")
            need = self.generator.num_generators * e.num_actors * e.replicas_per_actor
            if urls is not None and len(urls) != need:
                raise ValueError(
                    f"env {e.key!r}: kwargs.urls lists {len(urls)} servers for {need} replicas "
                    f"(generator.num_generators {self.generator.num_generators} x num_actors "
                    f"{e.num_actors} x replicas_per_actor {e.replicas_per_actor}): one server "
                    "per replica")

    def _async_fits(self) -> None:
        """Learner settings that async mode would otherwise ignore without a word."""
        if self.mode != "async":
            if self.generator.partial_rollouts:
                raise ValueError("generator.partial_rollouts needs mode=async: in sync mode "
                                 "no episode is in flight while the learner trains")
            if self.generator.rollout_steps > 1:
                raise ValueError("generator.rollout_steps > 1 needs mode=async: a sync step "
                                 "rolls out exactly the tasks it trains on")
            return
        if self.learner.dynamic_sampling:
            raise ValueError("learner.dynamic_sampling does not work with mode=async: the "
                             "async driver trains on whatever groups have arrived and does not "
                             "sample more; use mode=sync or dynamic_sampling=false")
        if self.learner.weight_sync == "broadcast":
            raise ValueError("learner.weight_sync=broadcast does not work with mode=async: "
                             "async generators pick up new weights through the object store "
                             "when their rollout ends; use mode=sync or "
                             "weight_sync=object_store")

    def _window_fits(self) -> None:
        """Window-context episodes train one row per turn; the learners that need the whole
        episode in one row cannot take them."""
        if self.generator.context.mode != "window":
            return
        from horizonrl.learner.credit import estimator_class

        algo = self.learner.algorithm
        est = estimator_class(algo)
        if est.whole_episodes:
            raise ValueError(f"generator.context.mode=window does not work with "
                             f"learner.algorithm={algo}: {est.window_hint}")


class ConfigError(ValueError):
    """A config problem a user can fix; the message names the field."""


def apply_override(tree: dict[str, Any], override: str) -> None:
    """Set `a.b.c=value` in a nested dict; the value is parsed as YAML (1e-4, true, [4, 8])."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like section.field=value")
    key, raw = override.split("=", 1)
    parts = key.strip().split(".")
    node = tree
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"override {override!r}: {p!r} is a value, not a section")
        node = nxt
    try:
        node[parts[-1]] = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {override!r}: value is not valid YAML ({exc})") from None


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    """Read YAML (or defaults), apply dotted overrides, validate with errors naming fields."""
    tree: dict[str, Any] = {}
    if path is not None:
        try:
            tree = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
        if not isinstance(tree, dict):
            raise ConfigError(f"config file {path} must hold a mapping of sections")
    for ov in overrides:
        apply_override(tree, ov)
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as exc:
        lines = [f"  {'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}"
                 for e in exc.errors()]
        raise ConfigError("invalid config:\n" + "\n".join(lines)) from None


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
