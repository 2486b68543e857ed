"""Sync vs async (max_staleness 1 and 2) on the embedded BabyAI default, same budget and seed.

    .venv/bin/python bench/async_vs_sync.py [--iterations 40] [--generators 1] [--out DIR]

Each mode runs `horizonrl train --config configs/babyai-local.yaml` for the same number of
iterations (policy updates) in its own process. Printed, as ratios to sync: iterations per hour
and trained samples per hour (wall clock from the first to the last iteration, so start-up is
excluded), plus success over the last fifth and the mean lag of trained data. Reading it on this
machine: generation and the learner ranks share 2 CPU cores, so overlapping them gains only what
one phase leaves idle; on a cluster where generators and learner own their devices the overlap is
the point. Runs go to runs/async-vs-sync__<time>/; OUT/results.json (the command, the wall time,
each mode's figures) and OUT/results.md (OUT defaults to the runs' folder).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from report import write_results

ROOT = Path(__file__).resolve().parents[1]
MODES = {"sync": ["mode=sync"],
         "async, staleness 1": ["mode=async", "max_staleness=1"],
         "async, staleness 2": ["mode=async", "max_staleness=2"],
         "async, partial rollouts": ["mode=async", "max_staleness=1",
                                     "generator.partial_rollouts=true"]}


def run(name: str, overrides: list[str], iterations: int, generators: int,
        out: Path) -> Path | None:
    tag = name.replace(", ", "-").replace(" ", "")
    proc = subprocess.run(
        [sys.executable, "-m", "horizonrl.cluster.cli",
         "train", "--config", "configs/babyai-local.yaml",
         f"name={tag}", f"iterations={iterations}", f"run_root={out}", "metrics.port=0",
         "checkpoint_every=0", f"generator.num_generators={generators}",
         "learner.dtype=fp32", "generator.dtype=float32",  # fixed, not auto: same on any CPU
         *overrides],
        cwd=ROOT, capture_output=True, text=True, timeout=3600)
    (out / f"{tag}.log").write_text(proc.stdout + proc.stderr)
    runs = sorted(out.glob(f"{tag}__*"))
    return runs[-1] if proc.returncode == 0 and runs else None


def summarise(run_dir: Path) -> dict[str, float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # Iteration 0 carries vLLM's warm-up; time the rest.
    secs = sum(r["seconds/iteration"] for r in rows[1:])
    samples = sum(r["trajectories_trained"] for r in rows[1:])
    fifth = max(1, len(rows) // 5)
    return {"its_per_hour": (len(rows) - 1) / secs * 3600,
            "samples_per_hour": samples / secs * 3600,
            "success_last": sum(r["success_rate"] for r in rows[-fifth:]) / fifth,
            "lag": sum(r.get("staleness_max", 0) for r in rows) / len(rows),
            "dropped": sum(r.get("async/dropped_stale", 0.0) for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--generators", type=int, default=1)
    ap.add_argument("--out", help="folder for results.json and results.md (default: the runs')")
    args = ap.parse_args()
    runs = ROOT / "runs" / f"async-vs-sync__{time.strftime('%Y%m%d-%H%M%S')}"
    runs.mkdir(parents=True)
    out = Path(args.out) if args.out else runs
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results = {}
    for name, overrides in MODES.items():
        print(f"[bench] {name}: {args.iterations} iterations ...", flush=True)
        run_dir = run(name, overrides, args.iterations, args.generators, runs)
        results[name] = summarise(run_dir) if run_dir else None
    base = results["sync"]
    lines = ["| mode | iterations/h | samples/h | vs sync (its) | vs sync (samples) | "
             "success, last fifth | max lag (mean) | dropped stale |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        if r is None:
            lines.append(f"| {name} | failed, see the log in {runs} |||||||")
            continue
        its = r["its_per_hour"] / base["its_per_hour"] if base else float("nan")
        smp = r["samples_per_hour"] / base["samples_per_hour"] if base else float("nan")
        lines.append(f"| {name} | {r['its_per_hour']:.0f} | {r['samples_per_hour']:.0f} | "
                     f"{its:.2f}x | {smp:.2f}x | {r['success_last']:.3f} | {r['lag']:.2f} | "
                     f"{r['dropped']:.0f} |")
    table = "\n".join(lines)
    write_results(out, {"iterations": args.iterations, "generators": args.generators,
                        "modes": results}, table, started=t0)
    print(f"\n{table}\n\nwritten to {out}/results.json and results.md")


if __name__ == "__main__":
    main()
