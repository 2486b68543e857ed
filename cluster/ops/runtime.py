"""Starting and joining Ray: a private local cluster on 127.0.0.1, or an existing one."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from horizonrl.cluster.config import RayConfig

log = logging.getLogger(__name__)

# Verified for Ray 2.60 on one machine (see shared FEASIBILITY notes): without the first, Ray
# swaps 127.0.0.1 for the machine's network address. Local single-node runs only.
LOCAL_RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "GLOO_SOCKET_IFNAME": "lo",
    "TOKENIZERS_PARALLELISM": "false",
}
# Ray waits a fixed 30 s for a new raylet to register with its GCS and then gives up with the
# first message; the second is its wait for the GCS to write its port file. On a loaded 2-core
# machine either happens now and then (each seen in CI, next to another test's training run);
# a second start nearly always succeeds.
STARTUP_TIMEOUT_TEXT = "timed out during startup"
STARTUP_TIMEOUT_TEXTS = (STARTUP_TIMEOUT_TEXT, "Timed out waiting for file")
LOCAL_START_ATTEMPTS = 3


def start_local(init: Callable[[], object], attempts: int = LOCAL_START_ATTEMPTS) -> None:
    """Run `init` (a local `ray.init`), again after a startup timeout, up to `attempts` times.
    The processes a failed attempt left behind (its GCS, raylet, reaper: children of this
    process that were not there before) are killed by id before the next one."""
    import psutil

    me = psutil.Process()
    for attempt in range(1, attempts + 1):
        before = {p.pid for p in me.children(recursive=True)}
        try:
            init()
            return
        except Exception as exc:
            if attempt == attempts or not any(t in str(exc) for t in STARTUP_TIMEOUT_TEXTS):
                raise
            stray = [p for p in me.children(recursive=True) if p.pid not in before]
            log.warning("local Ray did not start (attempt %d of %d: %s); stopping its %d "
                        "processes and starting again", attempt, attempts, exc, len(stray))
            for proc in stray:
                try:
                    proc.kill()
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(stray, timeout=10)


def link_worker_logs(run_dir: Path) -> Path | None:
    """run_dir/ray-logs -> this Ray session's log folder (every actor's stdout and stderr), where
    the driver's machine holds it; the link's target, or None where it is not here."""
    import ray

    try:  # Ray has no public accessor for the session's log folder
        logs = Path(ray._private.worker._global_node.get_logs_dir_path())
    except AttributeError:  # not a node of this machine (a client connection)
        return None
    if not logs.is_dir():
        return None
    link = run_dir / "ray-logs"
    if link.is_symlink():  # a resumed run: the new session's logs
        link.unlink()
    if not link.exists():
        link.symlink_to(logs, target_is_directory=True)
    return logs


@contextmanager
def ray_session(cfg: RayConfig) -> Iterator[None]:
    """Join `cfg.address` (or RAY_ADDRESS under `ray job submit`), else run a local Ray. A Ray
    this process has already joined (a notebook's or a test session's `ray.init`) is used as it
    is and left running: it is its starter's to stop."""
    import ray

    if ray.is_initialized():
        log.info("using the Ray this process already joined (%s CPUs); cfg.ray is not applied",
                 ray.cluster_resources().get("CPU", 0))
        yield
        return
    address = cfg.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=cfg.log_to_driver)
    else:
        os.environ.update(LOCAL_RAY_ENV)
        # address="local": always a Ray of our own; without it ray.init joins any Ray already
        # running on the machine (another run's, another test's) and then refuses num_cpus.
        start_local(lambda: ray.init(
            address="local", num_cpus=cfg.num_cpus, include_dashboard=False,
            _node_ip_address="127.0.0.1",
            log_to_driver=cfg.log_to_driver, runtime_env={"env_vars": LOCAL_RAY_ENV}))
    try:
        yield
    finally:
        ray.shutdown()
