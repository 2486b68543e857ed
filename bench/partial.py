"""Sync vs async vs async with partial rollouts, on the cases where rollouts have a long tail.

    .venv/bin/python bench/partial.py [--case default|slow-steps|textcraft ...]
        [--seeds 0 1 2] [--iterations N] [--out DIR]

Cases (each mode runs `horizonrl train` in its own process, same config, same seed, same
number of updates, so the same budget of trained episodes):
- `default`: the embedded default (configs/babyai-local.yaml) as it ships.
- `slow-steps`: the embedded default whose env steps wait 500 ms on average, drawn from a
  lognormal of sigma 1 (`env.name=faulty`, `fault: latency, heavy_tail: 1.0`: a median step
  of 0.30 s, one in a hundred over 3 s), as a remote env server or a browser answers; env
  actors serve steps side by side (`env.step_threads`), episodes run independently.
- `textcraft`: configs/textcraft-bc-rl.yaml (goals of depths 1-4 as four envs, 8 tasks x 8
  episodes per update, its lock-step loop) at a fixed horizon of 30 turns with the depths
  drawn equally, RL from the config's behaviour-cloning warm start (built once, first: the
  expert's demonstrations, then SFT), so that episodes last from a few turns (a goal crafted)
  to 30.

The default case adds `sync, TIS + seq mask`: sync with the rollout correction on (the
decoupled loss's truncated importance weights and sequence masking outside [0.5, 2]).

Modes: `sync`; `async` (one rollout in flight per generator, trajectories enter the buffer
with their rollout's report); `async, partial` (partial rollouts: new weights at the next
turn, trajectories buffered as they arrive so the learner trains as soon as tasks_per_step
groups are complete, a second rollout queued on each generator, and rollouts of
`rollout_steps=4` steps' worth of tasks). Both async modes bound the lag at 2 versions
(`max_staleness=2`; with partial rollouts, of an episode's oldest turn), and generation runs
at most 2 steps ahead of the learner: a rollout is issued, and with partial rollouts each of
its episodes starts, only once its step is within 2 of the step being trained.
Printed and written (OUT/results.json, OUT/results.md): trained episodes per hour and
successful episodes per wall-clock minute (among those the updates gathered: each update's
groups less the stale ones; wall clock from the end of the first update to the last, so
start-up and vLLM's warm-up are out), ratios to sync, success over the last fifth of
updates, mean lag. Runs go to runs/partial__<time>/.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

if not __package__:  # run as `python bench/NAME.py`: the checkout on the path, not bench/
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.report import run_folders, write_results

ROOT = Path(__file__).resolve().parents[1]
SLOW = ("env.kwargs={env: babyai, env_kwargs: {level: BabyAI-GoToRedBall-v0, reward: binary}, "
        "fault: latency, sleep_s: 0.5, heavy_tail: 1.0}")
CASES = {
    "default": {"config": "configs/babyai-local.yaml", "iterations": 30, "overrides": [],
                # Rollout correction in sync mode: the curve with it against the one without.
                "extra_modes": {"sync, TIS + seq mask": [
                    "mode=sync", "learner.decoupled_loss=true",
                    "learner.seq_mask_band=[0.5,2.0]"]}},
    "slow-steps": {"config": "configs/babyai-local.yaml", "iterations": 30, "overrides": [
        "env.name=faulty", "env.label=babyai", SLOW, "env.step_threads=64",
        "generator.loop=independent"],
        # The embedded default's model: the faulty env would otherwise get a tiny model of its
        # own, pre-trained on transcripts whose every step sleeps.
        "model_of": "configs/babyai-local.yaml"},
    "textcraft": {"config": "configs/textcraft-bc-rl.yaml", "iterations": 12, "overrides": [
        "curriculum.schedule=fixed", "curriculum.horizons=[30]", "curriculum.env_weights={}"],
        # RL from the config's own behaviour-cloning warm start, built once for all modes,
        # so that some episodes end before the horizon.
        "warm_start": True},
}
MODES = {"sync": ["mode=sync"],
         "async": ["mode=async", "max_staleness=2"],
         "async, partial": ["mode=async", "max_staleness=2", "generator.partial_rollouts=true",
                            "generator.rollout_steps=4"]}


def model_path(config: str) -> str:
    """The tiny model `config` trains (built now if it is not cached yet)."""
    from horizonrl.cluster.config import load_config
    from horizonrl.cluster.model.load import ensure_model

    cfg = load_config(ROOT / config, [])
    return str(ensure_model(cfg.model, env=cfg.envs[0]))


def warm_start(case: str, seed: int, out: Path) -> tuple[str, str]:
    """Run the case's config through its warm start (and one RL step) once; returns (the
    cloned model, the config without its `init:` for the RL runs from that model)."""
    from horizonrl.cluster.warm_start.recipe import warm_start_model

    spec, tag = CASES[case], f"{case}-warm-{seed}"
    cmd = [sys.executable, "-m", "horizonrl.cluster.cli", "train", "--config", spec["config"],
           f"name={tag}", f"seed={seed}", "iterations=1", f"run_root={out}", "metrics.port=0",
           "checkpoint_every=0", "eval.every=0", "init.eval_tasks=0"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=7200)
    (out / f"{tag}.log").write_text(" ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    runs = sorted(out.glob(f"{tag}__*"))
    model = warm_start_model(runs[-1]) if proc.returncode == 0 and runs else None
    if model is None:
        raise SystemExit(f"the warm start of {case} failed: see {out / tag}.log")
    cfg = yaml.safe_load((ROOT / spec["config"]).read_text())
    cfg.pop("init")
    derived = out / f"{case}-rl.yaml"
    derived.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return str(model), str(derived)


def run(case: str, mode: str, seed: int, iterations: int, out: Path,
        warm: tuple[str, str] | None = None) -> Path | None:
    spec = CASES[case]
    tag = f"{case}-{re.sub(r'[^a-z0-9]+', '-', mode.lower())}-{seed}"
    model = [f"model.path={model_path(spec['model_of'])}"] if "model_of" in spec else []
    config = spec["config"]
    if warm is not None:
        model, config = [f"model.path={warm[0]}"], warm[1]
    overrides = {**MODES, **spec.get("extra_modes", {})}[mode]
    cmd = [sys.executable, "-m", "horizonrl.cluster.cli", "train", "--config", config,
           f"name={tag}", f"seed={seed}", f"iterations={iterations}", f"run_root={out}",
           "metrics.port=0", "checkpoint_every=0", "eval.every=0",
           # Every gathered episode counts as trained (a group without reward variance has
           # zero advantage either way), so "trained" measures the system, not how often the
           # policy happened to solve a task 8 times out of 8.
           "learner.skip_zero_variance_groups=false",
           "learner.dtype=float32", "generator.dtype=float32",  # fixed, not auto: same on any CPU
           *model, *spec["overrides"], *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    (out / f"{tag}.log").write_text(" ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    runs = sorted(out.glob(f"{tag}__*"))
    return runs[-1] if proc.returncode == 0 and runs else None


def summarise(run_dir: Path) -> dict[str, float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = rows[1:]  # iteration 0 carries start-up and vLLM's warm-up
    secs = sum(r["seconds/iteration"] for r in timed)
    trained = sum(r["trajectories_trained"] for r in timed)
    # Successful episodes among those each update gathered (its tasks_per_step groups less
    # the stale ones: `success_rate` is over these, zero-variance groups included).
    g = yaml.safe_load((run_dir / "config.yaml").read_text())["generator"]
    per_update = g["tasks_per_step"] * g["group_size"]
    wins = sum(r["success_rate"] * (per_update - r.get("async/dropped_stale", 0.0))
               for r in timed)
    fifth = max(1, len(rows) // 5)
    return {"updates": len(rows), "seconds": secs,
            # Per update: the driver's wait for data, and the update itself (on 2 cores the
            # learner ranks and the generator share the CPUs when they overlap).
            "rollout_s": statistics.mean(r["seconds/rollout"] for r in timed),
            "learn_s": statistics.mean(r["seconds/learn"] for r in timed),
            "trained_per_hour": trained / secs * 3600,
            "successes_per_minute": wins / secs * 60,
            "success_last": sum(r["success_rate"] for r in rows[-fifth:]) / fifth,
            "turns_mean": statistics.mean(r["turns_mean"] for r in rows),
            "lag": statistics.mean(r.get("staleness_max", 0) for r in rows),
            "dropped_stale": sum(r.get("async/dropped_stale", 0.0) for r in rows),
            "multi_version_share": statistics.mean(
                r.get("async/multi_version_share", 0.0) for r in rows)}


def _ratio(r: dict, base: dict | None, key: str) -> str:
    return f"{r[key] / base[key]:.2f}x" if base and base[key] else "n/a"


def table(results: dict[str, dict[str, dict[str, dict | None]]]) -> str:
    lines = ["| case | mode | seed | trained episodes/h | vs sync | successes/min | vs sync | "
             "success, last fifth | mean turns | max lag (mean) | dropped stale | "
             "wait for data, s/update | update, s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for case, by_seed in results.items():
        for seed, by_mode in by_seed.items():
            base = by_mode.get("sync")
            for mode, r in by_mode.items():
                if r is None:
                    lines.append(f"| {case} | {mode} | {seed} | failed: see its log |||||||")
                    continue
                lines.append(
                    f"| {case} | {mode} | {seed} | {r['trained_per_hour']:.0f} | "
                    f"{_ratio(r, base, 'trained_per_hour')} | "
                    f"{r['successes_per_minute']:.1f} | "
                    f"{_ratio(r, base, 'successes_per_minute')} | {r['success_last']:.3f} | "
                    f"{r['turns_mean']:.1f} | {r['lag']:.2f} | {r['dropped_stale']:.0f} | "
                    f"{r.get('rollout_s', float('nan')):.1f} | "
                    f"{r.get('learn_s', float('nan')):.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", nargs="+", choices=list(CASES), default=list(CASES))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--iterations", type=int, help="updates per run (default: the case's)")
    ap.add_argument("--out", help="folder for results.json and results.md (default: the runs')")
    args = ap.parse_args()
    runs, out = run_folders(ROOT, "partial", args.out)
    t0 = time.perf_counter()
    results: dict[str, dict[str, dict[str, dict | None]]] = {}
    for case in args.case:
        iterations = args.iterations or CASES[case]["iterations"]
        for seed in args.seeds:
            warm = warm_start(case, seed, runs) if CASES[case].get("warm_start") else None
            for mode in {**MODES, **CASES[case].get("extra_modes", {})}:
                print(f"[bench] {case}, {mode}, seed {seed}: {iterations} updates ...",
                      flush=True)
                run_dir = run(case, mode, seed, iterations, runs, warm)
                r = summarise(run_dir) if run_dir else None
                results.setdefault(case, {}).setdefault(str(seed), {})[mode] = r
                print(f"[bench]   {r}", flush=True)
    text = table(results)
    write_results(out, {"cases": {c: {**CASES[c], "iterations": args.iterations
                                      or CASES[c]["iterations"]} for c in args.case},
                        "modes": MODES, "seeds": args.seeds, "results": results},
                  text, started=t0)
    print(f"\n{text}\n\nwritten to {out}/results.json and results.md")


if __name__ == "__main__":
    main()
