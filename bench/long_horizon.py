"""Base vs behaviour cloning vs BC + RL on a long task, over seeds, with `horizonrl eval`'s code.

    .venv/bin/python bench/long_horizon.py --config configs/babyai-maze-bc-rl.yaml \
        --seeds 0 1 2 --tasks 100 --max-turns 20 --splits eval --out docs/long-horizon/maze

For each seed, one `horizonrl train --config C seed=S` (the config's warm start: expert demos,
SFT, then RL) in a subprocess, timed; then the base model, the cloned model (<run>/init/model)
and the final RL checkpoint are evaluated on the same eval-split tasks at one turn budget
(`split` eval: held-out tasks; train-new: training tasks in instances training never drew).
Writes OUT/results.json (every number, the command, wall times), OUT/results.md, the eval
reports and OUT/training.json (bench/run_summary.py's figures of the RL phase of each run); the
runs themselves go to --runs. A seed whose run exists is resumed (`--resume auto`); one that an
earlier invocation already trained and scored into the same --out keeps that invocation's wall
time, so adding seeds to a results file re-scores the old ones without losing their timing.
With `--reuse-warm-start`, `--scores-from` takes the base and clone scores from the results of
the invocation that built those clones (the evaluation is seeded, so they would come out the
same) and scores only the new RL checkpoint: a third of the evaluation time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

if not __package__:  # run as `python bench/NAME.py`: the checkout on the path, not bench/
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.run_summary import write as write_training
from horizonrl.cluster.ops.provenance import command_line

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("base", "bc", "bc+rl")


def train(config: str, seed: int, runs: Path, overrides: list[str]) -> tuple[Path, float, bool]:
    """One BC+RL recipe in a subprocess; returns (run dir, wall seconds, resumed). A seed whose
    run folder exists (an earlier invocation stopped) is continued with `--resume auto`."""
    root = runs / f"seed{seed}"
    log = runs / f"train_seed{seed}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    resumed = root.is_dir() and any(root.iterdir())
    t0 = time.perf_counter()
    with log.open("a" if resumed else "w") as f:
        proc = subprocess.run(
            [sys.executable, "-m", "horizonrl.cluster.cli",
             "train", "--config", config, f"seed={seed}",
             f"run_root={root}", "metrics.port=0", *overrides,
             *(["--resume", "auto"] if resumed else [])],
            cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env={**os.environ,
                                                               "PYTHONUNBUFFERED": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"training seed {seed} failed; see {log}")
    (run_dir,) = root.iterdir()
    return run_dir, time.perf_counter() - t0, resumed


def wait_for_warm_start(seed_dir: Path, timeout_s: float = 3600.0) -> Path:
    """The run under `seed_dir` once its warm start has finished (init/warm_start.json is
    written last): the source invocation may still be running that seed. Bounded."""
    deadline = time.monotonic() + timeout_s
    while True:
        runs = list(seed_dir.iterdir()) if seed_dir.is_dir() else []
        if len(runs) == 1 and (runs[0] / "init" / "warm_start.json").exists():
            return runs[0]
        if time.monotonic() > deadline:
            raise SystemExit(f"no finished warm start under {seed_dir} after {timeout_s:.0f}s")
        print(f"[long-horizon] waiting for the warm start under {seed_dir}", flush=True)
        time.sleep(30)


def reuse_warm_start(config: str, seed: int, runs: Path, source: Path,
                     overrides: list[str]) -> None:
    """Start seed `seed`'s run from the finished warm start of an earlier invocation (its demos
    and clone under SOURCE/seedN): RL alone then runs with this config, via `--resume auto`."""
    from horizonrl.cluster.config import dump_config, load_config

    root = runs / f"seed{seed}"
    if root.is_dir() and any(root.iterdir()):
        return  # this invocation's own run exists: `train` resumes it
    src = wait_for_warm_start(source / f"seed{seed}")
    cfg = load_config(config, [f"seed={seed}", f"run_root={root}", *overrides])
    if not src.name.startswith(f"{cfg.name}__{seed}__"):
        raise SystemExit(f"{src} is not a run of {cfg.name!r} seed {seed}")
    shutil.copytree(src / "init", root / src.name / "init")
    (root / src.name / "config.yaml").write_text(dump_config(cfg))


def earlier_scores(source: dict, seed: int, warm_root: Path, *, splits: list[str], tasks: int,
                   max_turns: int, samples: int) -> dict[str, dict]:
    """Per split, the base and clone scores of `seed` in an earlier invocation's results.json
    (`source`), refused unless that invocation scored the same clone (its run is the warm start
    under `warm_root`) on the same tasks, turn budget, samples and splits."""
    same = {"tasks": tasks, "max_turns": max_turns, "samples": samples}
    differ = {k: source.get(k) for k, v in same.items() if source.get(k, 1) != v}
    if differ:
        raise SystemExit(f"--scores-from scored other tasks: {differ} against {same}")
    record = source["per_seed"].get(str(seed))
    if record is None:
        raise SystemExit(f"--scores-from has no seed {seed}")
    if Path(record["run_dir"]).parent.resolve() != (warm_root / f"seed{seed}").resolve():
        raise SystemExit(f"--scores-from scored {record['run_dir']}, not the clone under "
                         f"{warm_root / f'seed{seed}'}")
    missing = [s for s in splits if s not in record["eval"]]
    if missing:
        raise SystemExit(f"--scores-from has no {missing} scores for seed {seed}")
    return {s: {m: record["eval"][s][m] for m in ("base", "bc")} for s in splits}


def evaluate_run(config: str, seed: int, run_dir: Path, *, tasks: int, max_turns: int,
                 splits: list[str], overrides: list[str], out: Path, samples: int = 1,
                 known: dict[str, dict] | None = None) -> dict:
    """Each model's accuracy per split and env; models `known` holds scores for (per split,
    from `earlier_scores`) are taken from it, not evaluated again."""
    from horizonrl.cluster.config import load_config
    from horizonrl.cluster.eval.evaluate import evaluate
    from horizonrl.cluster.model.load import ensure_model
    from horizonrl.cluster.ops.checkpoints import latest_checkpoint

    cfg = load_config(config, [f"seed={seed}", *overrides])
    models = {"base": str(ensure_model(cfg.model, env=cfg.env)),
              "bc": str(run_dir / "init" / "model"), "bc+rl": str(latest_checkpoint(run_dir))}
    got = {}
    for split in splits:
        folder = out / "eval" / f"seed{seed}-{split}"
        kept = (known or {}).get(split, {})
        results = evaluate(cfg, {m: p for m, p in models.items() if m not in kept},
                           envs=cfg.envs, tasks=tasks, samples=samples,
                           max_turns=[max_turns], out=folder, split=split)
        keep_small(folder)
        got[split] = {**kept, **{m: {env: cell[str(max_turns)]["accuracy"]
                                     for env, cell in r.items()} for m, r in results.items()}}
    return got


def keep_small(folder: Path) -> None:
    """An eval report as docs/ keeps it: the per-episode log gzipped (until `bench/doc_episodes.py
    --pack` or `make figures` folds it into its docs section's archive; `read_episodes` reads
    each form), the plots left out (results.json and results.md hold their numbers; this
    script's own table is what the docs show)."""
    import gzip

    from horizonrl.cluster.eval.report import PLOTS

    episodes = folder / "episodes.jsonl"
    if episodes.exists():
        with gzip.GzipFile(folder / "episodes.jsonl.gz", "wb", mtime=0) as f:
            f.write(episodes.read_bytes())
        episodes.unlink()
    for name in PLOTS:
        (folder / name).unlink(missing_ok=True)


def table(per_seed: dict[int, dict], splits: list[str]) -> tuple[str, dict]:
    lines = ["| split | env | " + " | ".join(MODELS) + " | RL > BC (seeds) |",
             "|---|---|" + "---|" * (len(MODELS) + 1)]
    summary: dict = {}
    for split in splits:
        envs = sorted(next(iter(per_seed.values()))["eval"][split]["base"])
        for env in envs:
            cells, by_model = [], {}
            for m in MODELS:
                xs = [r["eval"][split][m][env] for r in per_seed.values()]
                by_model[m] = {"mean": statistics.fmean(xs), "std": statistics.pstdev(xs),
                               "per_seed": xs}
                cells.append(f"{by_model[m]['mean']:.3f} ± {by_model[m]['std']:.3f}")
            wins = sum(r["eval"][split]["bc+rl"][env] > r["eval"][split]["bc"][env]
                       for r in per_seed.values())
            by_model["rl_beats_bc_seeds"] = wins
            summary.setdefault(split, {})[env] = by_model
            lines.append(f"| {split} | {env} | " + " | ".join(cells) +
                         f" | {wins}/{len(per_seed)} |")
    return "\n".join(lines), summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--tasks", type=int, default=100, help="eval tasks per env and split")
    p.add_argument("--max-turns", type=int, default=20, help="the one turn budget evaluated")
    p.add_argument("--samples", type=int, default=1, help="episodes per eval task: accuracy is "
                   "the mean over all of them (more samples, less sampling noise per cell)")
    p.add_argument("--splits", nargs="+", default=["eval"], choices=["eval", "train-new"])
    p.add_argument("--out", required=True, help="results (json, md, eval reports)")
    p.add_argument("--runs", default="runs/long-horizon", help="run directories and logs")
    p.add_argument("--reuse-warm-start", metavar="RUNS", help="take each seed's demos and "
                   "clone from an earlier invocation's --runs folder; only RL runs here")
    p.add_argument("--scores-from", metavar="OUT", help="with --reuse-warm-start: the --out "
                   "of the invocation that built the clones; base and clone scores are read "
                   "from its results.json, only BC + RL is evaluated")
    p.add_argument("--eval-overrides", nargs="*", default=[], metavar="KEY=VALUE",
                   help="dotted overrides for the evaluations only (after the shared ones), "
                   "e.g. generator.temperature=0.5 to train at one temperature and score at "
                   "another")
    p.add_argument("overrides", nargs="*", help="dotted overrides for every run")
    args = p.parse_args()
    if args.scores_from and not args.reuse_warm_start:
        p.error("--scores-from needs --reuse-warm-start (the clones it scored)")
    source = (json.loads((Path(args.scores_from) / "results.json").read_text())
              if args.scores_from else None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = command_line()
    earlier = (json.loads((out / "results.json").read_text())["per_seed"]
               if (out / "results.json").exists() else {})
    per_seed: dict[int, dict] = {}
    for seed in args.seeds:
        if args.reuse_warm_start:
            reuse_warm_start(args.config, seed, Path(args.runs), Path(args.reuse_warm_start),
                             args.overrides)
        # checked before training, so a mismatch costs no RL run
        known = (earlier_scores(source, seed, Path(args.reuse_warm_start), splits=args.splits,
                                tasks=args.tasks, max_turns=args.max_turns,
                                samples=args.samples) if source else None)
        run_dir, wall, resumed = train(args.config, seed, Path(args.runs), args.overrides)
        timing = {"wall_seconds": round(wall, 1), "resumed": resumed}
        before = earlier.get(str(seed), {})
        if resumed and before.get("run_dir") == str(run_dir):
            # This seed's run was trained and scored by an earlier invocation into the same
            # --out: its wall time is that invocation's; this one's resume is kept beside it.
            timing = {"wall_seconds": before["wall_seconds"], "resumed": before["resumed"],
                      "rerun_wall_seconds": round(wall, 1)}
        warm = json.loads((run_dir / "init" / "warm_start.json").read_text())
        metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        per_seed[seed] = {
            "run_dir": str(run_dir), **timing,
            "warm_start_from": args.reuse_warm_start, "scores_from": args.scores_from,
            "warm_start_seconds": warm["seconds"], "sft_steps": warm["sft_steps"],
            "train_success": [round(m["success_rate"], 4) for m in metrics],
            "eval": evaluate_run(args.config, seed, run_dir, tasks=args.tasks,
                                 max_turns=args.max_turns, splits=args.splits,
                                 overrides=[*args.overrides, *args.eval_overrides], out=out,
                                 samples=args.samples, known=known)}
        print(f"[long-horizon] seed {seed}: {per_seed[seed]['eval']} ({wall:.0f}s)", flush=True)
        (out / "results.json").write_text(json.dumps(
            {"command": command, "max_turns": args.max_turns, "tasks": args.tasks,
             "samples": args.samples, "per_seed": per_seed}, indent=1))
    write_training([Path(r["run_dir"]) for r in per_seed.values()], out / "training.json",
                   5, command)
    text, summary = table(per_seed, args.splits)
    (out / "results.json").write_text(json.dumps(
        {"command": command, "max_turns": args.max_turns, "tasks": args.tasks,
         "samples": args.samples, "summary": summary, "per_seed": per_seed}, indent=1))
    if args.reuse_warm_start:  # every seed resumed into RL: its wall time is RL alone
        walls, what = [r["wall_seconds"] for r in per_seed.values()], "RL-only wall time"
    else:
        walls, what = [r["wall_seconds"] for r in per_seed.values() if not r["resumed"]], \
            "recipe wall time"
    took = (f"{what} per seed {statistics.fmean(walls):.0f} s (2 cores"
            + ("" if args.reuse_warm_start else "; resumed seeds left out") + ")"
            if walls else "every seed resumed: no wall time")
    (out / "results.md").write_text(
        f"# {args.config}: base vs BC vs BC+RL\n\n`{command}`\n\nAccuracy at {args.max_turns} "
        f"turns on {args.tasks} tasks per split ({args.samples} episode(s) each), mean ± std "
        f"over seeds {args.seeds}; {took}.\n\n{text}\n")
    print(text)


if __name__ == "__main__":
    main()
