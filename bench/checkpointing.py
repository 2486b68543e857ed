"""Gradient checkpointing on this machine: peak memory and step time with and without it.

    .venv/bin/python bench/checkpointing.py --out docs/precision/checkpointing.json

Each setting runs in a fresh process (so its peak RSS is its own): a random-init Qwen2 of
`--hidden` x `--layers` (the tokenizer-free shape of the tiny model's presets), `--steps` AdamW
steps on `--batch` x `--tokens` random tokens, with HF gradient checkpointing on or off as
`learner.gradient_checkpointing` turns it on in the learner ranks (non-reentrant). Reported:
peak RSS over the process's life, the peak's rise over the RSS before the first step (model and
optimizer state allocated), seconds per step and the losses (equal with and without: the same
numbers are recomputed).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from horizonrl.cluster.ops.provenance import command_line

ROOT = Path(__file__).resolve().parents[1]


def one(args: argparse.Namespace, checkpointing: bool) -> dict:
    import psutil
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=2048, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=4096, tie_word_embeddings=True, use_cache=False))
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(3, 2048, (args.batch, args.tokens),
                        generator=torch.Generator().manual_seed(0))
    opt.step()  # allocate AdamW's state before the baseline is read
    before = psutil.Process().memory_info().rss
    losses, t0 = [], time.perf_counter()
    for _ in range(args.steps):
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(round(loss.item(), 6))
    seconds = (time.perf_counter() - t0) / args.steps
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {"gradient_checkpointing": checkpointing,
            "params": sum(p.numel() for p in model.parameters()),
            "peak_rss_mb": round(peak / 2**20, 1),
            "peak_rise_mb": round((peak - before) / 2**20, 1),
            "seconds_per_step": round(seconds, 3), "losses": losses}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default=None)
    p.add_argument("--child", choices=["on", "off"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(one(args, args.child == "on")))
        return
    rows = []
    for setting in ("off", "on"):
        cmd = [sys.executable, __file__, "--child", setting, "--hidden", str(args.hidden),
               "--layers", str(args.layers), "--batch", str(args.batch), "--tokens",
               str(args.tokens), "--steps", str(args.steps)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    off, on = rows
    summary = {"peak_rise_ratio": round(on["peak_rise_mb"] / off["peak_rise_mb"], 3),
               "step_time_ratio": round(on["seconds_per_step"] / off["seconds_per_step"], 3),
               "max_loss_diff": max(abs(a - b) for a, b in zip(on["losses"], off["losses"]))}
    print(summary)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({
            "command": command_line(),
            "rows": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
