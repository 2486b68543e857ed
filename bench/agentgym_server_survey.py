"""AgentGym's own TextCraft, BabyAI and SciWorld servers, driven through horizonrl's client:
what each answers and what works, measured (docs/agentgym.md).

    .venv/bin/python bench/agentgym_server_survey.py --out docs/agentgym/servers.json

Per server (started unmodified from ../shared/agentgym-servers in `make install-dev`'s venv, on
127.0.0.1): the median time of /create + /reset and of /step, scripted episodes solved through
the client (TextCraft from the recipe lines, BabyAI GoTo levels from the available actions,
SciWorld along the gold path), the episode reward sums (SciWorld: on the native 0-1 scale),
rejected actions the client counts as invalid, what /close answers and whether it frees the env
(SciWorld: the server's JVM count), and whether a restarted server is recovered at the next
reset. Every loop is bounded by its task list.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import httpx

from horizonrl.cluster.ops.provenance import command_line
from horizonrl.envpool.agentgym_experts import (
    TextCraftPlanner,
    babyai_action,
    sciworld_games,
    sciworld_gold_path,
)
from horizonrl.envpool.agentgym_http import AgentGymEnvLostError, AgentGymHTTPEnv
from horizonrl.envpool.agentgym_servers import (
    AgentGymServer,
    default_python,
    default_servers_dir,
    java_processes,
)

ROOT = Path(__file__).resolve().parents[1]
INVALID = {"textcraft": ["hello", "craft 1 foo using 2 bar", "get 1 no such thing"],
           "babyai": ["dance", "go to the moon", "pickup"],
           "sciworld": ["fly to the moon", "dance", "xyzzy"]}


def textcraft_episode(env: AgentGymHTTPEnv, task: int) -> tuple[float, bool, int]:
    obs, _ = env.reset(seed=task)
    total, plan = 0.0, TextCraftPlanner(obs).plan()
    for action in plan:
        result = env.step(action)
        total += result.reward
    return total, bool(result.info["success"]), len(plan)


def babyai_episode(env: AgentGymHTTPEnv, task: int) -> tuple[float, bool, int]:
    obs, _ = env.reset(seed=task)
    mission, total, turns = obs.splitlines()[0], 0.0, 0
    while turns < 20:
        result = env.step(babyai_action(obs, mission))
        obs, total, turns = result.observation, total + result.reward, turns + 1
        if result.terminated or result.truncated:
            break
    return total, bool(result.info["success"]), turns


def sciworld_episode(env: AgentGymHTTPEnv, task: tuple[str, int],
                     games: list[tuple[str, int]]) -> tuple[float, bool, int]:
    env.reset(seed=games.index(task))
    total, turns = 0.0, 0
    for action in sciworld_gold_path(*task):
        result = env.step(action)
        total, turns = total + result.reward, turns + 1
        if result.terminated:
            break
    return total, bool(result.info["success"]), turns


def measure(name: str, server: AgentGymServer, tasks: list) -> dict:
    games = sciworld_games() if name == "sciworld" else []
    play = {"textcraft": textcraft_episode, "babyai": babyai_episode,
            "sciworld": lambda e, t: sciworld_episode(e, t, games)}[name]
    out: dict = {"tasks": [str(t) for t in tasks]}
    with AgentGymHTTPEnv(server.url, server=name, timeout_s=120.0) as env:
        t0 = time.perf_counter()
        first, _ = env.reset(seed=0 if name != "sciworld" else games.index(tasks[0]))
        out["create_reset_s"] = round(time.perf_counter() - t0, 3)
        out["first_line"] = first.split("\n")[0][:100]
        rewards, solved, step_times = [], 0, []
        for task in tasks:
            t0 = time.perf_counter()
            total, success, turns = play(env, task)
            step_times.append((time.perf_counter() - t0) / max(turns, 1))
            rewards.append(round(total, 4))
            solved += success
        out |= {"solved": solved, "episodes": len(tasks), "reward_sums": rewards,
                "median_s_per_turn_with_reset": round(statistics.median(step_times), 3)}
        after = env.step("look")  # after the end: answered by the client, nothing sent
        out["step_after_end_sent"] = not after.info["invalid_action"]
        env.reset(seed=0 if name != "sciworld" else games.index(tasks[0]))
        rejected = [env.step(a) for a in INVALID[name]]
        counted = sum(r.info["invalid_action"] for r in rejected)
        out["invalid_counted"] = f"{counted}/{len(rejected)}"
        out["invalid_replies"] = sorted({r.observation.split("\n")[0][:80] for r in rejected})
    out |= close_and_restart(name, server)
    return out


def close_and_restart(name: str, server: AgentGymServer) -> dict:
    out: dict = {}
    time.sleep(2.0)  # a closed gateway's JVM exits a moment after /close answers
    jvms = [java_processes(server.pid)]
    for task in range(3):  # three recycled replicas: create, reset, close
        with AgentGymHTTPEnv(server.url, server=name, timeout_s=120.0) as env:
            env.reset(seed=task)
            env_id = env.env_id
            jvms.append(java_processes(server.pid))
    answer = httpx.post(f"{server.url}/close", json={"id": env_id}, timeout=30.0)
    out["second_close_answer"] = f"HTTP {answer.status_code} {answer.text[:40]}"
    time.sleep(2.0)
    out["jvms_before_while_open_x3_after"] = [*jvms, java_processes(server.pid)]
    with AgentGymHTTPEnv(server.url, server=name, timeout_s=120.0) as env:
        env.reset(seed=1)
        server.restart()
        try:
            env.step("look")
            out["restart"] = "step after restart answered (not detected)"
        except AgentGymEnvLostError:
            env.reset(seed=1)
            out["restart"] = "lost env detected at step; recovered at the next reset"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    servers_dir, python = default_servers_dir(ROOT), default_python(ROOT)
    tasks = {"textcraft": list(range(10)), "babyai": [0, 1, 2, 40, 41, 42, 80, 81, 82, 3],
             "sciworld": [("find-non-living-thing", 0), ("find-living-thing", 0),
                          ("find-plant", 0), ("find-animal", 0), ("chemistry-mix", 0)]}
    results = {}
    for name, todo in tasks.items():
        print(f"[agentgym] {name}: {len(todo)} scripted episodes ...", flush=True)
        with AgentGymServer(name, servers_dir, python=python) as server:
            results[name] = measure(name, server, todo)
        print(f"[agentgym] {name}: {json.dumps(results[name])}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": command_line(), "servers": results,
                                    "agentgym_commit": "3ef9235"}, indent=1) + "\n")


if __name__ == "__main__":
    main()
