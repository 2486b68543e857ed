"""Soak: train for N minutes with BabyAI and SciWorld replicas and watch every process's memory.

    .venv/bin/python bench/soak.py --minutes 30 [--recycle 10] [--out docs/soak] [KEY=VALUE ...]

Starts `horizonrl train` (BabyAI + SciWorld mixed, SciWorld replicas recycled every `--recycle`
episodes, one JVM each) and samples, every `--every` seconds, the RSS of every process of the run,
summed per kind: driver, generator, env actors (with their JVMs), learner ranks, curriculum, Ray
itself. Reports each kind's slope (MB per minute, least squares over the samples after a warm-up)
and writes soak.json, soak.md and soak.png. Flat slopes mean no leak; the JVMs' saw-tooth from
recycling shows in the plot. At the end the run is interrupted (SIGINT), so it closes cleanly and
prints its trajectory ledger.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from horizonrl.cluster.ops.png import save_png
from horizonrl.cluster.ops.provenance import command_line

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("driver", "generator", "env actor", "jvm", "learner rank", "curriculum", "ray")


def kind_of(p: psutil.Process, driver_pid: int) -> str | None:
    """Which part of the run a process is (None: not ours)."""
    try:
        if p.pid == driver_pid:
            return "driver"
        cmd = " ".join(p.cmdline())
        name = p.name()
    except psutil.Error:
        return None
    if "java" in name or ("scienceworld" in cmd and ".jar" in cmd):
        return "jvm"
    for marker, kind in (("GeneratorActor", "generator"), ("EnvWorker", "env actor"),
                         ("LearnerWorker", "learner rank"), ("CurriculumActor", "curriculum")):
        if marker in cmd or marker in name:
            return kind
    if "ray" in cmd and any(x in cmd for x in ("raylet", "gcs_server", "default_worker",
                                               "log_monitor", "monitor.py", "dashboard")):
        return "ray"
    return None


def sample(driver_pid: int) -> dict[str, float]:
    """MB of RSS per kind, over the driver's process tree and the Ray processes it started."""
    try:
        tree = [psutil.Process(driver_pid), *psutil.Process(driver_pid).children(recursive=True)]
    except psutil.Error:
        return {}
    out = dict.fromkeys(KINDS, 0.0)
    for p in tree:
        k = kind_of(p, driver_pid)
        if k is not None:
            try:
                out[k] += p.memory_info().rss / 2**20
            except psutil.Error:
                pass
    return out


def slope(ts: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over ts (per minute)."""
    n = len(ts)
    if n < 2:
        return float("nan")
    mt, my = sum(ts) / n, sum(ys) / n
    var = sum((t - mt) ** 2 for t in ts)
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / var if var else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--every", type=float, default=20.0,
                    help="seconds between samples (the JVMs' saw-tooth needs several per cycle)")
    ap.add_argument("--warmup", type=float, default=3.0, help="minutes left out of the slopes")
    ap.add_argument("--recycle", type=int, default=10, help="SciWorld episodes per replica")
    ap.add_argument("--out", default=None, help="folder for soak.json/md/png")
    ap.add_argument("overrides", nargs="*", help="dotted overrides for the run, after the "
                    "soak's own (e.g. generator.trim_heap=false: the soak before the heap trim)")
    args = ap.parse_args()
    out = Path(args.out or ROOT / "runs" / f"soak__{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    # Up to tasks_per_step x group_size episodes of one env run at once: 3 x 4 = 12 replicas
    # each (12 JVMs for SciWorld at most).
    sciworld = {"name": "sciworld", "weight": 1, "replicas_per_actor": 12,
                "recycle_every_episodes": args.recycle, "call_timeout_s": 120,
                "kwargs": {"tasks": ["find-animal", "use-thermometer"], "jvm_heap_mb": 512}}
    cmd = [sys.executable, "-m", "horizonrl.cluster.cli", "train", "--config",
           "configs/babyai-local.yaml", "name=soak", "iterations=100000", "metrics.port=0",
           f"run_root={out / 'runs'}", "checkpoint_every=50", "keep_checkpoints=2",
           "learner.dtype=float32", "generator.dtype=float32",  # fixed, not the default's auto
           "generator.tasks_per_step=3", "generator.group_size=4",
           "generator.max_context_tokens=4096", "env.replicas_per_actor=12", "env.weight=2",
           f"extra_envs=[{json.dumps(sciworld)}]", *args.overrides]
    log = (out / "train.log").open("w")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    t0 = time.monotonic()
    samples: list[dict[str, float]] = []
    try:
        while time.monotonic() - t0 < args.minutes * 60 and proc.poll() is None:
            time.sleep(args.every)
            s = {"minute": (time.monotonic() - t0) / 60, **sample(proc.pid)}
            samples.append(s)
            print("[soak] {:5.1f} min | ".format(s["minute"]) + " | ".join(
                f"{k} {s[k]:.0f} MB" for k in KINDS if s.get(k)), flush=True)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()
    report(samples, args, out)


def report(samples: list[dict[str, float]], args: argparse.Namespace, out: Path) -> None:
    late = [s for s in samples if s["minute"] >= args.warmup]
    rows = []
    for k in KINDS:
        ys = [s[k] for s in late if s.get(k)]
        if ys:
            rows.append((k, ys[0], max(ys), ys[-1], slope([s["minute"] for s in late if s.get(k)],
                                                           ys)))
    md = ["| process kind | RSS after warm-up (MB) | peak (MB) | last (MB) | slope (MB/min) |",
          "|---|---|---|---|---|"]
    md += [f"| {k} | {a:.0f} | {p:.0f} | {z:.0f} | {sl:+.2f} |" for k, a, p, z, sl in rows]
    text = (f"Soak: {len(samples)} samples over {samples[-1]['minute'] if samples else 0:.1f} "
            f"min (slopes after {args.warmup:.0f} min of warm-up), SciWorld recycled every "
            f"{args.recycle} episodes.\n\n" + "\n".join(md) + "\n")
    (out / "soak.md").write_text(text)
    (out / "soak.json").write_text(json.dumps({"command": command_line(), "samples": samples,
                                                "rows": rows}, indent=1))
    print("\n" + text)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(9, 5))
    for k in KINDS:
        pts = [(s["minute"], s[k]) for s in samples if s.get(k)]
        if pts:
            ax.plot(*zip(*pts), marker="o", ms=3, label=k)
    ax.set_xlabel("minutes")
    ax.set_ylabel("RSS (MB), summed per process kind")
    ax.set_title("Soak: memory per process kind (BabyAI + SciWorld, recycling)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    save_png(fig, out / "soak.png", dpi=110)


if __name__ == "__main__":
    main()
