"""LR schedule and micro-batch arithmetic (pure functions; no DeepSpeed)."""

from __future__ import annotations

import math

import numpy as np

from horizonrl.learner.config import LearnerConfig
from horizonrl.learner.layout import rank_plan
from horizonrl.learner.worker import lr_factor


def test_warmup_then_constant_or_cosine():
    const = LearnerConfig(warmup_steps=4)
    assert [lr_factor(k, cfg=const) for k in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cos = LearnerConfig(warmup_steps=2, lr_schedule="cosine", lr_decay_steps=12,
                        min_lr_ratio=0.1)
    assert lr_factor(2, cfg=cos) == 1.0
    assert math.isclose(lr_factor(7, cfg=cos), 0.1 + 0.9 * 0.5)  # halfway: (7-2)/(12-2)
    assert math.isclose(lr_factor(12, cfg=cos), 0.1) and math.isclose(lr_factor(99, cfg=cos), 0.1)


def test_padded_micro_batches_respect_the_token_budget():
    attn = np.zeros((5, 10), dtype=np.int64)
    attn[:, :8] = 1  # width 8 after trimming
    batch = {"input_ids": np.zeros((5, 10), dtype=np.int64), "attention_mask": attn}

    def sizes(budget: int, agree=lambda n: n) -> list[int | None]:
        _, plan = rank_plan(batch, "padded", budget, agree=agree)
        return [None if r is None else len(r) for r in plan]

    assert sizes(0) == [5]
    assert sizes(16) == [2, 2, 1]  # 2 rows of 8 tokens per micro-batch
    assert sizes(4) == [1] * 5     # a row over budget still gets its own
    assert sizes(16, agree=lambda n: 7) == [1] * 5 + [None] * 2  # more passes than rows
