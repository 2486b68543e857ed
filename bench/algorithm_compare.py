"""GRPO, RLOO, REINFORCE++ and PPO (and rejection sampling) on the embedded BabyAI default,
each from the CLI with the same seed and budget, summarised as one table.

    .venv/bin/python bench/algorithm_compare.py [--iterations 60] [--algorithms grpo rloo ...] \
        [--out docs/algorithms]

Each run is `horizonrl train --config configs/babyai-local.yaml learner.algorithm=X` in its own
process (so a crash in one is reported, not fatal); the runs go to runs/algorithms__<time>/.
Writes OUT/results.json (the command, the wall time, each algorithm's figures) and OUT/results.md
(OUT defaults to the runs' folder) and prints the table: mean success over the first and last
fifth of the steps, the best step, invalid actions in the last fifth, and seconds per iteration.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

if not __package__:  # run as `python bench/NAME.py`: the checkout on the path, not bench/
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.report import run_folders, write_results

ROOT = Path(__file__).resolve().parents[1]
ALGORITHMS = ["grpo", "rloo", "reinforce_pp", "ppo", "rejection_sampling"]


def run(algorithm: str, iterations: int, out: Path) -> tuple[int, Path | None, float]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "horizonrl.cluster.cli",
         "train", "--config", "configs/babyai-local.yaml",
         f"name={algorithm}", f"iterations={iterations}", f"run_root={out}", "metrics.port=0",
         "checkpoint_every=0", f"learner.algorithm={algorithm}",
         # fp32, not the default's auto: the comparison then means the same on every CPU.
         "learner.dtype=float32", "generator.dtype=float32"],
        cwd=ROOT, capture_output=True, text=True, timeout=3600)
    (out / f"{algorithm}.log").write_text(proc.stdout + proc.stderr)
    runs = sorted(out.glob(f"{algorithm}__*"))
    return proc.returncode, (runs[-1] if runs else None), time.perf_counter() - t0


def summarise(run_dir: Path) -> dict[str, float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    fifth = max(1, len(rows) // 5)
    succ = [r["success_rate"] for r in rows]
    return {"first": sum(succ[:fifth]) / fifth, "last": sum(succ[-fifth:]) / fifth,
            "best": max(succ), "invalid_last": sum(r["invalid_action_rate"]
                                                   for r in rows[-fifth:]) / fifth,
            "sec_per_it": sum(r["seconds/iteration"] for r in rows[1:]) / max(1, len(rows) - 1),
            "steps": len(rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--algorithms", nargs="+", default=ALGORITHMS, choices=ALGORITHMS)
    ap.add_argument("--out", help="folder for results.json and results.md (default: the runs')")
    args = ap.parse_args()
    runs, out = run_folders(ROOT, "algorithms", args.out)
    t0 = time.perf_counter()
    results: dict[str, dict | None] = {}
    lines = ["| algorithm | success, first fifth | success, last fifth | best step | "
             "invalid actions, last fifth | s/iteration | status |",
             "|---|---|---|---|---|---|---|"]
    for algo in args.algorithms:
        print(f"[bench] {algo}: {args.iterations} iterations ...", flush=True)
        rc, run_dir, secs = run(algo, args.iterations, runs)
        if rc != 0 or run_dir is None:
            results[algo] = None
            lines.append(f"| {algo} | | | | | | failed (rc {rc}), see {runs}/{algo}.log |")
            continue
        s = summarise(run_dir)
        results[algo] = {**s, "seconds": round(secs, 1)}
        lines.append(f"| {algo} | {s['first']:.3f} | {s['last']:.3f} | {s['best']:.3f} | "
                     f"{s['invalid_last']:.3f} | {s['sec_per_it']:.2f} | ok, {s['steps']} steps, "
                     f"{secs:.0f} s |")
        print(lines[-1], flush=True)
    table = "\n".join(lines)
    write_results(out, {"iterations": args.iterations, "algorithms": results}, table, started=t0)
    print(f"\n{table}\n\nwritten to {out}/results.json and results.md")


if __name__ == "__main__":
    main()
