"""Training with a window context against the full context, same config and seeds.

    .venv/bin/python bench/window_training.py --config configs/babyai-local.yaml --seeds 0 1 2 \
        --variants full window:5 window:1 --out docs/context/training.json

One `horizonrl train` per variant and seed (in a subprocess, runs under --runs): `full` is the
config as it is, `window:K` adds generator.context.mode=window keep_turns=K. With K at least the
config's largest horizon the prompts are the full ones, so the curve should match full mode
within seed noise; a smaller K trains on shorter prompts. Per run, from its metrics.jsonl:
success over the first and last fifth of the steps, the mean turns and training rows per
episode, the episodes the context limit cut, prompt tokens per step and seconds per iteration;
then mean and spread over seeds per variant.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

if not __package__:  # run as `python bench/NAME.py`: the checkout on the path, not bench/
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench import long_horizon
from horizonrl.cluster.ops.provenance import command_line

ROOT = Path(__file__).resolve().parents[1]


def overrides(variant: str) -> list[str]:
    if variant == "full":
        return []
    mode, _, k = variant.partition(":")
    if mode != "window" or not k.isdigit():
        raise SystemExit(f"variant {variant!r}: use full or window:K")
    return ["generator.context.mode=window", f"generator.context.keep_turns={k}"]


def train(config: str, variant: str, seed: int, runs: Path, extra: list[str]) -> Path:
    """One run (bench/long_horizon.py's: a subprocess, continued if an earlier invocation
    left it) under RUNS/<variant>/seed<S>."""
    # fp32, not the embedded default's auto: the comparison then means the same on every CPU.
    fixed = ["learner.dtype=float32", "generator.dtype=float32"]
    run_dir, _, _ = long_horizon.train(config, seed, runs / variant.replace(":", ""),
                                       [*fixed, *overrides(variant), *extra])
    return run_dir


def summarise(run_dir: Path) -> dict[str, float]:
    ms = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    fifth = max(1, len(ms) // 5)

    def mean(key: str, rows: list[dict]) -> float:
        return statistics.fmean(m[key] for m in rows)

    return {"steps": len(ms), "success_first_fifth": mean("success_rate", ms[:fifth]),
            "success_last_fifth": mean("success_rate", ms[-fifth:]),
            "rows_per_episode": mean("rows_per_episode", ms),
            "turns_mean": mean("turns_mean", ms),
            "cut_by_context_rate": mean("cut_by_context_rate", ms),
            "cut_by_context_episodes": sum(round(m["cut_by_context_rate"] * (
                m["trajectories_generated"] - m["failed_episodes"])) for m in ms),
            "prompt_tokens_per_step": mean("prompt_tokens", ms),
            "prefix_cache_hit_rate": mean("prefix_cache_hit_rate", ms),
            "iteration_seconds": mean("seconds/iteration", ms),
            "success_curve": [round(m["success_rate"], 4) for m in ms]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/babyai-local.yaml")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--variants", nargs="+", default=["full", "window:5", "window:1"])
    p.add_argument("--runs", default="runs/window-training")
    p.add_argument("--out", default="docs/context/training.json")
    p.add_argument("overrides", nargs="*", help="config overrides for every run")
    args = p.parse_args()
    results = {}
    for variant in args.variants:
        per_seed = {}
        for seed in args.seeds:
            run_dir = train(args.config, variant, seed, Path(args.runs), args.overrides)
            per_seed[str(seed)] = summarise(run_dir)
            print(variant, seed, {k: v for k, v in per_seed[str(seed)].items()
                                  if k != "success_curve"}, flush=True)
        keys = [k for k in next(iter(per_seed.values())) if k not in ("success_curve", "steps")]
        summary = {}
        for k in keys:
            vals = [r[k] for r in per_seed.values()]
            summary[k] = {"mean": round(statistics.fmean(vals), 4),
                          "std": round(statistics.pstdev(vals), 4)}
        results[variant] = {"summary": summary, "per_seed": per_seed}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": command_line(),
                               "config": args.config, "seeds": args.seeds,
                               "results": results}, indent=1) + "\n")
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
