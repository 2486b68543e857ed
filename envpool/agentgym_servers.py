"""AgentGym's own env servers (agentenv-textcraft, -babyai, -sciworld), started from a checkout of
their folders on 127.0.0.1, for tests, benchmarks and anyone who wants the reference servers
beside a run.

    with AgentGymServer("sciworld", servers_dir, python=venv_python) as server:
        env = AgentGymHTTPEnv(server.url, server="sciworld")

They run unmodified, each as `python -m uvicorn agentenv_<name>:app` from the folder (TextCraft
reads its recipes by a relative path), with the folder on PYTHONPATH instead of installed (a
read-only checkout works). Their pins (`gymnasium<1.0`, `minigrid<2.5`) clash with horizonrl's,
so they get their own virtual environment: `make install-dev` builds `.cache/agentgym-venv`
(SERVER_REQUIREMENTS). The server is stopped by its process id, its JVMs with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Self

import httpx

# What the three servers import, at the versions they were run with here (their own
# pyproject.toml files name no versions).
SERVER_REQUIREMENTS = (
    "fastapi==0.165.0", "uvicorn==0.55.0", "gym==0.26.2", "gymnasium==0.29.1",
    "minigrid==2.3.1", "scienceworld==1.2.3", "matplotlib", "numpy",
)
SERVERS = ("textcraft", "babyai", "sciworld")


def default_servers_dir(repo: Path) -> Path:
    """Where the servers' folders are: $HORIZONRL_AGENTGYM_SERVERS, else the shared checkout
    beside the repository (`../shared/agentgym-servers`)."""
    env = os.environ.get("HORIZONRL_AGENTGYM_SERVERS")
    return Path(env) if env else repo.parent / "shared" / "agentgym-servers"


def default_python(repo: Path) -> Path:
    """The servers' interpreter: $HORIZONRL_AGENTGYM_PYTHON, else `make install-dev`'s venv."""
    env = os.environ.get("HORIZONRL_AGENTGYM_PYTHON")
    return Path(env) if env else repo / ".cache" / "agentgym-venv" / "bin" / "python"


def java_processes(pid: int) -> int:
    """How many JVMs process `pid` has started (SciWorld runs one per env), by /proc."""
    import psutil

    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    count = 0
    for kid in kids:
        with contextlib.suppress(psutil.Error):
            count += kid.name().startswith("java")
    return count


class AgentGymServer:
    """One of AgentGym's servers as a child process on 127.0.0.1:`port` (0: a free one)."""

    def __init__(self, name: str, servers_dir: Path, *, python: Path, port: int = 0,
                 start_timeout_s: float = 120.0, log: Path | None = None) -> None:
        if name not in SERVERS:
            raise ValueError(f"unknown AgentGym server {name!r}; known: {', '.join(SERVERS)}")
        self.name, self.folder = name, Path(servers_dir) / f"agentenv-{name}"
        if not self.folder.is_dir():
            raise FileNotFoundError(f"{self.folder} is missing (AgentGym's servers are looked "
                                    "for in ../shared/agentgym-servers)")
        if not Path(python).exists():
            raise FileNotFoundError(f"{python} is missing: `make install-dev` builds the "
                                    "servers' virtual environment")
        self.python, self.port = Path(python), port or _free_port()
        self.start_timeout_s, self.log = start_timeout_s, log
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "start() first"
        return self.proc.pid

    def start(self) -> Self:
        """Start the server and wait (bounded) until `GET /` answers."""
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL
        env = {**os.environ, "PYTHONPATH": str(self.folder), "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [str(self.python), "-m", "uvicorn", f"agentenv_{self.name}:app", "--host",
             "127.0.0.1", "--port", str(self.port), "--log-level", "warning"],
            cwd=self.folder, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)  # its own process group: stop() ends its JVMs too
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the {self.name} server exited with {self.proc.returncode} "
                                   f"while starting (log: {self.log})")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/", timeout=2.0).status_code == 200:
                    return self
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"the {self.name} server did not answer within "
                           f"{self.start_timeout_s:.0f} s (log: {self.log})")

    def stop(self) -> None:
        """End the server's process group (the server and the JVMs it started)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=15)

    def restart(self) -> None:
        """Stop and start again on the same port: every env the server held is gone."""
        self.stop()
        self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
