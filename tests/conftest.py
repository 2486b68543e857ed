"""Shared fixtures: a tiny model built once per session, and local-Ray environment settings."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from cluster.runtime import LOCAL_RAY_ENV

os.environ.update(LOCAL_RAY_ENV)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small but real tiny model (tokenizer trained here, a few pre-training steps)."""
    from cluster.tiny_model import build_tiny_model

    out = tmp_path_factory.mktemp("models") / "tiny"
    return build_tiny_model(out, transcripts=300, pretrain_steps=4, batch_size=8, seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny_model_path: Path):
    from actors.chat import load_tokenizer

    
    return load_tokenizer(tiny_model_path)


@pytest.fixture()
def free_port() -> Callable[[], int]:
    """A function giving a free TCP port on 127.0.0.1 (bound and released at once)."""

    def pick() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    return pick


@pytest.fixture()
def kill_tree() -> Callable[[subprocess.Popen], list]:
    """SIGKILL a process and everything it started (local Ray included), like a lost node;
    returns the processes still alive afterwards."""

    def kill(proc: subprocess.Popen) -> list:
        import psutil

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

    return kill
