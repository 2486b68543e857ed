"""Custom Ray resources by role: the one type every role's config uses to say where it runs.

A node offers custom resources (`ray start --resources='{"env_node": 8}'`, KubeRay's
`rayStartParams.resources`); an actor that asks for one runs only on nodes that offer it. CPUs
and GPUs have their own fields per role, so they are refused here rather than counted twice.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

_BUILT_IN = frozenset({"CPU", "GPU", "memory", "object_store_memory"})


def _check(resources: dict[str, float]) -> dict[str, float]:
    for name, amount in resources.items():
        if name in _BUILT_IN:
            raise ValueError(f"{name!r} is not a custom resource: use the role's num_cpus / "
                             f"num_gpus fields (custom resources are node labels such as "
                             f"{{\"env_node\": 0.1}})")
        if amount <= 0:
            raise ValueError(f"resource {name!r} needs an amount above 0, got {amount}")
    return resources


CustomResources = Annotated[dict[str, float], AfterValidator(_check)]
"""{resource name: amount per actor} on top of the role's CPUs and GPUs."""


def is_wildcard(host: str) -> bool:
    """An address that binds every interface ("", 0.0.0.0, ::)."""
    return host.strip("[]") in ("", "0.0.0.0", "::")


def node_ip() -> str:
    """The IP of the Ray node this process runs on (127.0.0.1 outside Ray)."""
    import ray

    return ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
