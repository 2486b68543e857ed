"""What a run needs from a cluster of several nodes, checked before any actor starts.

On one machine every default works: the ingest on 127.0.0.1, the run dir and the built model
under the checkout. On several nodes neither does: generators on other nodes cannot dial a
loopback ingest, and a learner rank on another node would write its checkpoint shards (and a
generator would look for the model) in a directory that exists only on the driver's node. Both
failures would show up late and far from their cause (a push timing out, a half-written
checkpoint), so a run on a multi-node cluster checks them at start and stops with what to set.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from horizonrl.cluster.config import RunConfig
from horizonrl.learner.ingest_guard import is_loopback


class NotMultiNodeReady(RuntimeError):
    """The config assumes one machine but the cluster has several nodes."""


def actor_nodes(nodes: list[dict] | None = None) -> list[dict]:
    """The alive nodes that can host a generator, an env actor or a learner rank (they all ask
    for CPUs or GPUs). A head started with no CPUs, as in deploy/kuberay, hosts none of them, so
    a head plus one worker is one machine as far as the run is concerned."""
    if nodes is None:
        import ray

        nodes = ray.nodes()
    return [n for n in nodes if n.get("Alive") and (n.get("Resources", {}).get("CPU", 0) > 0
                                                     or n.get("Resources", {}).get("GPU", 0) > 0)]


def check_multinode(cfg: RunConfig, model_dir: Path, *, timeout_s: float = 60.0) -> None:
    """On a cluster with more than one node that hosts actors: the ingest must bind an
    address the other nodes reach, and the run root and the model must be paths every such
    node sees (a shared volume). Raises NotMultiNodeReady naming the field to set; does
    nothing on one node."""
    nodes = actor_nodes()
    if len(nodes) < 2:
        return
    host = cfg.learner.ingest.host
    if is_loopback(host):
        raise NotMultiNodeReady(
            f"learner.ingest.host={host} binds the trajectory ingest to loopback, which the "
            f"generators on this cluster's other {len(nodes) - 1} node(s) cannot reach: set "
            "learner.ingest.host=0.0.0.0 (the driver then advertises its node's IP) and a "
            f"token in ${cfg.learner.ingest.auth_token_env}")
    for field, path in (("run_root", Path(cfg.run_root)),
                        ("the model folder (model.path, or model.cache_dir where it is built)",
                         model_dir)):
        missing = nodes_missing(path.resolve(), nodes, timeout_s=timeout_s)
        if missing:
            raise NotMultiNodeReady(
                f"{field} {path.resolve()} is not visible on node(s) {', '.join(missing)} of "
                f"this {len(nodes)}-node cluster: learner ranks and generators there would "
                "write checkpoints to (or load the model from) a directory that only exists "
                "on the driver's node. Point it at a location every node mounts (NFS, a "
                "Kubernetes PVC), e.g. run_root=/shared/runs and model.cache_dir=/shared/models")


def nodes_missing(directory: Path, nodes: list[dict], *, timeout_s: float) -> list[str]:
    """The IPs of the nodes that do not see a marker file written into `directory` here."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / f".horizonrl-shared-{uuid.uuid4().hex}"
    marker.write_text("written by the driver; other nodes look for it\n")
    try:
        probe = ray.remote(num_cpus=0)(_exists)
        refs = {n["NodeManagerAddress"]: probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
            str(marker)) for n in nodes}
        seen = dict(zip(refs, ray.get(list(refs.values()), timeout=timeout_s)))
    finally:
        marker.unlink(missing_ok=True)
    return sorted(ip for ip, ok in seen.items() if not ok)


def _exists(path: str) -> bool:
    return Path(path).exists()


def record_placement(run_dir: Path, generators: list, learner_workers: list) -> dict:
    """Where each role runs (node IPs): written to `<run>/placement.json` and printed, so a
    run on several nodes shows that its roles landed where the config's resources asked."""
    import json

    import ray

    from horizonrl.protos.placement import node_ip

    gens = ray.get([g.placement.remote() for g in generators])
    placement = {"driver": node_ip(), "generators": [g["generator"] for g in gens],
                 "env_actors": [ip for g in gens for ip in g["env_actors"]],
                 "learner_ranks": ray.get([w.node_ip.remote() for w in learner_workers])}
    (run_dir / "placement.json").write_text(json.dumps(placement, indent=2))
    where = "; ".join(f"{role} on {', '.join(sorted(set(ips)))}" for role, ips in
                      placement.items() if role != "driver")
    print(f"[horizonrl] placement: driver on {placement['driver']}; {where}", flush=True)
    return placement
