"""Two simulated hosts on this machine, each its own network namespace, joined by a veth pair
that this harness creates (10.77.K.1 and 10.77.K.2): a loopback bind on one host is out of reach
of the other, as on real machines. Host A runs the Ray head (custom resource `learner_node`),
host B a worker node (`rollout_node`); host B's raylet can run in a private mount namespace
with a tmpfs over chosen directories, so those are node-local to B. Everything is started
here and stopped by process id (never `ray stop`), and the namespaces and the veth pair are
removed on exit, also on failure. Needs root. Used by tests/multinode and by
bench/transport_hosts.py (with `ray=False`: the two hosts and their link only).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",  # with 0 a worker refuses to join
           "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
           "TOKENIZERS_PARALLELISM": "false",
           # A raylet waits this long for its agents' ports; on a busy 2-core machine the
           # default was too short and the raylet aborted at start.
           "RAY_agent_register_timeout_ms": "180000"}
PORT = 6380  # each namespace has its own port space: no clash with any other Ray
# The custom resources configs/multinode-local.yaml places roles by: learner on A, rollout on B.
RESOURCES = ('{"learner_node": 1}', '{"rollout_node": 1}')
DASHBOARD_PORT = 8265
START_ATTEMPTS = 3


def can_run() -> str | None:
    """Why the harness cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "needs iproute2 (`ip`) and util-linux (`unshare`)"
    return None


def _sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


class TwoHosts:
    """`with TwoHosts(tmp, b_private=[dir]) as h:` then `h.run_on_a([...])`."""

    def __init__(self, workdir: Path, *, cpus: int = 2, b_private: Sequence[Path] = (),
                 dashboard: bool = False, ray: bool = True) -> None:
        """`dashboard`: the head serves Ray's job API on host A's IP (`self.jobs_url`);
        `ray=False`: no Ray at all, the two hosts and their link only."""
        self.k = os.getpid() % 200 + 20  # subnet and names unique per test process
        self.ns = (f"hrl{self.k}a", f"hrl{self.k}b")
        self.ips = (f"10.77.{self.k}.1", f"10.77.{self.k}.2")
        self.address = f"{self.ips[0]}:{PORT}"
        self.workdir, self.cpus, self.b_private = workdir, cpus, list(b_private)
        # Ray's socket paths must stay under 108 bytes, which a pytest tmp_path can exceed.
        self.ray_tmp = Path(tempfile.mkdtemp(prefix=f"ray{self.k}-"))
        self.procs: list[subprocess.Popen] = []
        self.dashboard, self.ray = dashboard, ray
        self.jobs_url = f"http://{self.ips[0]}:{DASHBOARD_PORT}"

    def __enter__(self) -> TwoHosts:
        try:
            self._network()
            for attempt in range(START_ATTEMPTS if self.ray else 0):
                try:
                    self._start_ray()
                    break
                except (AssertionError, TimeoutError):
                    # `ray start` gives a raylet 30 s (fixed) to register; on a loaded 2-core
                    # machine it can miss that. Start both nodes again, a bounded number of times.
                    if attempt == START_ATTEMPTS - 1:
                        raise
                    self._stop_processes()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _network(self) -> None:
        (na, nb), (va, vb) = self.ns, (f"hv{self.k}a", f"hv{self.k}b")
        _sh("ip", "netns", "add", na)
        _sh("ip", "netns", "add", nb)
        _sh("ip", "link", "add", va, "type", "veth", "peer", "name", vb)
        for ns, dev, ip in ((na, va, self.ips[0]), (nb, vb, self.ips[1])):
            _sh("ip", "link", "set", dev, "netns", ns)
            _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ip}/24", "dev", dev)
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", dev, "up")
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")

    def _start_ray(self) -> None:
        # The venv first on PATH, so a submitted job's entrypoint finds `horizonrl`.
        env = {**os.environ, **RAY_ENV, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
        env.pop("RAY_ADDRESS", None)
        common = ["--block", "--disable-usage-stats", f"--num-cpus={self.cpus}"]
        dash = (["--include-dashboard=true", f"--dashboard-host={self.ips[0]}",
                 f"--dashboard-port={DASHBOARD_PORT}"]
                if self.dashboard else ["--include-dashboard=false"])
        head = [str(BIN / "ray"), "start", "--head", f"--node-ip-address={self.ips[0]}",
                f"--port={PORT}", *dash, f"--resources={RESOURCES[0]}",
                f"--temp-dir={self.ray_tmp / 'a'}", *common]
        self.procs.append(subprocess.Popen(
            ["ip", "netns", "exec", self.ns[0], *head], env=env, start_new_session=True,
            stdout=self._log("a"), stderr=subprocess.STDOUT))
        worker = [str(BIN / "ray"), "start", f"--address={self.address}",
                  f"--node-ip-address={self.ips[1]}", f"--resources={RESOURCES[1]}",
                  f"--temp-dir={self.ray_tmp / 'b'}", *common]
        # Host B's own view of `b_private`: an empty tmpfs in a private mount namespace.
        mounts = "".join(f"mount -t tmpfs tmpfs {d} && " for d in self.b_private)
        script = f"{mounts}exec {shlex.join(worker)}"
        self.procs.append(subprocess.Popen(
            ["ip", "netns", "exec", self.ns[1], "unshare", "--mount", "--propagation",
             "private", "sh", "-c", script], env=env, start_new_session=True,
            stdout=self._log("b"), stderr=subprocess.STDOUT))
        self._wait_for_nodes(2, timeout_s=240)
        if self.dashboard:
            self._wait_for_jobs_api(timeout_s=180)

    def _log(self, host: str):
        return (self.workdir / f"ray-start-{host}.log").open("w")

    def _tails(self) -> str:
        logs = (self.workdir / f"ray-start-{h}.log" for h in "ab")
        return "\n".join(f"--- {p.name}: {p.read_text()[-1500:]}" for p in logs)

    def _wait_for_nodes(self, n: int, *, timeout_s: float) -> None:
        probe = (f"import ray; ray.init(address='{self.address}', log_to_driver=False); "
                 "print(sum(x['Alive'] for x in ray.nodes()))")
        deadline = time.monotonic() + timeout_s
        seen = "nothing"
        while time.monotonic() < deadline:
            out = self.run_on_a([sys.executable, "-c", probe], timeout=120)
            seen = out.stdout.strip().splitlines()[-1:] or out.stderr[-300:]
            if out.returncode == 0 and out.stdout.strip().endswith(str(n)):
                return
            assert all(p.poll() is None for p in self.procs), \
                f"a `ray start` exited\n{self._tails()}"
            time.sleep(3)
        raise TimeoutError(f"{n} Ray nodes not up within {timeout_s}s (last probe: {seen})\n"
                           f"{self._tails()}")

    def _wait_for_jobs_api(self, *, timeout_s: float) -> None:
        probe = f"import urllib.request; urllib.request.urlopen('{self.jobs_url}/api/jobs/', " \
                "timeout=5)"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.run_on_a([sys.executable, "-c", probe], timeout=60).returncode == 0:
                return
            time.sleep(2)
        raise TimeoutError(f"the head's job API did not answer within {timeout_s}s\n"
                           f"{self._tails()}")

    def run_on(self, host: int, cmd: Sequence[str], *, timeout: float,
               env: dict[str, str] | None = None, cwd: Path | None = None
               ) -> subprocess.CompletedProcess:
        """`cmd` on host 0 (A) or 1 (B), with the Ray settings of this cluster."""
        return subprocess.run(["ip", "netns", "exec", self.ns[host], *cmd], env=self._env(env),
                              cwd=cwd, capture_output=True, text=True, timeout=timeout)

    def run_on_a(self, cmd: Sequence[str], *, timeout: float,
                 env: dict[str, str] | None = None, cwd: Path | None = None
                 ) -> subprocess.CompletedProcess:
        """`cmd` on host A (the driver's host)."""
        return self.run_on(0, cmd, timeout=timeout, env=env, cwd=cwd)

    def popen_on(self, host: int, cmd: Sequence[str], *, stdout: Any,
                 env: dict[str, str] | None = None, cwd: Path | None = None
                 ) -> subprocess.Popen:
        """`cmd` started on host 0 (A) or 1 (B) in the background (stderr with stdout)."""
        return subprocess.Popen(["ip", "netns", "exec", self.ns[host], *cmd],
                                env=self._env(env), cwd=cwd, stdout=stdout,
                                stderr=subprocess.STDOUT, text=True)

    @staticmethod
    def _env(extra: dict[str, str] | None) -> dict[str, str]:
        full = {**os.environ, **RAY_ENV, **(extra or {})}
        full.pop("RAY_ADDRESS", None)
        return full

    def _kill_namespace(self, ns: str) -> None:
        """SIGKILL every process inside `ns` (one of ours), and only those."""
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                              text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass

    def lose_host_b(self) -> None:
        """Host B fails: its raylet and every worker on it die at once, as in a power loss."""
        self._kill_namespace(self.ns[1])

    def _stop_processes(self) -> None:
        for ns in self.ns:
            self._kill_namespace(ns)
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=30)
        self.procs.clear()

    def __exit__(self, *exc: object) -> None:
        self._stop_processes()
        for ns in self.ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        # The veth pair goes with its namespaces; this is for a setup that failed half-way.
        subprocess.run(["ip", "link", "del", f"hv{self.k}a"], capture_output=True)
        shutil.rmtree(self.ray_tmp, ignore_errors=True)
