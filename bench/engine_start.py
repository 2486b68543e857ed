"""A new generator's first seconds on CPU: vLLM engine start and first generate, in three cases:
`compiled`, the sampler's torch.compile left on (vLLM's own choice); `eager`, off (what
actors/engine.py does on CPU); `eager_unfrozen`, off and without the engine's gc.freeze() around
vLLM's start (so that vLLM's gc.collect() calls walk every object the imports made).

    .venv/bin/python bench/engine_start.py --repeats 3 --out docs/engine/start.json

Each case runs in a fresh process (a new generator starts in one): the engine on the default
config's tiny model, then `--generates` lock-step batches of 64 prompts. It records the engine
start, the first and the later generates, and the process's CPU seconds (its own and its
children's). The cases alternate so that machine noise falls on both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from horizonrl.cluster.ops.provenance import command_line

ROOT = Path(__file__).resolve().parents[1]
CASES = ("compiled", "eager", "eager_unfrozen")


def one_case(model: str, case: str, generates: int) -> dict:
    """In this process: start the engine, generate, report times (seconds) and CPU seconds."""
    t0 = time.perf_counter()
    from horizonrl.actors.engine import VLLMEngine

    if case == "eager_unfrozen":  # the engine's gc.freeze()/unfreeze() made no-ops
        import gc

        gc.freeze = gc.unfreeze = lambda: None

    engine = VLLMEngine(model, seed=0, max_model_len=1024, stop_token_ids=[2])
    start = time.perf_counter() - t0
    import torch._dynamo

    torch._dynamo.config.disable = case != "compiled"  # compiled: as vLLM's sampler asks
    prompts = [[5 + i % 7, 6, 7, 8, 9, 10, 11, 12] * (1 + i % 5) for i in range(64)]
    times = []
    for _ in range(generates):
        t = time.perf_counter()
        engine.generate(prompts, max_tokens=8, temperature=1.0)
        times.append(time.perf_counter() - t)
    cpu = os.times()
    return {"start_s": start, "first_generate_s": times[0],
            "later_generate_s": statistics.mean(times[1:]) if len(times) > 1 else None,
            "cpu_s": cpu.user + cpu.system + cpu.children_user + cpu.children_system}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, default=3, help="processes per case")
    p.add_argument("--generates", type=int, default=5, help="batches per process")
    p.add_argument("--out", help="the results file (required but in a child)")
    p.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case:  # the child: one case, its figures on the last line
        print(json.dumps(one_case(args.model, args.case, args.generates)))
        return
    if not args.out:
        p.error("--out is required")

    from horizonrl.cluster.config import load_config
    from horizonrl.cluster.model.load import ensure_model

    cfg = load_config(ROOT / "configs/babyai-local.yaml")
    model = str(ensure_model(cfg.model, env=cfg.env))
    runs: dict[str, list[dict]] = {case: [] for case in CASES}
    for i in range(args.repeats):
        for case in runs:
            out = subprocess.run(
                [sys.executable, "-m", "bench.engine_start", "--case", case, "--model", model,
                 "--generates", str(args.generates)],
                cwd=ROOT, capture_output=True, text=True, timeout=600, check=True)
            runs[case].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"[engine_start] {i + 1}/{args.repeats} {case}: {runs[case][-1]}", flush=True)
    mean = {case: {k: round(statistics.mean(r[k] for r in rs), 3) for k in rs[0]}
            for case, rs in runs.items()}
    ratios = {f"{a}_over_{b}": {k: round(mean[a][k] / mean[b][k], 3) for k in mean[a]}
              for a, b in (("eager", "compiled"), ("eager", "eager_unfrozen"))}
    result = {"command": command_line(), "cpus": os.cpu_count(), "repeats": args.repeats,
              "generates": args.generates, "mean": mean, **ratios, "runs": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({"mean": mean, **ratios}, indent=1))


if __name__ == "__main__":
    main()
