"""Env pool throughput: the Ray `EnvPool` against an in-process loop over the same replicas and
against gymnasium's `AsyncVectorEnv`, for BabyAI and TextCraft, as ratios in one run; and for
MiniWoB (a headless Chromium per replica) the steps/s per replica from 1 to N replicas.

    .venv/bin/python bench/env_pool_throughput.py [--replicas 8] [--rounds 150] [--max-seconds 60]
        [--envs babyai textcraft] [--scaling 1 2 4] [--out FILE]

`env.in_process` pools host the same EnvWorkers in this process (no Ray round trip; a thread
per worker carries the call deadline).
Every method runs the same random agent (each env's `random_action` on the last info) on the same
number of replicas for the same number of rounds (one action per replica per round; a finished
episode is reset in its slot and the reset counts as that slot's step). Reading it: the pool
pays one Ray round trip per actor per round and buys process isolation, timeouts and restarts;
the in-process loop is the no-overhead floor on one core; AsyncVectorEnv is gymnasium's own
one-process-per-env answer.
"""

from __future__ import annotations

import argparse
import random
import time
from functools import partial

import gymnasium as gym
from gymnasium.spaces import Text

from horizonrl.cluster.ops.provenance import command_line
from horizonrl.envpool.registry import env_spec, make_env

ENVS = {"babyai": {"level": "BabyAI-GoToRedBall-v0"}, "textcraft": {}}
MINIWOB: dict = {}  # the env's default task set, a headless Chromium per replica
SCALING_ROUNDS = 40  # browser steps take tens of ms: 40 rounds is seconds per row


def in_process(env: str, kwargs: dict, n: int, rounds: int, max_s: float) -> float:
    spec, rng = env_spec(env), random.Random(0)
    envs = [make_env(env, **kwargs) for _ in range(n)]
    infos = [e.reset(seed=i)[1] for i, e in enumerate(envs)]
    steps, t0 = 0, time.perf_counter()
    for r in range(rounds):
        for i, e in enumerate(envs):
            res = e.step(spec.random_action(infos[i], rng))
            infos[i] = (e.reset(seed=n * (r + 1) + i)[1] if res.terminated or res.truncated
                        else res.info)
            steps += 1
        if time.perf_counter() - t0 > max_s:
            break
    dt = time.perf_counter() - t0
    for e in envs:
        e.close()
    return steps / dt


def pool(env: str, kwargs: dict, n: int, rounds: int, max_s: float, actors: int,
         in_process: bool = False, step_threads: int = 1) -> float:
    from horizonrl.envpool.config import EnvConfig
    from horizonrl.envpool.pool import EnvPool
    from horizonrl.envpool.replicas import EnvError

    spec, rng = env_spec(env), random.Random(0)
    p = EnvPool(EnvConfig(name=env, kwargs=kwargs, num_actors=actors,
                          replicas_per_actor=n // actors, num_cpus_per_actor=0.01,
                          in_process=in_process, step_threads=step_threads,
                          call_timeout_s=300), name=f"bench-{env}")
    p.wait_ready()
    slots = p.acquire(n)
    infos = [info for _, info in p.reset(slots, list(range(n)))]
    steps, t0 = 0, time.perf_counter()
    for r in range(rounds):
        results = p.step(slots, [spec.random_action(i, rng) for i in infos])
        done = [k for k, res in enumerate(results) if res.terminated or res.truncated]
        assert not any(isinstance(res, EnvError) for res in results)
        infos = [res.info for res in results]
        if done:
            for k, (_, info) in zip(done, p.reset([slots[k] for k in done],
                                                 [n * (r + 1) + k for k in done])):
                infos[k] = info
        steps += n
        if time.perf_counter() - t0 > max_s:
            break
    dt = time.perf_counter() - t0
    p.release(slots)
    p.close()
    return steps / dt


class GymTextEnv(gym.Env):
    """A TextEnv as a gymnasium.Env (Text spaces) so AsyncVectorEnv can host it."""

    observation_space = Text(max_length=100_000)
    action_space = Text(max_length=2_000)

    def __init__(self, env: str, kwargs: dict) -> None:
        self.env = make_env(env, **kwargs)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        return self.env.reset(seed=seed)

    def step(self, action: str) -> tuple:
        r = self.env.step(action)
        return r.observation, r.reward, r.terminated, r.truncated, r.info

    def close(self) -> None:
        self.env.close()


def async_vector(env: str, kwargs: dict, n: int, rounds: int, max_s: float) -> float:
    from gymnasium.vector import AsyncVectorEnv

    spec, rng = env_spec(env), random.Random(0)
    vec = AsyncVectorEnv([partial(GymTextEnv, env, kwargs)] * n, shared_memory=False,
                         copy=False)
    _, infos = vec.reset(seed=list(range(n)))

    def split(infos: dict) -> list[dict]:  # the vector env stacks info dicts key by key
        return [{k: v[i] for k, v in infos.items() if not k.startswith("_")} for i in range(n)]

    per_env = split(infos)
    steps, t0 = 0, time.perf_counter()
    for _ in range(rounds):
        # After a finished episode the next step call autoresets that slot (gymnasium 1.x
        # next-step mode); the action given for it is ignored and the reset is the slot's step.
        _, _, _, _, infos = vec.step(tuple(spec.random_action(i, rng) for i in per_env))
        per_env = split(infos)
        steps += n
        if time.perf_counter() - t0 > max_s:
            break
    dt = time.perf_counter() - t0
    vec.close()
    return steps / dt


def scaling(env: str, kwargs: dict, counts: list[int], rounds: int, max_s: float) -> list:
    """Steps/s of a browser-backed env against its replica count: one replica per Ray actor
    (each actor a process with its own browser) and one actor stepping its replicas on
    threads (`env.step_threads`), each count against one replica in one actor."""
    rows = []
    for n in counts:
        print(f"[bench] {env} scaling: {n} replica(s) x {rounds} rounds", flush=True)
        rows.append((n, f"EnvPool, {n} Ray actor(s) x 1 replica",
                     pool(env, kwargs, n, rounds, max_s, actors=n)))
        if n > 1:
            rows.append((n, f"EnvPool, 1 Ray actor x {n} replicas, step_threads={n}",
                         pool(env, kwargs, n, rounds, max_s, actors=1, step_threads=n)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--max-seconds", type=float, default=60.0, help="cap per measurement")
    ap.add_argument("--envs", nargs="*", default=list(ENVS), choices=list(ENVS),
                    help="envs of the method table (none: only the MiniWoB scaling table)")
    ap.add_argument("--scaling", type=int, nargs="*", default=[1, 2, 4], metavar="N",
                    help="replica counts of the MiniWoB scaling table (none: skip it)")
    ap.add_argument("--out", help="write the table and settings as JSON here")
    args = ap.parse_args()

    from horizonrl.cluster.config import RayConfig
    from horizonrl.cluster.ops.runtime import ray_session

    rows = []
    with ray_session(RayConfig(num_cpus=2)):
        for env in args.envs:
            kwargs, n, r, cap = ENVS[env], args.replicas, args.rounds, args.max_seconds
            print(f"[bench] {env}: {n} replicas x {r} rounds", flush=True)
            base = in_process(env, kwargs, n, r, cap)
            rows.append((env, "in-process loop (baseline)", base))
            for actors in (1, 2):
                rows.append((env, f"EnvPool, {actors} Ray actor(s)",
                             pool(env, kwargs, n, r, cap, actors)))
            rows.append((env, "EnvPool, in-process (env.in_process, 1 worker)",
                         pool(env, kwargs, n, r, cap, 1, in_process=True)))
            rows.append((env, f"gymnasium AsyncVectorEnv ({n} processes)",
                         async_vector(env, kwargs, n, r, cap)))
        scale = scaling("miniwob", MINIWOB, args.scaling, SCALING_ROUNDS, args.max_seconds)
    if rows:
        print("\n| env | method | steps/s | vs in-process |\n|---|---|---|---|")
    table = []
    for env, method, sps in rows:
        base = next(s for e, m, s in rows if e == env and m.startswith("in-process"))
        print(f"| {env} | {method} | {sps:,.0f} | {sps / base:.2f}x |")
        table.append({"env": env, "method": method, "steps_per_s": round(sps, 1),
                      "vs_in_process": round(sps / base, 3)})
    scale_table = []
    if scale:
        print("\n| miniwob replicas | method | steps/s | per replica | vs 1 replica |\n"
              "|---|---|---|---|---|")
    for n, method, sps in scale:
        one = scale[0][2]
        print(f"| {n} | {method} | {sps:.1f} | {sps / n:.1f} | {sps / one:.2f}x |")
        scale_table.append({"replicas": n, "method": method, "steps_per_s": round(sps, 2),
                            "per_replica": round(sps / n, 2), "vs_one": round(sps / one, 3)})
    if args.out:
        import json
        from pathlib import Path

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({
            "command": command_line(),
            "replicas": args.replicas, "rounds": args.rounds, "rows": table,
            "miniwob": {"kwargs": MINIWOB, "rounds": SCALING_ROUNDS, "rows": scale_table}},
            indent=2))


if __name__ == "__main__":
    main()
