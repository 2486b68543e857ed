"""Trajectory transport across two hosts against the same on one host, as ratios in one run.

    sudo .venv/bin/python bench/transport_hosts.py [--trajectories 400] [--tokens 5000]
        [--batch 16] [--repeats 3] [--out FILE]

The two hosts are network namespaces joined by a veth pair (bench/twohosts.py, no Ray; root).
The receiver always runs on host A, the sender on host A (over A's loopback: the same-host rows)
or on host B (over the veth: the cross-host rows, as a generator on another node pushes to the
ingest). Both are separate processes started in their namespace; the sender builds the same
trajectories as bench/transport_throughput.py before its clock starts, and stops it when the
receiver holds every trajectory decoded (both keep what they decoded): for raw TCP the receiver's
one-byte reply after the last one, for gRPC the acks of the last batch (the ingest acks what
it has stored). Encoding counts.
Both gRPC rows use a token, as an ingest off loopback must. The veth has no bandwidth or
latency limit of its own, so the cross-host rows show what the kernel's network path between
hosts costs over loopback, not what a physical network would add.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as `python bench/NAME.py`: the checkout on the path, not bench/
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.transport_throughput import batches, make_trajectories
from bench.twohosts import TwoHosts, can_run
from horizonrl.cluster.ops.provenance import command_line
from horizonrl.protos.codec import decode, encode

TOKEN = "bench-transport-hosts"
ROWS = (("raw TCP", "tcp", 0), ("raw TCP", "tcp", 1), ("gRPC Push stream", "grpc", 0),
        ("gRPC Push stream", "grpc", 1))


def serve(kind: str, host: str, n: int, batch: int) -> None:
    """Receiver: print the port, then receive `n` trajectories and say so."""
    if kind == "tcp":
        with socket.create_server((host, 0)) as listener:
            print(listener.getsockname()[1], flush=True)
            conn, _ = listener.accept()
            held = []  # kept, as the ingest keeps what it stored until the learner takes it
            with conn, conn.makefile("rb") as f:
                while len(held) < n:
                    (size,) = struct.unpack("!I", f.read(4))
                    held.append(decode(f.read(size)))
                conn.sendall(b"k")
        return
    from horizonrl.learner.ingest import TrajectoryIngest

    with TrajectoryIngest(host=host, port=0, capacity=256, auth_token=TOKEN) as ingest:
        print(ingest.port, flush=True)
        held, deadline = [], time.monotonic() + 300
        while len(held) < n and time.monotonic() < deadline:
            held += ingest.take(min(batch, n - len(held)), timeout=0.5)


def send(kind: str, address: str, n: int, tokens: int, batch: int) -> None:
    """Sender: print the seconds from the first send until the receiver holds all `n`."""
    trajs = make_trajectories(n, tokens)
    host, port = address.rsplit(":", 1)
    if kind == "tcp":
        with socket.create_connection((host, int(port))) as conn:
            t0 = time.perf_counter()
            for b in batches(trajs, batch):
                conn.sendall(b"".join(struct.pack("!I", len(d)) + d for d in map(encode, b)))
            assert conn.recv(1) == b"k"
            print(time.perf_counter() - t0, flush=True)
        return
    from horizonrl.actors.transport import TrajectorySender

    with TrajectorySender(address, deadline_s=120.0, auth_token=TOKEN) as sender:
        sender.send(trajs[:1])  # connected before the clock starts, as the TCP row is
        t0 = time.perf_counter()
        # Pipelined, as a generator pushes (bench/transport_throughput.py's gRPC row).
        for f in [sender.send_async(b) for b in batches(trajs[1:], batch)]:
            f.result()
        print(time.perf_counter() - t0, flush=True)


def measure(hosts: TwoHosts, kind: str, sender_host: int, args: argparse.Namespace) -> float:
    me = [sys.executable, __file__, "--trajectories", str(args.trajectories), "--tokens",
          str(args.tokens), "--batch", str(args.batch)]
    receiver = hosts.popen_on(0, [*me, "--serve", kind, "--host", hosts.ips[0]],
                              stdout=subprocess.PIPE)
    try:
        port = int(receiver.stdout.readline())
        out = hosts.run_on(sender_host, [*me, "--send", kind, "--address",
                                         f"{hosts.ips[0]}:{port}"], timeout=600)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        receiver.wait(timeout=60)
    finally:
        if receiver.poll() is None:
            receiver.kill()
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trajectories", type=int, default=400)
    ap.add_argument("--tokens", type=int, default=5000, help="prompt + response per episode")
    ap.add_argument("--batch", type=int, default=16, help="trajectories per send")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per row (best kept)")
    ap.add_argument("--out", type=Path, help="write the table and settings as JSON here")
    ap.add_argument("--serve", choices=["tcp", "grpc"], help=argparse.SUPPRESS)
    ap.add_argument("--send", choices=["tcp", "grpc"], help=argparse.SUPPRESS)
    ap.add_argument("--host", help=argparse.SUPPRESS)
    ap.add_argument("--address", help=argparse.SUPPRESS)
    args = ap.parse_args()
    n = args.trajectories
    if args.serve:
        return serve(args.serve, args.host, n, args.batch)
    if args.send:
        return send(args.send, args.address, n, args.tokens, args.batch)
    if (why := can_run()) is not None:
        raise SystemExit(f"bench/transport_hosts.py {why}")
    mb = sum(len(encode(t)) for t in make_trajectories(n, args.tokens)) / 1e6
    best = {row: float("inf") for row in ROWS}
    with TwoHosts(Path(tempfile.mkdtemp(prefix="transport-hosts-")), ray=False) as hosts:
        for row in ROWS:  # warm-up: imports and page cache on both sides
            measure(hosts, row[1], row[2], argparse.Namespace(**{**vars(args),
                                                                 "trajectories": 32}))
        for r in range(args.repeats):  # rows take turns, so load from elsewhere hits them alike
            for row in ROWS:
                best[row] = min(best[row], measure(hosts, row[1], row[2], args))
            print(f"[bench] round {r + 1}/{args.repeats} done", flush=True)
    base = {kind: n / best[(name, kind, 0)] for name, kind, _ in ROWS}
    table = [{"method": name, "path": "host B -> host A (veth)" if h else "host A (loopback)",
              "trajectories_per_s": round(n / dt, 1), "mb_per_s": round(mb / dt, 1),
              "vs_same_host": round(n / dt / base[kind], 3)}
             for (name, kind, h), dt in best.items()]
    print("\n| method | path | trajectories/s | MB/s | vs same host |\n|---|---|---|---|---|")
    for row in table:
        print(f"| {row['method']} | {row['path']} | {row['trajectories_per_s']:,.0f} | "
              f"{row['mb_per_s']:,.1f} | {row['vs_same_host']:.2f}x |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "command": command_line(),
            "trajectories": n, "tokens": args.tokens, "batch": args.batch,
            "repeats": args.repeats, "rows": table}, indent=2))


if __name__ == "__main__":
    main()
