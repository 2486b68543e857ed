"""Rollout throughput: the lock-step loop against episodes that run independently, as ratios.

    .venv/bin/python bench/rollout_throughput.py [--cases babyai textcraft latency50 latency500]
        [--rollouts 3] [--out docs/rollout/rollout.json]

Each case is a fresh process: the real GeneratorActor as a plain class (vLLM, env actors on a
local Ray, the gRPC sender into a real ingest on loopback), one warm-up rollout per loop, then
`--rollouts` rollouts per loop on the same tasks and seeds (`sample_tasks` of the config,
steps 1..N), the two loops alternating (ABAB) so neither always runs on a warmer machine.
Reported per case: episodes/s and env steps/s of each loop, and their ratio.

Cases: `babyai` is the embedded default (configs/babyai-local.yaml: 8 tasks x 8 episodes, 64
replicas in one env actor, horizon 5); `textcraft` is configs/textcraft-bc-rl.yaml's base model
(four depth envs of 32 replicas, horizon 10, replies up to 64 tokens); `latency50` and
`latency500` are the embedded default with every BabyAI step delayed 50 or 500 ms times a
factor drawn uniformly from [0.5, 1.5] per step (`faulty` env, fault=latency), standing in
for a remote env server (an AgentGym HTTP server, a browser): 32 replicas in one env actor
that serves 32 calls at once (`env.step_threads`), so 64 episodes share 32 sessions.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from horizonrl.cluster.ops.provenance import command_line

ROOT = Path(__file__).resolve().parents[1]
CASES = {  # config, horizon, injected step latency (s), overrides
    "babyai": ("configs/babyai-local.yaml", 5, None, []),
    "babyai-inproc": ("configs/babyai-local.yaml", 5, None, ["env.in_process=true"]),
    "textcraft": ("configs/textcraft-bc-rl.yaml", 10, None, []),
    "latency50": ("configs/babyai-local.yaml", 5, 0.05, []),
    "latency500": ("configs/babyai-local.yaml", 5, 0.5, []),
}
LOOPS = ("lockstep", "independent")


def _latency_env(cfg, latency_s: float):
    """The config's BabyAI env behind a per-step delay, under the same label."""
    from horizonrl.envpool.config import EnvConfig

    env = cfg.env
    return EnvConfig(name="faulty", label=env.key, replicas_per_actor=32, step_threads=32,
                     num_cpus_per_actor=env.num_cpus_per_actor,
                     kwargs={"env": env.name, "env_kwargs": env.kwargs, "fault": "latency",
                             "sleep_s": latency_s, "jitter": 0.5})


def child(case: str, rollouts: int) -> dict:
    from horizonrl.actors.generator import GeneratorActor
    from horizonrl.cluster.config import RayConfig, load_config
    from horizonrl.cluster.model.load import ensure_model
    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.rollout.iteration import sample_tasks
    from horizonrl.envpool.pool import EnvPool
    from horizonrl.learner.ingest import TrajectoryIngest

    config, horizon, latency, overrides = CASES[case]
    cfg = load_config(ROOT / config, overrides)
    model = ensure_model(cfg.model, env=cfg.env)
    envs = [_latency_env(cfg, latency)] if latency else cfg.envs
    g = cfg.generator
    totals = {loop: {"episodes": 0, "env_steps": 0, "tokens": 0, "wall": 0.0, "generate": 0.0,
                     "env": 0.0, "transport": 0.0, "overlap": 0.0} for loop in LOOPS}
    with ray_session(RayConfig(num_cpus=2)), TrajectoryIngest(port=0) as ingest:
        gen = GeneratorActor(name="g", cfg=g, model_path=str(model),
                             env_pools=[EnvPool(e, name=f"bench-{e.key}") for e in envs],
                             ingest_address=ingest.address, seed=0)
        gen.set_horizon(horizon, 0)
        for loop in LOOPS:  # warm-up: engine caches, env actors, gRPC channel
            gen.cfg = g.model_copy(update={"loop": loop})
            gen.rollout(sample_tasks(cfg, 0), group_size=g.group_size, step=0)
            ingest.drain()
        for i in range(1, rollouts + 1):
            for loop in LOOPS if i % 2 else LOOPS[::-1]:
                gen.cfg = g.model_copy(update={"loop": loop})
                t0 = time.perf_counter()
                out = gen.rollout(sample_tasks(cfg, i), group_size=g.group_size, step=i)
                tot = totals[loop]
                tot["wall"] += time.perf_counter() - t0
                tot["episodes"] += len(out.trajectory_ids)
                tot["env_steps"] += out.env_steps
                tot["tokens"] += out.generated_tokens
                for k in ("generate", "env", "transport", "overlap"):
                    tot[k] += getattr(out.seconds, k)
                ingest.drain()
    return {"config": config, "overrides": overrides, "horizon": horizon, "latency_s": latency,
            "episodes_per_rollout": g.tasks_per_step * g.group_size,
            "replicas": sum(e.num_actors * e.replicas_per_actor for e in envs),
            "loops": {k: {**v, "wall": round(v["wall"], 3)} for k, v in totals.items()}}


def ratios(run: dict) -> dict:
    lock, ind = run["loops"]["lockstep"], run["loops"]["independent"]
    eps = {k: v["episodes"] / v["wall"] for k, v in run["loops"].items()}
    steps = {k: v["env_steps"] / v["wall"] for k, v in run["loops"].items()}
    return {"lockstep_episodes_per_s": round(eps["lockstep"], 2),
            "independent_episodes_per_s": round(eps["independent"], 2),
            "independent_vs_lockstep_episodes": round(eps["independent"] / eps["lockstep"], 3),
            "independent_vs_lockstep_env_steps": round(
                steps["independent"] / steps["lockstep"], 3),
            "mean_turns": {"lockstep": round(lock["env_steps"] / max(lock["episodes"], 1), 2),
                           "independent": round(ind["env_steps"] / max(ind["episodes"], 1), 2)},
            "env_hidden_behind_generation_s": round(ind["overlap"], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    ap.add_argument("--rollouts", type=int, default=3)
    ap.add_argument("--out", default="docs/rollout/rollout.json")
    ap.add_argument("--child", choices=list(CASES), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.rollouts)))
        return
    runs, result = {}, {}
    for case in args.cases:
        out = subprocess.run([sys.executable, __file__, "--child", case, "--rollouts",
                              str(args.rollouts)], stdout=subprocess.PIPE, text=True,
                             check=True, timeout=3600)
        runs[case] = json.loads(out.stdout.strip().splitlines()[-1])
        result[case] = ratios(runs[case])
        print(case, json.dumps(result[case]), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": command_line(),
                               "rollouts": args.rollouts, "runs": runs, "result": result},
                              indent=1) + "\n")


if __name__ == "__main__":
    main()
