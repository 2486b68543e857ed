"""Learner throughput by row layout (`learner.layout`): tokens of loss per second of one real
`LearnerWorker` update (DeepSpeed ZeRO-2, 1 rank, fp32, 1 thread) on the same batches, for
padded rows (the original path), bucketed rows, packed rows and shared-prefix rows.

    .venv/bin/python bench/learner_throughput.py layouts --out docs/learner/layouts.json

Batches, from real episodes written by the project's own commands (cached under --data):
- default: the embedded default's trajectories (`horizonrl train iterations=2
  save_trajectories=true`), the second step's 32 episodes;
- textcraft: TextCraft depths 1-4 expert episodes (`horizonrl demos --config
  configs/textcraft-bc-rl.yaml`), 32 of them, 8 per depth;
- sciworld-window: SciWorld window-mode episodes at horizon 30, keep_turns 4 (`horizonrl train
  --config configs/sciworld-local.yaml` for one step, the untrained model runs its horizon),
  one row per turn.

With --curve-iterations N the embedded default also trains N steps end to end with
learner.layout=padded and auto (same seed): its success curve, learn-phase seconds and ledger.

Each (batch, layout) runs in a fresh process: the worker is built, one untimed update, then
--steps timed updates (the median is reported) and the process's peak RSS (ru_maxrss, which
also holds the model, optimizer and libraries: compare the variants' differences). Every
variant trains the same rows with the same advantages, and the bench checks that the first
update's loss agrees with the padded one (1e-4 relative). Shared-prefix rows exist only in
window mode; elsewhere that layout is bucketing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
HRL = [str(Path(sys.executable).parent / "horizonrl")]
QUIET = ["metrics.port=0", "checkpoint_every=0"]
LAYOUTS = ["padded", "bucketed", "packed", "shared_prefix"]
DATASETS = {
    "default": dict(config=None, cmd=["train", "iterations=2", "save_trajectories=true", *QUIET]),
    "textcraft": dict(config="configs/textcraft-bc-rl.yaml",
                      cmd=["demos", "--episodes", "32", "--max-turns", "40"]),
    "sciworld-window": dict(config="configs/sciworld-local.yaml", cmd=[
        "train", "iterations=1", "save_trajectories=true", "generator.context.mode=window",
        "generator.context.keep_turns=4", "curriculum.horizons=[30]", *QUIET]),
}


def prepare(name: str, data: Path) -> Path:
    """The dataset's trajectory JSONL, written by the project's CLI on first use."""
    out = data / name

    def found() -> list[Path]:
        return sorted(out.rglob("demos.jsonl")) + sorted(out.rglob("step_*.jsonl"))

    if found():
        return found()[-1]
    spec = DATASETS[name]
    cmd = [*HRL, spec["cmd"][0]] + (["--config", str(ROOT / spec["config"])]
                                    if spec["config"] else [])
    if spec["cmd"][0] == "demos":
        cmd += [*spec["cmd"][1:], "--out", str(out)]
    else:
        cmd += [*spec["cmd"][1:], f"run_root={out}"]
    print(f"[layouts] preparing {name}: horizonrl {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, timeout=1800)
    if not found():
        raise SystemExit(f"{name}: the command wrote no trajectories under {out}")
    return found()[-1]


def load_batch(name: str, path: Path) -> tuple[dict[str, np.ndarray], list[int], str]:
    """The rows LearnerGroup.train would build (advantages +-1 by episode, so no group is
    dropped), and the model folder the episodes were tokenised for."""
    from horizonrl.cluster.config import load_config
    from horizonrl.cluster.model.load import ensure_model
    from horizonrl.learner.batch import pad_batch, turn_rows
    from horizonrl.protos.chat import load_tokenizer
    from horizonrl.protos.codec import from_json_line

    trajs = [from_json_line(line) for line in path.read_text().splitlines() if line.strip()]
    spec = DATASETS[name]
    cfg = load_config(ROOT / spec["config"] if spec["config"] else None)
    model = ensure_model(cfg.model, env=cfg.env)
    adv = [1.0 if i % 2 else -1.0 for i in range(len(trajs))]
    pad_id = load_tokenizer(str(model)).pad_token_id
    batch = pad_batch(trajs, adv, pad_id=pad_id)
    if any(t.turn_spans for t in trajs):
        batch = turn_rows(trajs, batch, pad_id=pad_id)
    return batch, [t.rows for t in trajs], str(model)


def measure(args: argparse.Namespace) -> dict:
    """One (batch, layout) in this process: a real worker, warm-up, timed updates."""
    import torch

    from horizonrl.learner.batch import shard_episodes
    from horizonrl.learner.config import LearnerConfig
    from horizonrl.learner.layout import computed_tokens, rank_plan
    from horizonrl.learner.worker import LearnerWorker

    batch, counts, model = load_batch(args.name, Path(args.path))
    cfg = LearnerConfig(world_size=1, minibatches=1, kl_coef=0.0, layout=args.layout,
                        micro_batch_tokens=args.budget, lr=1e-6, warmup_steps=0)
    (shard,) = shard_episodes(batch, counts, ranks=1, minibatches=1, token_mean=True,
                              balance=args.layout != "padded")
    worker = LearnerWorker(rank=0, world_size=1, cfg=cfg, model_path=model, seed=0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    worker.setup("127.0.0.1", port)
    how, plan = rank_plan(shard, args.layout, worker.cfg.micro_batch_tokens, agree=lambda n: n)
    losses, seconds = [], []
    for k in range(1 + args.steps):
        t0 = time.perf_counter()
        losses.append(worker.train(shard)["loss"])
        if k:
            seconds.append(time.perf_counter() - t0)
    lengths = shard["attention_mask"].sum(1)
    return {"layout": args.layout, "resolved": how, "rows": len(lengths),
            "episodes": len(counts), "loss_tokens": int(shard["loss_mask"].sum()),
            "row_tokens": int(lengths.sum()), "padded_tokens": int(len(lengths) * lengths.max()),
            "computed_tokens": computed_tokens(shard, [r for r in plan if r is not None], how),
            "micro_batches": len(plan), "update_s": statistics.median(seconds),
            "update_s_all": seconds, "first_loss": losses[0],
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "torch_threads": torch.get_num_threads()}


def run_variant(name: str, path: Path, layout: str, budget: int, steps: int) -> dict:
    cmd = [sys.executable, __file__, "_measure", "--name", name, "--path", str(path),
           "--layout", layout, "--budget", str(budget), "--steps", str(steps)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=1800,
                          cwd=ROOT, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def default_curve(layouts: list[str], iterations: int, runs: Path) -> dict:
    """The embedded default trained end to end once per layout (same seed): success over the
    first and last fifth of the steps, learn-phase seconds per step, and the ledger."""
    out = {}
    for layout in layouts:
        root = runs / f"curve-{layout}"
        cmd = [*HRL, "train", f"iterations={iterations}", f"learner.layout={layout}",
               f"run_root={root}", *QUIET]
        print(f"[layouts] embedded default, learner.layout={layout}", flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT, timeout=3600)
        run = sorted(root.iterdir())[-1]
        ms = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        fifth = max(1, len(ms) // 5)
        ledger = json.loads((run / "ledger.json").read_text())
        out[layout] = {
            "run_dir": str(run), "steps": len(ms),
            "success_first_fifth": statistics.fmean(m["success_rate"] for m in ms[:fifth]),
            "success_last_fifth": statistics.fmean(m["success_rate"] for m in ms[-fifth:]),
            "learn_seconds_per_step": statistics.fmean(m["seconds/learn"] for m in ms),
            "learner_seconds_per_update": statistics.fmean(
                m["learner/learn_seconds"] for m in ms if "learner/learn_seconds" in m),
            "success_curve": [round(m["success_rate"], 4) for m in ms],
            "ledger": {k: ledger[k] for k in ("generated", "trained", "dropped_total",
                                              "unaccounted", "reconciled")}}
    return out


def table(results: dict) -> str:
    lines = ["| batch | layout | rows | micro-batches | computed tokens | tokens of loss/s | "
             "vs padded | peak RSS MiB |", "|---|---|---|---|---|---|---|---|"]
    for name, rows in results["batches"].items():
        base = rows["padded"]["loss_tokens_per_s"]
        for layout, r in rows.items():
            lines.append(f"| {name} | {layout} | {r['rows']} | {r['micro_batches']} | "
                         f"{r['computed_tokens']:,} | {r['loss_tokens_per_s']:,.0f} | "
                         f"{r['loss_tokens_per_s'] / base:.2f}x | {r['peak_rss_mib']:,.0f} |")
    curve = results.get("default_curve")
    if curve:
        lines += ["", "| embedded default | success, first fifth | last fifth | learn s/step | "
                  "ledger trained / generated |", "|---|---|---|---|---|"]
        for layout, r in curve.items():
            lines.append(f"| learner.layout={layout} | {r['success_first_fifth']:.3f} | "
                         f"{r['success_last_fifth']:.3f} | {r['learn_seconds_per_step']:.2f} | "
                         f"{r['ledger']['trained']} / {r['ledger']['generated']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    ap.add_argument("--layouts", nargs="+", default=LAYOUTS, choices=LAYOUTS)
    ap.add_argument("--budget", type=int, default=0, help="learner.micro_batch_tokens of the "
                    "non-padded layouts (0: their default); padded runs with 0, as today")
    ap.add_argument("--steps", type=int, default=3, help="timed updates per variant")
    ap.add_argument("--data", type=Path, default=ROOT / "runs" / "bench-layouts",
                    help="where the episodes are written (reused when present)")
    ap.add_argument("--out", type=Path, required=True, help="results JSON (and .md beside it)")
    ap.add_argument("--curve-iterations", type=int, default=0, help="also train the embedded "
                    "default this many steps with layout padded and auto (0: skip)")
    args = ap.parse_args(argv)
    from horizonrl.cluster.ops.provenance import command_line

    results = {"command": command_line(), "steps": args.steps, "batches": {}}

    def save() -> None:  # after every variant: a late failure keeps what was measured
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(table(results) + "\n")

    for name in args.batches:
        path = prepare(name, args.data)
        rows = results["batches"][name] = {}
        for layout in ["padded", *[x for x in args.layouts if x != "padded"]]:
            r = run_variant(name, path, layout, 0 if layout == "padded" else args.budget,
                            args.steps)
            r["loss_tokens_per_s"] = r["loss_tokens"] / r["update_s"]
            if abs(r["first_loss"] - rows.get("padded", r)["first_loss"]) > 1e-4 * abs(
                    rows.get("padded", r)["first_loss"]) + 1e-7:
                raise SystemExit(f"{name}/{layout}: loss {r['first_loss']} differs from "
                                 f"padded {rows['padded']['first_loss']}")
            rows[layout] = r
            save()
            print(f"[layouts] {name} {layout}: {r['update_s']:.2f} s per update, "
                  f"{r['loss_tokens_per_s']:,.0f} loss tokens/s, {r['micro_batches']} "
                  f"micro-batches, peak {r['peak_rss_mib']:,.0f} MiB", flush=True)
    if args.curve_iterations:
        results["default_curve"] = default_curve(["padded", "auto"], args.curve_iterations,
                                                 args.data)
    save()
    print(table(results))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_measure":
        p = argparse.ArgumentParser()
        for k in ("--name", "--path", "--layout"):
            p.add_argument(k, required=True)
        p.add_argument("--budget", type=int, default=0)
        p.add_argument("--steps", type=int, default=3)
        print(json.dumps(measure(p.parse_args(sys.argv[2:]))))
    else:
        main()
