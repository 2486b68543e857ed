"""What a learner rank's DeepSpeed engine is built from (its config, the learning-rate
schedule, the compute dtype and the CUDA ordinal Ray's GPU assignment gives the rank), and how
a rank's engines and RNG states are saved and restored."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import torch

from horizonrl.learner.config import LearnerConfig


def lr_factor(step: int, *, cfg: LearnerConfig) -> float:
    """LR multiplier for optimizer step `step` (0-based): linear warm-up in which step k uses
    (k+1)/warmup (DeepSpeed's WarmupLR gives the first update lr 0 and wastes it), then constant
    or cosine decay to min_lr_ratio over lr_decay_steps."""
    warmup = cfg.warmup_steps
    if step < warmup:
        return (step + 1) / warmup
    if cfg.lr_schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, cfg.lr_decay_steps - warmup))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def deepspeed_config(cfg: LearnerConfig, micro_batch: int, lr: float) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": cfg.grad_clip,
        # torch's AdamW: DeepSpeed's CPUAdam/FusedAdam JIT-compile for ~4 min each.
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": cfg.weight_decay,
                                                  "torch_adam": True}},
        "zero_optimization": {"stage": cfg.zero_stage},
        "bf16": {"enabled": cfg.dtype == "bfloat16"},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def local_gpu_ordinal(assigned: Sequence[str | int], visible: str | None) -> int | None:
    """This process's CUDA ordinal for the first GPU Ray assigned it, or None for none (the
    rank then trains on CPU even on a GPU node, instead of every such rank taking cuda:0).

    Ray sets CUDA_VISIBLE_DEVICES to the assigned GPUs, so the ordinal is their place in that
    list; with Ray told not to set it, the physical id is the ordinal."""
    if not assigned:
        return None
    first = str(assigned[0])
    if visible:
        ids = [x.strip() for x in visible.split(",")]
        if first not in ids:
            raise RuntimeError(f"Ray assigned GPU {first}, but CUDA_VISIBLE_DEVICES={visible}")
        return ids.index(first)
    return int(first)


def compute_dtype(cfg: LearnerConfig) -> torch.dtype:
    return torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32


def save_engines(path: str, engines: dict[str, Any], *, rank: int, updates: int) -> None:
    """Each DeepSpeed engine under `path/<name>` (None entries skipped; every rank writes its
    ZeRO partition) and this rank's RNG states and update count; every rank must call."""
    import random

    import numpy as np

    for name, engine in engines.items():
        if engine is not None:
            engine.save_checkpoint(os.path.join(path, name), tag="state")
    torch.save({"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                "python": random.getstate(), "updates": updates},
               os.path.join(path, f"rank{rank}_state.pt"))


def load_engines(path: str, engines: dict[str, Any], *, rank: int) -> int:
    """Restore what `save_engines` wrote (same world size and ZeRO stage), RNG states
    included; returns the update count."""
    import random

    import numpy as np

    for name, engine in engines.items():
        if engine is not None:
            loaded, _ = engine.load_checkpoint(os.path.join(path, name), tag="state")
            if loaded is None:
                raise FileNotFoundError(f"no {name} checkpoint under {path}")
    st = torch.load(os.path.join(path, f"rank{rank}_state.pt"), weights_only=False)
    torch.set_rng_state(st["torch"])
    np.random.set_state(st["numpy"])
    random.setstate(st["python"])
    return int(st["updates"])
