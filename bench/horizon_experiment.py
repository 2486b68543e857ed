"""The paper's horizon experiment at small scale: fixed-short, fixed-long, stepwise
(ScalingInter-RL) and adaptive horizon schedules, 3 seeds each, same sample budget.

    .venv/bin/python bench/horizon_experiment.py [--iterations 60] [--seeds 0 1 2]

Writes runs/horizon-experiment__<time>/: every run's metrics, results.md (a table) and
horizon_experiment.png (success and turns against step, mean over seeds, like the paper's
Figure 7). Every run sees the same tasks per step and the same number of episodes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHORT, LONG = 2, 8
SCHEDULES = {
    "fixed-short": ["curriculum.schedule=fixed", f"curriculum.horizons=[{SHORT}]"],
    "fixed-long": ["curriculum.schedule=fixed", f"curriculum.horizons=[{LONG}]"],
    "stepwise": ["curriculum.schedule=stepwise", f"curriculum.horizons=[{SHORT}, 4, {LONG}]"],
    "adaptive": ["curriculum.schedule=adaptive", f"curriculum.horizons=[{SHORT}, {LONG}]",
                 "curriculum.window=6", "curriculum.truncation_threshold=0.25"],
}


def run_one(name: str, overrides: list[str], seed: int, iterations: int, out: Path) -> list[dict]:
    from cluster.config import load_config
    from cluster.driver import Trainer
    from cluster.iteration import make_run_dir

    stage = max(1, iterations // 3)
    extra = [f"curriculum.steps_per_stage={stage}"] if name == "stepwise" else []
    cfg = load_config(ROOT / "configs/babyai-local.yaml", [
        f"name={name}", f"seed={seed}", f"iterations={iterations}", f"run_root={out}",
        "checkpoint_every=0", *overrides, *extra])
    with Trainer(cfg, run_dir=make_run_dir(cfg)) as trainer:
        rows = []
        for _ in range(iterations):
            m = trainer.step()
            rows.append({k: m[k] for k in ("step", "horizon", "success_rate", "turns_mean",
                                           "truncated_at_horizon_rate")})
            print(f"[{name} seed {seed}] step {m['step'] + 1}/{iterations} H {m['horizon']} "
                  f"success {m['success_rate']:.3f} turns {m['turns_mean']:.2f}", flush=True)
    return rows


def summarise(results: dict[str, dict[int, list[dict]]], out: Path, iterations: int) -> str:
    tail = max(1, iterations // 5)
    lines = ["| schedule | success, first fifth | success, last fifth | turns, last fifth | "
             "final horizon |", "|---|---|---|---|---|"]
    for name, by_seed in results.items():
        first = [statistics.fmean(r["success_rate"] for r in rows[:tail])
                 for rows in by_seed.values()]
        last = [statistics.fmean(r["success_rate"] for r in rows[-tail:])
                for rows in by_seed.values()]
        turns = [statistics.fmean(r["turns_mean"] for r in rows[-tail:])
                 for rows in by_seed.values()]
        final_h = sorted({rows[-1]["horizon"] for rows in by_seed.values()})
        lines.append(f"| {name} | {_ms(first)} | {_ms(last)} | {_ms(turns)} | "
                     f"{', '.join(map(str, final_h))} |")
    table = "\n".join(lines)
    (out / "results.md").write_text(
        f"# Horizon experiment ({len(next(iter(results.values())))} seeds, {iterations} "
        f"iterations, BabyAI GoToRedBall)\n\nMean ± std over seeds; fifths of the run.\n\n"
        f"{table}\n")
    return table


def _ms(xs: list[float]) -> str:
    return f"{statistics.fmean(xs):.3f} ± {statistics.pstdev(xs):.3f}"


def plot(results: dict[str, dict[int, list[dict]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, by_seed in results.items():
        n = min(len(rows) for rows in by_seed.values())
        steps = list(range(n))
        for ax, key in zip(axes, ("success_rate", "turns_mean")):
            mean = [statistics.fmean(rows[i][key] for rows in by_seed.values()) for i in steps]
            smooth = [statistics.fmean(mean[max(0, i - 4):i + 1]) for i in steps]  # 5-step MA
            ax.plot(steps, smooth, label=name)
    axes[0].set(title="Success rate (5-step moving average)", xlabel="training step")
    axes[1].set(title="Turns per episode", xlabel="training step")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    from cluster.config import RayConfig
    from cluster.runtime import ray_session

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--iterations", type=int, default=60)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--schedules", nargs="+", default=list(SCHEDULES))
    p.add_argument("--out", default="runs")
    args = p.parse_args()
    out = Path(args.out) / f"horizon-experiment__{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    results: dict[str, dict[int, list[dict]]] = {}
    with ray_session(RayConfig()):
        for name in args.schedules:
            for seed in args.seeds:
                rows = run_one(name, SCHEDULES[name], seed, args.iterations, out)
                results.setdefault(name, {})[seed] = rows
                (out / "results.json").write_text(json.dumps(results, indent=1))
    print(summarise(results, out, args.iterations))
    plot(results, out / "horizon_experiment.png")
    print(f"wrote {out}/results.md and horizon_experiment.png")


if __name__ == "__main__":
    main()
