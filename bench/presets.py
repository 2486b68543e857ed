"""The locally built model's size presets on this machine: parameters, SFT tokens/s (fp32 and
bf16 autocast, one torch thread, as one learner rank trains) and vLLM generation tokens/s.

    .venv/bin/python bench/presets.py [--presets xs s m] [--out docs/presets.json]

Each preset is built from a config with random weights (a tokenizer trained on 300 BabyAI
transcripts, no pre-training: throughput does not depend on what the weights know). SFT: AdamW
steps on batches of 8 x 512 tokens. Generation: 64 prompts of 256 tokens, 64 new tokens each,
sampled at temperature 1 (after one warm-up call), in float32 and in bfloat16 (each engine
built, warmed and timed in turn).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from horizonrl.cluster.ops.provenance import command_line

ROOT = Path(__file__).resolve().parents[1]


def sft_tokens_per_second(model, *, bf16: bool, steps: int = 4, batch: int = 8,
                          width: int = 512) -> float:
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(3, model.config.vocab_size, (batch, width))
    model.train()

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()  # warm-up (allocations, kernels)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return steps * batch * width / (time.perf_counter() - t0)


def generation_tokens_per_second(path: str, *, prompts: int = 64, prompt_len: int = 256,
                                 new: int = 64, dtype: str = "float32") -> float:
    import random

    from horizonrl.actors.engine import VLLMEngine

    engine = VLLMEngine(path, seed=0, max_model_len=1024, stop_token_ids=[], dtype=dtype)
    rng = random.Random(0)
    batch = [[rng.randrange(3, 300) for _ in range(prompt_len)] for _ in range(prompts)]
    engine.generate(batch[:8], max_tokens=8, temperature=1.0)  # warm-up
    t0 = time.perf_counter()
    out = engine.generate(batch, max_tokens=new, temperature=1.0)
    made = sum(len(c.token_ids) for c in out)
    return made / (time.perf_counter() - t0)


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from horizonrl.cluster.model.tiny_model import build_tiny_model

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--presets", nargs="+", default=["xs", "s", "m"])
    p.add_argument("--out", default="docs/presets.json")
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = {}
    for preset in args.presets:
        with tempfile.TemporaryDirectory() as tmp:
            path = build_tiny_model(Path(tmp) / preset, preset=preset, transcripts=300,
                                    pretrain_steps=0)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            row = {"params": sum(p.numel() for p in model.parameters()),
                   "hidden_size": model.config.hidden_size,
                   "layers": model.config.num_hidden_layers,
                   "sft_tokens_per_s_fp32": round(sft_tokens_per_second(model, bf16=False)),
                   "sft_tokens_per_s_bf16": round(sft_tokens_per_second(model, bf16=True)),
                   "generation_tokens_per_s": round(generation_tokens_per_second(str(path))),
                   "generation_tokens_per_s_bf16": round(generation_tokens_per_second(
                       str(path), dtype="bfloat16"))}
            del model
        rows[preset] = row
        print(preset, row, flush=True)
    Path(args.out).write_text(json.dumps({"command": command_line(),
                                          "presets": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
