"""Local Ray start: a startup timeout is retried after the failed attempt's own processes are
stopped; other errors and the last attempt's timeout go to the caller."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from horizonrl.cluster.ops.runtime import STARTUP_TIMEOUT_TEXT, start_local


class FlakyInit:
    """Stands in for `ray.init`: each failing call first starts a child process, as a Ray start
    that got as far as its GCS would."""

    def __init__(self, failures: int,
                 message: str = f"The current node {STARTUP_TIMEOUT_TEXT}.") -> None:
        self.failures, self.message, self.calls, self.children = failures, message, 0, []

    def __call__(self) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            self.children.append(subprocess.Popen([sys.executable, "-c",
                                                   "import time; time.sleep(60)"]))
            raise Exception(self.message)


def _gone(proc: subprocess.Popen) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("message", [
    f"The current node {STARTUP_TIMEOUT_TEXT}.",
    "Timed out waiting for file /tmp/ray/session_x/gcs_server_port_abc"])
def test_timeout_is_retried_and_the_failed_attempts_processes_are_stopped(message):
    init = FlakyInit(failures=2, message=message)
    start_local(init, attempts=3)
    assert init.calls == 3
    assert all(_gone(p) for p in init.children)


def test_other_errors_are_not_retried():
    init = FlakyInit(failures=1, message="bad num_cpus")
    with pytest.raises(Exception, match="bad num_cpus"):
        start_local(init, attempts=3)
    assert init.calls == 1
    init.children[0].kill()
    init.children[0].wait()


def test_the_last_attempts_timeout_reaches_the_caller():
    init = FlakyInit(failures=5)
    with pytest.raises(Exception, match=STARTUP_TIMEOUT_TEXT):
        start_local(init, attempts=2)
    assert init.calls == 2
    assert _gone(init.children[0])  # stopped before the second attempt
    for proc in init.children[1:]:
        proc.kill()
        proc.wait()


def test_processes_started_before_are_left_alone():
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start_local(FlakyInit(failures=1), attempts=2)
        assert psutil.pid_exists(mine.pid) and mine.poll() is None
    finally:
        mine.kill()
        mine.wait()
