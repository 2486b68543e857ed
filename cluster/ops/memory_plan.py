"""Per-GPU memory of a run, from the model's HF `config.json` alone (no weights): what
`horizonrl train --dry-run` prints before any GPU is touched.

Learner (per rank, DeepSpeed ZeRO over `world_size` ranks): the compute-dtype parameters (whole
under ZeRO-1/2, a 1/N slice plus the largest gathered layer under ZeRO-3), gradients
(compute-dtype and fp32, sliced from ZeRO-2 on), fp32 master weights and Adam's two moments
(sliced); the frozen reference model when `kl_coef` > 0 (whole, in the compute dtype); the
activations of one micro-batch of `micro_batch_tokens` (per layer and token ~34 x hidden values
without checkpointing, after Korthikanti et al. 2022 with fused attention; with checkpointing
the layer inputs only plus one layer recomputed) and its fp32 logits. Generator (per engine):
weights plus the KV cache the run's episodes in flight need at full context.

    plan = memory_plan(shape, cfg)      # MemoryPlan: GiB per role and component
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The numbers of a decoder-only (Qwen2/Llama-style) config that memory depends on."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    tied: bool

    @classmethod
    def from_config(cls, path: str | Path) -> ModelShape:
        """From a model folder or its config.json."""
        path = Path(path)
        return cls.from_dict(json.loads((path / "config.json" if path.is_dir() else path)
                                        .read_text()))

    @classmethod
    def from_dict(cls, cfg: dict) -> ModelShape:
        """From an HF config as a dict."""
        return cls(vocab=cfg["vocab_size"], hidden=cfg["hidden_size"],
                   intermediate=cfg["intermediate_size"], layers=cfg["num_hidden_layers"],
                   heads=cfg["num_attention_heads"],
                   kv_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
                   tied=bool(cfg.get("tie_word_embeddings", False)))

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def layer_params(self) -> int:
        """One transformer block: q/k/v with biases (Qwen2), o, the gated MLP, two norms."""
        kv = self.kv_heads * self.head_dim
        attn = self.hidden * (self.hidden + 2 * kv) + self.hidden + 2 * kv + self.hidden ** 2
        return attn + 3 * self.hidden * self.intermediate + 2 * self.hidden

    def params(self) -> int:
        embed = self.vocab * self.hidden
        return self.layers * self.layer_params() + embed * (1 if self.tied else 2) + self.hidden


@dataclass(frozen=True, slots=True)
class RolePlan:
    role: str
    parts: dict[str, float]  # GiB per component
    share: float = 1.0  # of its GPU the role may take (vLLM's gpu_memory_utilization)

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def model_states_bytes(params: int, *, zero_stage: int, world_size: int, dtype: str,
                       largest_layer: int) -> dict[str, float]:
    """Bytes per rank of parameters, gradients and optimizer state under ZeRO."""
    b = _BYTES[dtype]
    mixed = b < 4  # 16-bit compute keeps fp32 master weights and fp32 gradients
    n = world_size
    if zero_stage == 3:  # parameters sliced; the largest layer gathered (and prefetched)
        weights = b * params / n + 2 * b * largest_layer
    else:
        weights = b * params
    # Gradients: ZeRO-1 keeps them whole, ZeRO-2 reduces them into this rank's slice (in the
    # compute dtype, then an fp32 copy for the step); ZeRO-3 reduces straight into the fp32
    # slice. The same counts as DeepSpeed's own estimators (tests/unit/test_memory_plan.py).
    grads = b * params / n if zero_stage >= 2 else b * params
    if mixed:
        grads = (0.0 if zero_stage == 3 else grads) + 4 * params / n
    return {"parameters": weights, "gradients": grads,
            "master_weights": 4 * params / n if mixed else 0.0,
            "adam_moments": 8 * params / n}


def activation_bytes(shape: ModelShape, *, tokens: int, dtype: str,
                     checkpointing: bool) -> dict[str, float]:
    """One micro-batch's saved activations and its logits (computed in fp32 for the loss)."""
    b = _BYTES[dtype]
    per_layer_token = 34 * shape.hidden * b / 2  # Korthikanti's 34h bytes are 16-bit values
    if checkpointing:
        acts = tokens * (shape.layers * shape.hidden * b + per_layer_token)
    else:
        acts = tokens * shape.layers * per_layer_token
    # logits in the compute dtype, their fp32 copy and log_softmax: the vocabulary dominates
    logits = tokens * shape.vocab * (b + 4 + 4)
    return {"activations": acts, "logits": logits}


def kv_cache_bytes(shape: ModelShape, *, tokens: int, dtype: str) -> float:
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * _BYTES[dtype] * tokens


def memory_plan(shape: ModelShape, *, zero_stage: int, world_size: int, dtype: str,
                micro_batch_tokens: int, checkpointing: bool, kl_coef: float,
                generator_dtype: str, context_tokens: int,
                gpu_memory_utilization: float = 0.9) -> list[RolePlan]:
    """GiB per GPU of a learner rank and of a generator engine (weights plus the KV cache of
    one sequence at full context, the least vLLM starts with)."""
    params = shape.params()
    learner = model_states_bytes(params, zero_stage=zero_stage, world_size=world_size,
                                 dtype=dtype, largest_layer=max(shape.layer_params(),
                                                                shape.vocab * shape.hidden))
    if kl_coef > 0:
        learner["reference_model"] = _BYTES[dtype] * params
    learner.update(activation_bytes(shape, tokens=micro_batch_tokens, dtype=dtype,
                                    checkpointing=checkpointing))
    generator = {"weights": _BYTES[generator_dtype] * params,
                 "kv_cache": kv_cache_bytes(shape, tokens=context_tokens, dtype=generator_dtype)}
    return [RolePlan("learner rank", {k: v / GIB for k, v in learner.items()}),
            RolePlan("generator", {k: v / GIB for k, v in generator.items()},
                     share=gpu_memory_utilization)]


def format_plan(plans: list[RolePlan], *, gpu_gib: float | None) -> tuple[list[str], bool]:
    """Printable lines, and whether every role fits `gpu_gib` (True when unknown)."""
    lines, fits = [], True
    for plan in plans:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in plan.parts.items())
        lines.append(f"  {plan.role}: {plan.total:.2f} GiB per GPU ({parts})")
        if gpu_gib is not None and plan.total > plan.share * gpu_gib:
            fits = False
            lines.append(f"    does not fit: needs {plan.total:.1f} GiB per GPU, has "
                         f"{gpu_gib:.1f}" + (f" x {plan.share:g}" if plan.share < 1 else ""))
    return lines, fits
