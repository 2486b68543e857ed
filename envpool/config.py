"""The `env` section of the run config."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from horizonrl.protos.placement import CustomResources


class EnvConfig(BaseModel):
    """Which environment to run and how its replicas are spread over Ray actors."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("babyai", description="Registered environment name (see envpool.registry).")
    kwargs: dict[str, Any] = Field(
        default_factory=lambda: {"level": "BabyAI-GoToRedBall-v0", "reward": "binary"},
        description="Keyword arguments for the environment's constructor.",
    )
    num_actors: int = Field(1, ge=1, description="Env actors per generator (Ray processes).")
    replicas_per_actor: int = Field(
        64, ge=1, description="Environment instances hosted by each env actor."
    )
    num_cpus_per_actor: float = Field(
        0.5, gt=0, description="Logical CPUs Ray reserves for each env actor."
    )
    resources: CustomResources = Field(
        default_factory=dict, description="Custom Ray resources per env actor, e.g. "
        "{\"env_node\": 0.1}: env actors run only on nodes that offer them (placement by role).")
    in_process: bool = Field(
        False, description="Host the replicas in the process that uses the pool (the "
        "generator) instead of Ray actors: no round trip per call, for cheap pure-Python envs "
        "(BabyAI, TextCraft, Deep Search). Calls keep their timeout (a thread per actor slot), "
        "but a hung env cannot be killed, only abandoned, and a crashing one takes the "
        "generator with it: keep Ray actors (the default) for JVMs, browsers and servers.")
    step_threads: int = Field(
        1, ge=1, description="Threads per env actor that run its replicas' calls at the same "
        "time (and concurrent calls into one actor): for envs whose steps wait on I/O (an "
        "HTTP server, a browser, a JVM over a socket). Pure-Python envs gain nothing under "
        "the GIL; 1 runs a batch's replicas one after another.")
    colocate: bool = Field(
        True, description="Start the env actors on the node of the process that uses the pool "
        "(the generator), where it has room: env steps stay off the network. Soft: with no "
        "room there (or `resources` only other nodes offer) they go elsewhere.")
    call_timeout_s: float = Field(
        60.0, gt=0, description="Deadline for one batched reset/step call to an env actor; a "
        "call past it fails its episodes with failure=timeout and the actor is restarted.",
    )
    start_timeout_s: float = Field(
        300.0, gt=0, description="Time an env actor may take to start (its process and "
        "replicas built: a JVM, a browser), counted on top of call_timeout_s for calls to an "
        "actor that has not answered yet, so a slow start after a restart is not taken for a "
        "hang.")
    eval_replicas_per_actor: int | None = Field(
        None, ge=1, description="Replicas per env actor in evaluations (`horizonrl eval`, the "
        "warm start's): unset, one per episode of the sweep (tasks x samples, on each actor), "
        "which suits cheap envs; set it where a replica is heavy (a browser, a JVM), and the "
        "sweep runs in waves of that many episodes per actor.")
    recycle_every_episodes: int = Field(
        0, ge=0, description="Close and rebuild a replica after this many episodes, to bound "
        "the memory of envs that leak (SciWorld's JVM); 0 never recycles.",
    )
    label: str | None = Field(
        None, description="Name of this env in task ids and metrics (default: `name`); set it "
        "when a run mixes two configurations of the same env.",
    )
    weight: float = Field(
        1.0, gt=0, description="Sampling weight of this env's tasks in a multi-env run "
        "(see `extra_envs`); groups never mix envs.",
    )

    @property
    def key(self) -> str:
        """The label used in task ids and metrics."""
        return self.label or self.name

    @model_validator(mode="after")
    def _urls(self) -> EnvConfig:
        urls = self.kwargs.get("urls")
        if urls is None:
            return self
        if "url" in self.kwargs:
            raise ValueError("env.kwargs: give `url` (one server for every replica) or `urls` "
                             "(one server per replica), not both")
        if not (isinstance(urls, list) and urls and all(isinstance(u, str) for u in urls)):
            raise ValueError(f"env.kwargs.urls must be a non-empty list of server URLs, got "
                             f"{urls!r}")
        if len(set(urls)) != len(urls):
            raise ValueError("env.kwargs.urls lists a server twice: each replica needs a server "
                             "of its own")
        return self

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        from horizonrl.envpool.registry import env_names

        if v not in env_names():
            raise ValueError(f"unknown env {v!r}; known: {', '.join(env_names())}")
        return v


def replica_kwargs(kwargs: dict[str, Any], index: int) -> dict[str, Any]:
    """The constructor kwargs of the run's replica number `index` (over all generators' pools):
    `urls: [u0, u1, ...]` gives replica i the server `url: u_i`. For servers that keep one
    global task state (AgentGym's WebArena), where two sessions on one server would score each
    other's tasks."""
    if "urls" not in kwargs:
        return kwargs
    urls = kwargs["urls"]
    if index >= len(urls):
        raise ValueError(f"env.kwargs.urls lists {len(urls)} servers, but replica {index} needs "
                         "one: give one URL per replica (generators x num_actors x "
                         "replicas_per_actor)")
    rest = {k: v for k, v in kwargs.items() if k != "urls"}
    return {**rest, "url": urls[index]}
