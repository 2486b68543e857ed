"""Shared fixtures: a tiny model built once per session, and local-Ray environment settings."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from horizonrl.cluster.ops.runtime import LOCAL_RAY_ENV

os.environ.update(LOCAL_RAY_ENV)
# Test workers (`pytest -n`, make test) run side by side, each starting its own local Rays:
# each gets a Ray temp dir of its own, so no worker's Ray finds another's files there.
if _worker := os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("RAY_TMPDIR", f"/tmp/ray-{_worker}")


ROOT = Path(__file__).resolve().parents[1]
TEST_MODEL = {"transcripts": 300, "pretrain_steps": 4, "batch_size": 8, "seed": 0}
# The code a built model depends on: a change to any of it builds the test model again.
MODEL_SOURCES = ("cluster/model", "envpool", "protos")
# The embedded default's tiny model as the suite builds it: the default config's settings with
# a shorter pre-training, added to the overrides of every test that runs the default config.
# The default's own build (6,000 transcripts, 600 steps) costs about 360 CPU-seconds on its first
# use, and a 2-rank DeepSpeed test beside it ran 16x slower (222 s against 14 s); this one builds
# in about 40 s on 2 cores, and on 32 eval tasks of GoToRedBall it succeeds as often as the
# default's (0.28 at horizon 3 for both, `horizonrl eval --tasks 32`, 2026-12-06). `make train`
# builds and trains the default's own.
SUITE_MODEL = ("model.tiny.transcripts=2000", "model.tiny.pretrain_steps=200",
               "model.tiny.batch_size=16")
# The learner on one DeepSpeed rank, for whole-stack tests of the rollout side (horizon
# broadcast, async staleness, partial rollouts, metrics, agent endpoint) and for the CLI's
# sft/rs/dpo on a run's trajectories: a rank's start costs about 5 CPU-seconds, and in every
# collective two ranks wait for each other to be scheduled while the other test worker holds
# the cores. Two ranks keep their own whole-stack tests (test_training_loop,
# test_window_context_loop, test_learner_group, the CLI's train runs, the chaos tests).
ONE_RANK = "learner.world_size=1"


def suite_model() -> Path:
    """The folder of the suite's default-config model (SUITE_MODEL), built on first use into
    .cache/models like any tiny model, under the lock every test worker and CLI run shares."""
    from horizonrl.cluster.config import load_config
    from horizonrl.cluster.model.load import ensure_model

    cfg = load_config(ROOT / "configs/babyai-local.yaml",
                      [*SUITE_MODEL, f"model.cache_dir={ROOT / '.cache/models'}"])
    return ensure_model(cfg.model, env=cfg.env)


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    """A small but real tiny model (tokenizer trained here, a few pre-training steps), built
    once into .cache/models and reused by later sessions and by every test worker, keyed by
    its settings and the source of the code that builds it."""
    import hashlib
    import json

    from horizonrl.cluster.model.load import built_once
    from horizonrl.cluster.model.tiny_model import build_tiny_model

    digest = hashlib.sha1(json.dumps(TEST_MODEL, sort_keys=True).encode())
    for folder in MODEL_SOURCES:
        for src in sorted((ROOT / folder).rglob("*.py")):
            digest.update(src.relative_to(ROOT).as_posix().encode() + src.read_bytes())
    out = ROOT / ".cache/models" / f"test-tiny-{digest.hexdigest()[:10]}"
    return built_once(out, lambda tmp: build_tiny_model(tmp, **TEST_MODEL))


@pytest.fixture(scope="session")
def tokenizer(tiny_model_path: Path):
    from horizonrl.protos.chat import load_tokenizer

    
    return load_tokenizer(tiny_model_path)


class SharedRay:
    """One local Ray per test process for the test modules that request `shared_ray`: their
    own `ray_session` calls join it (a Ray start and stop costs about 5 CPU-seconds, and the
    default suite had some 30). It is stopped when a test ends with fewer CPUs free than it
    began with (an actor or placement group of its own still alive), so no test finds another's
    leftovers, and before a test that starts or joins a Ray of its own (marked `own_ray`,
    chaos or multinode)."""

    def __init__(self) -> None:
        self.session = None
        self.starts = 0

    def owned(self) -> bool:
        import ray

        if self.session is not None and not ray.is_initialized():
            self.session = None  # a test shut it down itself
        return self.session is not None

    def up(self) -> None:
        import ray

        from horizonrl.cluster.config import RayConfig
        from horizonrl.cluster.ops.runtime import ray_session

        if self.owned() or ray.is_initialized():  # ours, or someone else's: left alone
            return
        self.session = ray_session(RayConfig())  # the config's default: 4 logical CPUs
        self.session.__enter__()
        self.starts += 1

    def down(self) -> None:
        if self.owned():
            session, self.session = self.session, None
            session.__exit__(None, None, None)

    def free_cpus(self) -> float | None:
        import ray

        return ray.available_resources().get("CPU", 0.0) if self.owned() else None

    def settle(self, free: float, timeout_s: float = 30.0) -> None:
        """Wait until `free` CPUs are free again (actor kills land asynchronously), else stop."""
        import gc

        deadline = time.monotonic() + timeout_s
        if (now := self.free_cpus()) is not None and now < free:
            gc.collect()  # actors whose last handle sits in garbage end with the handle
        while (now := self.free_cpus()) is not None and now < free:
            if time.monotonic() > deadline:
                print(f"\n[shared Ray] {free - now:g} CPUs still taken after the test: "
                      "stopping it", flush=True)
                self.down()
                return
            time.sleep(0.2)


SHARED_RAY = SharedRay()


@pytest.fixture(scope="module")
def shared_ray():
    """The process's shared local Ray (SharedRay), started on first use; every CPU free again
    when the module ends."""
    import ray

    SHARED_RAY.up()
    yield
    if SHARED_RAY.owned():
        SHARED_RAY.settle(ray.cluster_resources().get("CPU", 0.0))


@pytest.fixture(autouse=True)
def _ray_per_test(request):
    """A test that starts or joins a Ray of its own never finds the shared one running; a test
    on the shared one gives back every CPU it took."""
    if any(request.node.get_closest_marker(m) for m in ("own_ray", "chaos", "multinode")):
        SHARED_RAY.down()
    # Only its users are checked: the others (unit tests mostly) would each ask Ray twice.
    before = SHARED_RAY.free_cpus() if "shared_ray" in request.fixturenames else None
    yield
    if before is not None:
        SHARED_RAY.settle(before)


def pytest_collection_modifyitems(config, items):
    """Whole-stack modules (tests/e2e, then integration, chaos, multinode) first, in their own
    order, the short unit modules last: the test workers (`-n 2 --dist loadfile
    --no-loadscope-reorder`) take modules in this order, so the small ones fill in at the end
    and the workers end together (xdist's own order, most tests first, ran the unit modules
    first and left one worker idle for up to 50 s at the end)."""
    rank = {"e2e": 0, "unit": 2}
    items.sort(key=lambda item: rank.get(item.path.parent.name, 1))  # stable: modules stay whole


def pytest_sessionfinish(session, exitstatus):
    SHARED_RAY.down()
    if SHARED_RAY.starts:
        print(f"\n[shared Ray] started {SHARED_RAY.starts} time(s) in this test process")


@pytest.fixture()
def free_port() -> Callable[[], int]:
    """A function giving a free TCP port on 127.0.0.1 (bound and released at once)."""

    def pick() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    return pick


@pytest.fixture()
def kill_when() -> Callable[..., list]:
    """Start `cmd`, wait until a file matching `pattern` appears under `root` (at most
    `timeout_s`), then SIGKILL the process and everything it started (local Ray included), like
    a lost node. Returns the processes still alive afterwards."""

    def run(cmd: list[str], *, root: Path, pattern: str, cwd: Path, poll_s: float = 0.5,
            timeout_s: float = 600.0) -> list:
        import psutil

        proc = subprocess.Popen(cmd, cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + timeout_s
            while not list(root.glob(pattern)):
                assert proc.poll() is None, "the run exited before it could be killed"
                if time.monotonic() > deadline:
                    pytest.fail(f"no {pattern} within {timeout_s:.0f} s")
                time.sleep(poll_s)
        finally:
            parent = psutil.Process(proc.pid)
            procs = [parent, *parent.children(recursive=True)]
            for p in procs:
                try:
                    p.send_signal(signal.SIGKILL)
                except psutil.NoSuchProcess:
                    pass
            _, alive = psutil.wait_procs(procs, timeout=30)
            proc.wait(timeout=30)
        return alive

    return run


class ScriptedEngine:
    """The agent loop's Engine with pre-set turns ((ids, logprobs) per call, one prompt per
    call), recording every prompt it was given: the expected ids are then known exactly."""

    def __init__(self, turns):
        self.turns = list(turns)
        self.prompts = []

    def generate(self, prompts, *, max_tokens, temperature):
        from horizonrl.actors.rollout import Completion

        self.prompts.append(list(prompts[0]))
        ids, lps = self.turns.pop(0)
        return [Completion(tuple(ids), tuple(lps), "stop")]


@pytest.fixture()
def scripted_engine() -> type[ScriptedEngine]:
    return ScriptedEngine


@pytest.fixture()
def fleet_of() -> Callable[..., object]:
    """The real `Fleet`'s version keeping around generators a test made itself (stand-ins),
    for a phase built on a stand-in trainer: `fleet_of([gen], version=0)`."""

    def make(generators: list, *, version: int = 0):
        from horizonrl.cluster.rollout.fleet import Fleet

        fleet = Fleet.__new__(Fleet)  # no actors to spawn: the test's own are the fleet
        fleet.generators, fleet.version, fleet.restarts = list(generators), version, 0
        fleet.held = [version] * len(fleet.generators)
        fleet.weights = None
        return fleet

    return make


def mask_runs(mask) -> list[tuple[int, int, int]]:
    """(value, start, end) of each run of equal values in a response mask."""
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((mask[start], start, i))
            start = i
    return out


def async_steps(trainer, iterations: int) -> dict:
    """Train `iterations` async steps; what partial rollouts did: weight loads mid-rollout,
    trained episodes whose turns span versions (checked to rise), each episode's lag behind
    the version its step began with, the last ledger, and the trajectories trained on."""
    loads, spanning, lags, trained, m = 0.0, 0, [], [], {}
    for _ in range(iterations):
        version = trainer.policy_version
        m = trainer.step()
        loads += m["async"]["weight_loads_mid_rollout"]
        trained += trainer.last_trajectories
        for t in trainer.last_trajectories:
            lags.append(version - t.policy_version)
            if t.turn_versions:
                spanning += 1
                assert min(t.turn_versions) == t.policy_version
                assert list(t.turn_versions) == sorted(t.turn_versions)
    return {"loads": loads, "spanning": spanning, "lags": lags, "ledger": m.get("ledger"),
            "trained": trained}
