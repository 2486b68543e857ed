"""`horizonrl train --dry-run`: the placement plan of a config, checked against the cluster."""

from __future__ import annotations

from collections import Counter

from cluster.config import RunConfig


def placement_plan(cfg: RunConfig) -> list[tuple[str, int, dict[str, float]]]:
    """(role, count, resources per actor) for every actor the run starts."""
    g, learner = cfg.generator, cfg.learner
    gen = {"CPU": g.num_cpus, **({"GPU": g.num_gpus} if g.num_gpus else {})}
    ranks = {"CPU": learner.num_cpus_per_worker,
             **({"GPU": learner.num_gpus_per_worker} if learner.num_gpus_per_worker else {})}
    envs = [(f"env actor ({e.key}, {e.replicas_per_actor} replicas)",
             g.num_generators * e.num_actors, {"CPU": e.num_cpus_per_actor}) for e in cfg.envs]
    return [
        ("generator (vLLM + agent loops)", g.num_generators, gen),
        *envs,
        (f"learner rank (DeepSpeed ZeRO-{learner.zero_stage})", learner.world_size, ranks),
        ("curriculum", 1, {}),
    ]


def total(plan: list[tuple[str, int, dict[str, float]]]) -> dict[str, float]:
    need: Counter[str] = Counter()
    for _, n, res in plan:
        for k, v in res.items():
            need[k] += n * v
    return dict(need)


def cluster_resources(cfg: RunConfig) -> tuple[str, dict[str, float]]:
    """What the run would get: a connected cluster's totals, or the local Ray it would start."""
    import os

    address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
    if address:
        import ray

        ray.init(address=address, log_to_driver=False)
        try:
            return f"Ray cluster at {address}", dict(ray.cluster_resources())
        finally:
            ray.shutdown()
    import torch

    return "a local Ray on 127.0.0.1", {"CPU": float(cfg.ray.num_cpus),
                                        "GPU": float(torch.cuda.device_count())}


def dry_run(cfg: RunConfig) -> int:
    """Print the plan; 0 when it fits, 2 with what is missing otherwise."""
    plan = placement_plan(cfg)
    where, have = cluster_resources(cfg)
    print(f"placement plan for {cfg.name!r} on {where}:")
    for role, n, res in plan:
        each = ", ".join(f"{v:g} {k}" for k, v in res.items()) or "no reserved resources"
        print(f"  {n} x {role}: {each} each")
    need = total(plan)
    print("  total: " + ", ".join(f"{v:g} {k}" for k, v in need.items()))
    short = {k: (v, have.get(k, 0.0)) for k, v in need.items() if v > have.get(k, 0.0) + 1e-9}
    if short:
        lines = [f"{k}: needs {v:g}, {where} has {h:g}" for k, (v, h) in short.items()]
        print("does not fit: " + "; ".join(lines))
        return 2
    print("fits: " + ", ".join(f"{k} {need[k]:g}/{have.get(k, 0.0):g}" for k in need))
    return 0
