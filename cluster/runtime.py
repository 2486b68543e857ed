"""Starting and joining Ray: a private local cluster on 127.0.0.1, or an existing one."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from horizonrl.cluster.config import RayConfig

# Verified for Ray 2.60 on one machine (see shared FEASIBILITY notes): without the first, Ray
# swaps 127.0.0.1 for the machine's network address. Local single-node runs only.
LOCAL_RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "GLOO_SOCKET_IFNAME": "lo",
    "TOKENIZERS_PARALLELISM": "false",
}


@contextmanager
def ray_session(cfg: RayConfig) -> Iterator[None]:
    """Join `cfg.address` (or RAY_ADDRESS under `ray job submit`), else run a local Ray."""
    import ray

    address = cfg.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
    else:
        os.environ.update(LOCAL_RAY_ENV)
        ray.init(num_cpus=cfg.num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                 log_to_driver=True, runtime_env={"env_vars": LOCAL_RAY_ENV})
    try:
        yield
    finally:
        ray.shutdown()
