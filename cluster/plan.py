"""`horizonrl train --dry-run`: the placement plan of a config, checked against the cluster."""

from __future__ import annotations

import time
from collections import Counter

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


def wait_until_fits(cfg: RunConfig, *, poll_s: float = 10.0) -> None:
    """Inside the run's Ray session, before any actor starts: return once the cluster's free
    resources hold every actor of the plan, or raise DoesNotFit with what is missing after
    `ray.wait_for_resources_s` (0: at once). Without it a run that cannot be placed hangs
    silently on its first pending actor."""
    import ray

    need = total(placement_plan(cfg))
    deadline = time.monotonic() + cfg.ray.wait_for_resources_s
    while missing := shortfall(need, ray.available_resources(), where="free now"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise DoesNotFit(
                f"the run does not fit the Ray cluster: {missing} (`horizonrl train --dry-run` "
                "prints the plan; lower generator/env/learner num_cpus or num_gpus, or add "
                "nodes; set ray.wait_for_resources_s to wait for an autoscaler)")
        print(f"[horizonrl] waiting for resources ({missing}); {left:.0f}s left", flush=True)
        time.sleep(min(poll_s, left))


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
    """{node IP: its total resources} of the alive nodes of the connected cluster."""
    import ray

    return {n["NodeManagerAddress"]: {k: v for k, v in n["Resources"].items()
                                      if not k.startswith("node:")}
            for n in ray.nodes() if n.get("Alive")}


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
    from horizonrl.cluster.memory_plan import ModelShape
    from horizonrl.cluster.tiny_model import tiny_qwen2_config

    if cfg.model.path is not None:
        return ModelShape.from_config(Path(cfg.model.path))
    tiny = cfg.model.tiny  # its vocabulary is at most vocab_size entries
    hidden, layers = TINY_PRESETS[tiny.preset] if tiny.preset else (tiny.hidden_size,
                                                                     tiny.num_layers)
    return ModelShape.from_dict(tiny_qwen2_config(tiny.vocab_size, hidden, layers).to_dict())


def memory_report(cfg: RunConfig, gpu_gib: float | None) -> bool:
    """Print the per-GPU memory plan; False when a role needs more than `gpu_gib`."""
    from horizonrl.cluster.memory_plan import format_plan, memory_plan

    g, learner = cfg.generator, cfg.learner
    episodes = g.tasks_per_step * g.group_size
    rows_per_micro = max(1, episodes // (learner.world_size * learner.minibatches))
    tokens = learner.micro_batch_tokens or rows_per_micro * g.max_context_tokens
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
