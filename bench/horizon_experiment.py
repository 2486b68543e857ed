"""The paper's horizon experiment at small scale: fixed-short, fixed-long, stepwise
(ScalingInter-RL) and adaptive horizon schedules, 3 seeds each, same sample budget.

    .venv/bin/python bench/horizon_experiment.py [--iterations 60] [--seeds 0 1 2]
    # on a long task, from a behaviour-cloned model, each run scored at one fixed horizon:
    .venv/bin/python bench/horizon_experiment.py --config configs/babyai-maze-bc-rl.yaml \
        --warm-start --horizons 5 10 20 --eval-turns 20 --eval-tasks 100

`--warm-start` first runs the config's own warm start (expert demos, behaviour cloning) once, at
the first seed, and starts every run from that clone; `--model M` starts them from a checkpoint
you already have.

Training runs go to RUNS/horizon-experiment__<time>/ (`--runs`, default runs); results.json (the
command and, per schedule and seed, each step's figures), results.md (a table) and
horizon_experiment.png (success and turns against step, mean over seeds, like the paper's
Figure 7) go to `--out` (default: beside the runs). Every run sees the same tasks per step and
the same number of episodes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if not __package__:  # run as `python bench/NAME.py`: the checkout on the path, not bench/
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.long_horizon import train
from horizonrl.cluster.ops.png import save_png
from horizonrl.cluster.ops.provenance import command_line

ROOT = Path(__file__).resolve().parents[1]

def schedules(short: int, mid: int, long: int) -> dict[str, list[str]]:
    """The four schedules of the comparison, as config overrides."""
    step = max(1, (long - short) // 3)
    return {
        "fixed-short": ["curriculum.schedule=fixed", f"curriculum.horizons=[{short}]"],
        "fixed-long": ["curriculum.schedule=fixed", f"curriculum.horizons=[{long}]"],
        "stepwise": ["curriculum.schedule=stepwise",
                     f"curriculum.horizons=[{short}, {mid}, {long}]"],
        "adaptive": ["curriculum.schedule=adaptive", f"curriculum.horizons=[{short}, {long}]",
                     f"curriculum.horizon_step={step}",
                     "curriculum.window=6", "curriculum.truncation_threshold=0.25"],
    }


def warm_start(config: str, seed: int, runs: Path) -> tuple[Path, float]:
    """The config's warm start, once, at `seed`: a `horizonrl train` of one RL step (the
    config's demos and behaviour cloning come first) in a subprocess, before this script starts
    Ray. Returns the clone (init/model, written before RL) and the wall seconds."""
    run_dir, seconds, _ = train(config, seed, runs / "warm-start",
                                ["iterations=1", "checkpoint_every=0"])
    return run_dir / "init" / "model", seconds


def run_one(name: str, overrides: list[str], seed: int, iterations: int, out: Path,
            args: argparse.Namespace) -> list[dict]:
    from horizonrl.cluster.config import load_config
    from horizonrl.cluster.rollout.iteration import make_run_dir
    from horizonrl.cluster.train.driver import Trainer

    stage = max(1, iterations // 3)
    extra = [f"curriculum.steps_per_stage={stage}"] if name == "stepwise" else []
    if args.model:  # RL from this checkpoint (e.g. a warm start's clone), no warm start here
        extra += [f"model.path={args.model}", "init.sft_epochs=0"]
    if args.eval_turns:  # one replica per eval task (the generator's pools serve both)
        extra += [f"eval.tasks={args.eval_tasks}", f"eval.horizons=[{args.eval_turns}]",
                  f"env.replicas_per_actor={max(64, args.eval_tasks)}"]
    cfg = load_config(ROOT / args.config, [
        f"name={name}", f"seed={seed}", f"iterations={iterations}", f"run_root={out}",
        "checkpoint_every=0", "metrics.port=0",
        # fixed precision (the base config may say auto): the comparison means the same anywhere
        "learner.dtype=float32", "generator.dtype=float32", *overrides, *extra])
    with Trainer(cfg, run_dir=make_run_dir(cfg)) as trainer:
        rows = []
        for _ in range(iterations):
            m = trainer.step()
            rows.append({k: m[k] for k in ("step", "horizon", "success_rate", "turns_mean",
                                           "truncated_at_horizon_rate")})
            print(f"[{name} seed {seed}] step {m['step'] + 1}/{iterations} H {m['horizon']} "
                  f"success {m['success_rate']:.3f} turns {m['turns_mean']:.2f}", flush=True)
        if args.eval_turns:  # the final policy on the eval split at one fixed horizon
            ev = trainer.evaluate()
            rows[-1]["eval_accuracy"] = ev[f"eval/{cfg.env.key}/h{args.eval_turns}/accuracy"]
            print(f"[{name} seed {seed}] eval at {args.eval_turns} turns: "
                  f"{rows[-1]['eval_accuracy']:.3f}", flush=True)
    return rows


def summarise(results: dict[str, dict[int, list[dict]]], out: Path, iterations: int) -> str:
    tail = max(1, iterations // 5)
    evals = all("eval_accuracy" in rows[-1] for by in results.values() for rows in by.values())
    lines = ["| schedule | success, first fifth | success, last fifth | turns, last fifth | "
             "final horizon |" + (" eval accuracy |" if evals else ""),
             "|---|---|---|---|---|" + ("---|" if evals else "")]
    for name, by_seed in results.items():
        first = [statistics.fmean(r["success_rate"] for r in rows[:tail])
                 for rows in by_seed.values()]
        last = [statistics.fmean(r["success_rate"] for r in rows[-tail:])
                for rows in by_seed.values()]
        turns = [statistics.fmean(r["turns_mean"] for r in rows[-tail:])
                 for rows in by_seed.values()]
        final_h = sorted({rows[-1]["horizon"] for rows in by_seed.values()})
        ev = f" {_ms([rows[-1]['eval_accuracy'] for rows in by_seed.values()])} |" \
            if evals else ""
        lines.append(f"| {name} | {_ms(first)} | {_ms(last)} | {_ms(turns)} | "
                     f"{', '.join(map(str, final_h))} |{ev}")
    table = "\n".join(lines)
    (out / "results.md").write_text(
        f"# Horizon experiment ({len(next(iter(results.values())))} seeds, {iterations} "
        f"iterations)\n\n`{command_line()}`\n\nMean ± std over seeds; fifths of the "
        f"run.\n\n"
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
    save_png(fig, path, dpi=110)


def main() -> None:
    from horizonrl.cluster.config import RayConfig
    from horizonrl.cluster.ops.runtime import ray_session

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--iterations", type=int, default=60)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--schedules", nargs="+", default=["fixed-short", "fixed-long", "stepwise",
                                                      "adaptive"])
    p.add_argument("--config", default="configs/babyai-local.yaml", help="base run config")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--model", help="start every run from this checkpoint (model.path)")
    what.add_argument("--warm-start", action="store_true", help="first run the config's warm "
                      "start at the first seed; every run starts from its clone")
    p.add_argument("--horizons", type=int, nargs=3, default=[2, 4, 8], metavar=("SHORT", "MID",
                   "LONG"), help="fixed-short, the stepwise middle stage, fixed-long")
    p.add_argument("--eval-turns", type=int, help="score each final policy on the eval split "
                   "at this one horizon")
    p.add_argument("--eval-tasks", type=int, default=64, help="eval tasks for --eval-turns")
    p.add_argument("--runs", default="runs", help="training runs go to a new "
                   "horizon-experiment__<time> folder here")
    p.add_argument("--out", help="results.json, results.md and the plot (default: the runs' "
                   "folder)")
    args = p.parse_args()
    table = schedules(*args.horizons)
    runs = Path(args.runs) / f"horizon-experiment__{time.strftime('%Y%m%d-%H%M%S')}"
    runs.mkdir(parents=True)
    out = Path(args.out) if args.out else runs
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[int, list[dict]]] = {}
    t0 = time.perf_counter()
    head: dict = {}
    if args.warm_start:
        clone, seconds = warm_start(args.config, args.seeds[0], runs)
        args.model = str(clone)
        head = {"clone": args.model, "warm_start_seconds": round(seconds, 1)}
        print(f"[horizon] warm start done in {seconds:.0f} s: {clone}", flush=True)
    with ray_session(RayConfig()):
        for name in args.schedules:
            for seed in args.seeds:
                rows = run_one(name, table[name], seed, args.iterations, runs, args)
                results.setdefault(name, {})[seed] = rows
                # The command (and the wall time so far) beside the schedules, so the file
                # says what wrote it and how long that took.
                (out / "results.json").write_text(json.dumps(
                    {"command": command_line(), **head,
                     "wall_seconds": round(time.perf_counter() - t0, 1), **results}, indent=1))
    print(summarise(results, out, args.iterations))
    plot(results, out / "horizon_experiment.png")
    print(f"wrote {out}/results.md and horizon_experiment.png")


if __name__ == "__main__":
    main()
