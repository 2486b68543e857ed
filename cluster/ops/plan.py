"""`horizonrl train --dry-run`: the placement plan of a config, checked against the cluster."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from horizonrl.cluster.config import RunConfig
from horizonrl.learner.config import rank_bundle
from horizonrl.protos.precision import engine_dtype, learner_dtype


def placement_plan(cfg: RunConfig) -> list[tuple[str, int, dict[str, float]]]:
    """(role, count, resources per actor) for every actor the run starts."""
    g, learner = cfg.generator, cfg.learner
    gen = {"CPU": g.num_cpus, **({"GPU": g.num_gpus} if g.num_gpus else {}), **g.resources}
    envs = [(f"env actor ({e.key}, {e.replicas_per_actor} replicas)",
             g.num_generators * e.num_actors, {"CPU": e.num_cpus_per_actor, **e.resources})
            for e in cfg.envs]
    return [
        ("generator (vLLM + agent loops)", g.num_generators, gen),
        *envs,
        (f"learner rank (DeepSpeed ZeRO-{learner.zero_stage})", learner.world_size,
         rank_bundle(learner)),
        ("curriculum", 1, {}),
    ]


def total(plan: list[tuple[str, int, dict[str, float]]]) -> dict[str, float]:
    need: Counter[str] = Counter()
    for _, n, res in plan:
        for k, v in res.items():
            need[k] += n * v
    return dict(need)


class DoesNotFit(RuntimeError):
    """The cluster cannot hold the run's actors: the message says what is missing."""


def shortfall(need: dict[str, float], have: dict[str, float], *, where: str) -> str:
    """What `have` lacks of `need` ("CPU: needs 2.5, <where> 1; ..."); "" when nothing."""
    return "; ".join(f"{k}: needs {v:g}, {where} {have.get(k, 0.0):g}" for k, v in need.items()
                     if v > have.get(k, 0.0) + 1e-9)


def node_requests(cfg: RunConfig) -> list[tuple[str, int, dict[str, float]]]:
    """The plan as requests that must each fit one node whole: learner ranks packed strictly
    are one request of all their bundles."""
    plan = placement_plan(cfg)
    if cfg.learner.placement_strategy != "STRICT_PACK":
        return plan
    out = []
    for role, n, res in plan:
        if role.startswith("learner rank"):  # "learner rank (DeepSpeed ZeRO-2 x 4, ...)"
            out.append((f"{role[:-1]} x {n}, STRICT_PACK)", 1, {k: n * v for k, v in res.items()}))
        else:
            out.append((role, n, res))
    return out


def misfits(plan: list[tuple[str, int, dict[str, float]]],
            nodes: dict[str, dict[str, float]]) -> list[str]:
    """One line per role of `plan` that no node of `nodes` ({node: its resources}) holds even
    with nothing else on it, saying what no node has. Ray places an actor (or a placement-group
    bundle) whole on one node, so such an actor stays pending for ever, whatever the totals."""
    lines = []
    for role, n, res in plan:
        if not n or not res or any(not shortfall(res, have, where="has")
                                   for have in nodes.values()):
            continue
        asked = ", ".join(f"{k} {v:g}" for k, v in res.items())
        lines.append(f"{role} needs {asked} on one node; {_no_node_has(res, nodes)}")
    return lines


def _no_node_has(res: dict[str, float], nodes: dict[str, dict[str, float]]) -> str:
    """The resources of `res` that no node has enough of, or (each being somewhere) what the
    first few nodes lack of it."""
    most = {k: max((have.get(k, 0.0) for have in nodes.values()), default=0.0) for k in res}
    short = [f"{k} {v:g} (the most any node has is {most[k]:g})"
             for k, v in res.items() if v > most[k] + 1e-9]
    if short:
        return "no node has " + ", ".join(short)
    return "no node has all of it (" + "; ".join(
        f"{node}: {shortfall(res, have, where='has')}"
        for node, have in list(nodes.items())[:4]) + ")"


def wait_until_fits(cfg: RunConfig, *, poll_s: float = 10.0) -> None:
    """Inside the run's Ray session, before any actor starts: return once every actor of the
    plan fits some alive node and the cluster's free resources hold them all, or raise
    DoesNotFit with what is missing after `ray.wait_for_resources_s` (0: at once). Without it
    a run that cannot be placed hangs silently on its first pending actor."""
    import ray

    requests = node_requests(cfg)
    need = total(requests)
    deadline = time.monotonic() + cfg.ray.wait_for_resources_s
    while missing := ("; ".join(misfits(requests, live_nodes()))
                      or shortfall(need, ray.available_resources(), where="free now")):
        left = deadline - time.monotonic()
        if left <= 0:
            raise DoesNotFit(
                f"the run does not fit the Ray cluster: {missing} (`horizonrl train --dry-run` "
                "prints the plan; lower generator/env/learner num_cpus or num_gpus, or add "
                "nodes; set ray.wait_for_resources_s to wait for an autoscaler)")
        print(f"[horizonrl] waiting for resources ({missing}); {left:.0f}s left", flush=True)
        time.sleep(min(poll_s, left))


def wait_started(actors: dict[str, Any], *, timeout_s: float, needs: dict[str, float],
                 knob: str) -> None:
    """Wait for each actor's `ready()` ({name: handle}) at most `timeout_s`. Past it the actors
    not running are killed (never to start later) and DoesNotFit names them: an actor Ray
    cannot place would otherwise be waited on for ever."""
    import ray

    refs = {name: a.ready.remote() for name, a in actors.items()}
    _, pending = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    ray.get([r for r in refs.values() if r not in pending])  # a failed start raises its error
    late = [name for name, ref in refs.items() if ref in pending]
    if not late:
        return
    for name in late:
        ray.kill(actors[name])
    raise DoesNotFit(
        f"{', '.join(late)} not running within {timeout_s:g}s ({knob}): no node had room for "
        f"it (each needs {', '.join(f'{k} {v:g}' for k, v in needs.items())}; free now: "
        f"{ray.available_resources()}), or its model loads slower than that (raise {knob})")


def place_on_nodes(plan: list[tuple[str, int, dict[str, float]]],
                   nodes: dict[str, dict[str, float]]
                   ) -> tuple[dict[str, Counter[str]], list[str]]:
    """Where each actor of `plan` could go on `nodes` ({node: its resources}): first fit, the
    largest requests first, as a packing scheduler would. Returns {node: Counter(role)} and
    the roles that fit on no node (a request must fit one node whole, so totals that suffice
    can still leave some out)."""
    free = {node: dict(res) for node, res in nodes.items()}
    # Roles that reserve nothing (the curriculum, on the driver's node) take no room anywhere.
    actors = sorted(((role, res) for role, n, res in plan if res for _ in range(n)),
                    key=lambda a: (a[1].get("GPU", 0.0), len(a[1]), a[1].get("CPU", 0.0)),
                    reverse=True)
    placed: dict[str, Counter[str]] = {node: Counter() for node in nodes}
    unplaced = []
    for role, res in actors:
        node = next((n for n, have in free.items()
                     if all(have.get(k, 0.0) + 1e-9 >= v for k, v in res.items())), None)
        if node is None:
            unplaced.append(role)
            continue
        for k, v in res.items():
            free[node][k] = free[node].get(k, 0.0) - v
        placed[node][role] += 1
    return placed, unplaced


def live_nodes() -> dict[str, dict[str, float]]:
    """{node IP: its total resources} of the alive nodes of the connected cluster; nodes that
    share an IP (several raylets on one machine) are told apart by their node id."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    ips = Counter(n["NodeManagerAddress"] for n in alive)

    def name(n: dict[str, Any]) -> str:
        ip = n["NodeManagerAddress"]
        return ip if ips[ip] == 1 else f"{ip} (node {n['NodeID'][:10]})"

    return {name(n): {k: v for k, v in n["Resources"].items() if not k.startswith("node:")}
            for n in alive}


def cluster_resources(cfg: RunConfig
                      ) -> tuple[str, dict[str, float], dict[str, dict[str, float]]]:
    """What the run would get: (where, total resources, per-node resources) of a connected
    cluster, or of the local Ray it would start (no per-node view: {})."""
    import os

    address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
    if address:
        import ray

        ray.init(address=address, log_to_driver=False)
        try:
            return f"Ray cluster at {address}", dict(ray.cluster_resources()), live_nodes()
        finally:
            ray.shutdown()
    import torch

    return "a local Ray on 127.0.0.1", {"CPU": float(cfg.ray.num_cpus),
                                        "GPU": float(torch.cuda.device_count())}, {}


def model_shape(cfg: RunConfig):
    """The starting model's shape: model.path's config.json, or the tiny model's settings."""
    from pathlib import Path

    from horizonrl.cluster.config import TINY_PRESETS
    from horizonrl.cluster.model.tiny_model import tiny_qwen2_config
    from horizonrl.cluster.ops.memory_plan import ModelShape

    if cfg.model.path is not None:
        return ModelShape.from_config(Path(cfg.model.path))
    tiny = cfg.model.tiny  # its vocabulary is at most vocab_size entries
    hidden, layers = TINY_PRESETS[tiny.preset] if tiny.preset else (tiny.hidden_size,
                                                                     tiny.num_layers)
    return ModelShape.from_dict(tiny_qwen2_config(tiny.vocab_size, hidden, layers).to_dict())


def memory_report(cfg: RunConfig, gpu_gib: float | None) -> bool:
    """Print the per-GPU memory plan; False when a role needs more than `gpu_gib`."""
    from horizonrl.cluster.ops.memory_plan import format_plan, memory_plan
    from horizonrl.learner.layout import DEFAULT_BUDGET

    g, learner = cfg.generator, cfg.learner
    episodes = g.tasks_per_step * g.group_size
    rows_per_micro = max(1, episodes // (learner.world_size * learner.minibatches))
    if learner.layout == "padded":
        tokens = learner.micro_batch_tokens or rows_per_micro * g.max_context_tokens
    else:  # a token budget per pass, never below one row of the full context
        tokens = max(learner.micro_batch_tokens or DEFAULT_BUDGET, g.max_context_tokens)
    shape = model_shape(cfg)
    # The plan is per GPU, and `auto` means bf16 on the GPUs it is for (Ampere and later).
    plans = memory_plan(
        shape, zero_stage=learner.zero_stage, world_size=learner.world_size,
        dtype=learner_dtype(learner.dtype, native_bf16=True),
        micro_batch_tokens=tokens, checkpointing=learner.gradient_checkpointing,
        kl_coef=learner.kl_coef, context_tokens=g.max_context_tokens,
        generator_dtype=engine_dtype(g.dtype, native_bf16=True),
        gpu_memory_utilization=g.gpu_memory_utilization)
    n = shape.params()
    size = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"
    print(f"memory plan per GPU ({size} parameters; learner micro-batch "
          f"{tokens} tokens; generator KV for one sequence of {g.max_context_tokens} tokens, "
          f"the least vLLM starts with; all {episodes // g.num_generators} episodes of a "
          "generator at full context need that many times the KV):")
    lines, fits = format_plan(plans, gpu_gib=gpu_gib)
    print("\n".join(lines))
    return fits


def print_per_node(plan: list[tuple[str, int, dict[str, float]]],
                   nodes: dict[str, dict[str, float]]) -> bool:
    """Print where the actors could go on a live cluster's nodes; False when some fit none."""
    placed, unplaced = place_on_nodes(plan, nodes)
    print("per node (first fit, largest requests first):")
    for node, roles in placed.items():
        what = ", ".join(f"{n} x {role}" for role, n in roles.items()) or "nothing"
        print(f"  {node}: {what}")
    if unplaced:
        print("does not fit on any one node: " + ", ".join(
            f"{n} x {role}" for role, n in Counter(unplaced).items()))
    return not unplaced


def dry_run(cfg: RunConfig, gpu_gib: float | None = None,
            resources: dict[str, float] | None = None) -> int:
    """Print the plan; 0 when it fits, 2 with what is missing otherwise. `gpu_gib`: memory
    of one GPU of the nodes the run is meant for (default: this machine's first GPU, if any);
    `resources`: the cluster the run is meant for (default: the one it would get here)."""
    plan = placement_plan(cfg)
    if resources is not None:
        where, have, nodes = "the described cluster", resources, {}
    else:
        where, have, nodes = cluster_resources(cfg)
    print(f"placement plan for {cfg.name!r} on {where}:")
    for role, n, res in plan:
        each = ", ".join(f"{v:g} {k}" for k, v in res.items()) or "no reserved resources"
        print(f"  {n} x {role}: {each} each")
    need = total(plan)
    print("  total: " + ", ".join(f"{v:g} {k}" for k, v in need.items()))
    if gpu_gib is None and need.get("GPU"):
        import torch

        if torch.cuda.is_available():
            gpu_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    memory_fits = memory_report(cfg, gpu_gib) if need.get("GPU") or gpu_gib else True
    missing = shortfall(need, have, where=f"{where} has")
    if missing:
        print("does not fit: " + missing)
        return 2
    if nodes and not print_per_node(plan, nodes):
        return 2
    if not memory_fits:
        return 2
    print("fits: " + ", ".join(f"{k} {need[k]:g}/{have.get(k, 0.0):g}" for k in need))
    return 0
