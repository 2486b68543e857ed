"""A slow learner bounds the ingest's memory, measured as the RSS of a separate server process:
senders offer far more than its capacity and wait on credits; the server's RSS grows by about
its capacity, not by what was offered."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from horizonrl.actors.transport import TrajectorySender
from horizonrl.protos.codec import encode
from horizonrl.protos.trajectory import Trajectory

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
TOKENS = 20_000  # ~0.15 MB encoded, ~2 MB as a decoded Python dataclass
CAPACITY = 4
SERVER = """
import sys, time
from horizonrl.learner.ingest import TrajectoryIngest
ing = TrajectoryIngest(host="127.0.0.1", port={port}, capacity={capacity},
                       max_message_bytes=8 << 20).start()
print("READY", flush=True)
time.sleep(600)  # nobody ever takes: the slowest possible learner
"""


def _big(i: int) -> Trajectory:
    return Trajectory(
        trajectory_id=f"big-{i}", group_id="g", task_id="t", env_name="babyai",
        policy_version=0, horizon=1, prompt_ids=(1,) * 10,
        response_ids=tuple(1000 + (i + k) % 30_000 for k in range(TOKENS)),
        response_mask=(1,) * TOKENS, response_logprobs=(-0.5,) * TOKENS, rewards=(1.0,),
        reward=1.0, num_turns=1, terminated=True, truncated=False)


def test_server_rss_stays_near_capacity_while_senders_wait(free_port):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER.format(
        root=str(ROOT), port=port, capacity=CAPACITY)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "READY"
        server = psutil.Process(proc.pid)
        time.sleep(0.5)
        base = server.memory_info().rss
        batches = [[_big(s * 1000 + i) for i in range(40)] for s in range(3)]  # 120 offered
        size = len(encode(batches[0][0]))
        offered = sum(len(b) for b in batches) * size
        peak = base
        with ThreadPoolExecutor(max_workers=3) as pool:
            senders = [TrajectorySender(f"127.0.0.1:{port}", deadline_s=8, retries=0)
                       for _ in batches]
            futures = [pool.submit(s.send, b) for s, b in zip(senders, batches)]
            t_end = time.monotonic() + 6
            while time.monotonic() < t_end:
                peak = max(peak, server.memory_info().rss)
                time.sleep(0.05)
            for f in futures:  # they time out waiting for credits: nothing was lost to them
                try:
                    f.result(timeout=30)
                except Exception:
                    pass
            for s in senders:
                s.close()
        growth = peak - base
        print(f"\nserver RSS {base / 2**20:.0f} MB -> peak {peak / 2**20:.0f} MB (+"
              f"{growth / 2**20:.1f} MB) while {offered / 2**20:.0f} MB were offered; capacity "
              f"{CAPACITY} x {size / 2**20:.1f} MB")
        # Decoded, a trajectory holds ~11x its encoded size in Python objects: an unbounded
        # queue would grow by ~11 x offered (~190 MB); the credits hold it to the capacity's
        # worth plus gRPC's buffers.
        decoded = 11 * size  # measured with tracemalloc for these trajectories
        print(f"  unbounded would be ~{120 * decoded / 2**20:.0f} MB; capacity's worth "
              f"{CAPACITY * decoded / 2**20:.0f} MB")
        assert growth < CAPACITY * decoded + (40 << 20)
    finally:
        proc.kill()
        proc.wait(timeout=10)
