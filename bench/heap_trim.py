"""Generator memory with and without the heap trim after each rollout, in one run.

    .venv/bin/python bench/heap_trim.py [--rollouts 300] [--warmup 100] [--out FILE]

Runs the generator's rollout loop (the real GeneratorActor as a plain class: vLLM, BabyAI env
actors on a local Ray, the gRPC sender into a real ingest) on the embedded default's model, once
with `generator.trim_heap=false` and once with it on, each in a fresh process with the same seed.
RSS is sampled every 10 rollouts. Printed per variant: RSS at the end of the warm-up, its growth
from there to the end and to the peak, and seconds per rollout; then the trim's ratios to the
baseline (growth, seconds per rollout); `--out` also writes them, with the command, as JSON.
Without the trim, glibc keeps the freed memory of the
varied buffers of multi-turn rollouts (docs/reliability.md, "Soak").
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path

from horizonrl.cluster.ops.provenance import command_line

ROOT = Path(__file__).resolve().parents[1]


def child(trim: bool, rollouts: int) -> dict:
    """One variant, in this process: RSS samples (MB) and seconds per rollout."""
    import psutil

    from horizonrl.actors.generator import GeneratorActor
    from horizonrl.cluster.config import ModelConfig, RayConfig, load_config
    from horizonrl.cluster.model.load import ensure_model
    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.rollout.iteration import sample_tasks
    from horizonrl.envpool.config import EnvConfig
    from horizonrl.envpool.pool import EnvPool
    from horizonrl.learner.ingest import TrajectoryIngest

    model = ensure_model(ModelConfig(), env=EnvConfig())
    cfg = load_config(ROOT / "configs/babyai-local.yaml", [
        "generator.tasks_per_step=3", "generator.group_size=4", "env.replicas_per_actor=12",
        f"generator.trim_heap={str(trim).lower()}", "generator.dtype=float32"])  # not auto
    me, samples, seconds = psutil.Process(), [], 0.0
    with ray_session(RayConfig(num_cpus=2)), TrajectoryIngest(port=0) as ingest:
        gen = GeneratorActor(name="g", cfg=cfg.generator, model_path=str(model),
                             env_pools=[EnvPool(cfg.env)], ingest_address=ingest.address,
                             seed=0)
        gen.set_horizon(5, 0)
        for i in range(rollouts + 1):
            t0 = time.perf_counter()
            gen.rollout(sample_tasks(cfg, i), group_size=4, step=i)
            seconds += time.perf_counter() - t0
            ingest.drain()
            if i % 10 == 0:
                gc.collect()
                samples.append((i, me.memory_info().rss / 2**20))
                print(f"[heap_trim] trim={trim} rollout {i}/{rollouts} "
                      f"rss {samples[-1][1]:.0f} MB", file=sys.stderr, flush=True)
    return {"samples": samples, "seconds_per_rollout": seconds / (rollouts + 1)}


def summarize(res: dict, warmup: int) -> dict:
    late = [rss for i, rss in res["samples"] if i >= warmup]
    return {"rss_at_warmup_mb": late[0], "growth_to_end_mb": late[-1] - late[0],
            "growth_to_peak_mb": max(late) - late[0],
            "seconds_per_rollout": res["seconds_per_rollout"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rollouts", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=100, help="rollouts left out of the growth")
    ap.add_argument("--out", help="also write the figures and the command here (JSON)")
    ap.add_argument("--child", choices=["off", "on"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child == "on", args.rollouts)))
        return
    rows = {}
    for variant in ("off", "on"):
        out = subprocess.run([sys.executable, __file__, "--child", variant,
                              "--rollouts", str(args.rollouts)],
                             capture_output=False, stdout=subprocess.PIPE, text=True,
                             check=True, timeout=3600)
        rows[variant] = summarize(json.loads(out.stdout.strip().splitlines()[-1]), args.warmup)
    print(f"\n{args.rollouts} rollouts each (3 tasks x 4 episodes, horizon 5); growth after "
          f"rollout {args.warmup}\n")
    print("| trim_heap | RSS at warm-up (MB) | growth to end (MB) | growth to peak (MB) "
          "| s / rollout |\n|---|---|---|---|---|")
    for v, r in rows.items():
        print(f"| {v} | {r['rss_at_warmup_mb']:.0f} | {r['growth_to_end_mb']:+.0f} | "
              f"{r['growth_to_peak_mb']:+.0f} | {r['seconds_per_rollout']:.3f} |")
    off, on = rows["off"], rows["on"]
    ratios = {"growth_to_peak": on["growth_to_peak_mb"] / max(off["growth_to_peak_mb"], 1e-9),
              "seconds_per_rollout": on["seconds_per_rollout"] / off["seconds_per_rollout"]}
    print(f"\nratios, trim on / off: growth to peak {ratios['growth_to_peak']:.2f}, "
          f"seconds per rollout {ratios['seconds_per_rollout']:.3f}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(
            {"command": command_line(), "rollouts": args.rollouts, "warmup": args.warmup,
             "trim_heap": rows, "ratios_on_off": ratios}, indent=1))


if __name__ == "__main__":
    main()
