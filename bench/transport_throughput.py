"""Trajectory transport throughput: the gRPC Push stream against Ray object references and a raw
loopback TCP socket, for realistic multi-turn trajectories, as ratios in one run.

    .venv/bin/python bench/transport_throughput.py [--trajectories 400] [--tokens 5000] \
        [--batch 16] [--out docs/transport.json]

Every method moves the same trajectories (1k prompt tokens, the rest a 4-turn response with its
mask and float32 logprobs) from this process (the generator) to another process (the learner),
in batches of `--batch` (what a generator sends after one lock-step turn); the clock stops when
the receiver holds them all as `Trajectory` dataclasses (every receiver keeps what it decoded
until the end, as a learner does). Encoding and decoding count everywhere, so the methods
differ only in how the bytes travel:
- raw TCP: length-prefixed protobuf bytes over one loopback socket; no acks, no flow control, no
  retries: the ceiling.
- gRPC: TrajectorySender -> TrajectoryIngest (a learner thread taking), with credits,
  per-trajectory acks and dedup. Pipelined as a generator pushes: `send_async` for every
  batch onto the sender's stream, which asks for credits ahead and settles batches as acks
  arrive, so the sender encodes the next batch while the learner decodes the last; "one batch
  at a time" waits for each batch's acks (`send`); the 4-sender row shows what several
  generators (threads here, sharing one GIL) get from one learner.
- Ray: `ray.put` of each batch (encoded bytes, or the dataclasses pickled) handed to an actor
  that `ray.get`s and decodes it; one round trip per batch.
Across two hosts (a generator on another node pushing to the ingest over a network link),
raw TCP and gRPC are measured beside the same on one host by bench/transport_hosts.py (root:
it builds the two hosts from network namespaces).
Each method runs once on a few batches to warm up, then `--repeats` times, the methods taking
turns so that load from elsewhere hits them alike; the best run counts. MB/s is protobuf bytes
moved per second for every method (the pickled path moves more bytes than that).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import struct
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from horizonrl.cluster.ops.provenance import command_line
from horizonrl.protos.codec import decode, encode
from horizonrl.protos.trajectory import Trajectory

PROMPT_TOKENS = 1000
TURNS = 4


def make_trajectories(n: int, tokens: int, seed: int = 0) -> list[Trajectory]:
    """`n` episodes of `tokens` tokens: model turns (mask 1) between env observations (0)."""
    rng = np.random.default_rng(seed)
    response = tokens - PROMPT_TOKENS
    # Each turn: 70% model tokens then 30% observation tokens (the last turn has no observation).
    per_turn = response // TURNS
    mask = np.zeros(response, dtype=np.int32)
    for k in range(TURNS):
        mask[k * per_turn:k * per_turn + int(per_turn * 0.7)] = 1
    mask[(TURNS - 1) * per_turn:] = 1
    out = []
    for i in range(n):
        ids = rng.integers(0, 151_000, size=tokens)  # a Qwen-sized vocabulary
        logprobs = np.where(mask == 1, -rng.exponential(0.7, size=response), 0.0)
        out.append(Trajectory(
            trajectory_id=f"bench-{seed}-{i:06d}", group_id=f"g{i // 8}", task_id=f"t{i // 8}",
            env_name="textcraft", policy_version=3, horizon=TURNS,
            prompt_ids=tuple(ids[:PROMPT_TOKENS].tolist()),
            response_ids=tuple(ids[PROMPT_TOKENS:].tolist()),
            response_mask=tuple(mask.tolist()),
            response_logprobs=tuple(logprobs.astype(np.float32).tolist()),
            rewards=(0.0,) * (TURNS - 1) + (1.0,), reward=1.0, num_turns=TURNS,
            terminated=True, truncated=False, turn_seconds=(0.5,) * TURNS,
            info={"generator": "gen0", "seed": i}))
    return out


def batches(trajs: list[Trajectory], size: int) -> list[list[Trajectory]]:
    return [trajs[i:i + size] for i in range(0, len(trajs), size)]


# ---- receivers (run in a child process; they report their port, then the count) -------------

def _tcp_receiver(pipe: Connection, n: int, batch: int) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        pipe.send(listener.getsockname()[1])
        conn, _ = listener.accept()
        held: list[Trajectory] = []  # kept, as every receiver keeps what it got
        with conn, conn.makefile("rb") as f:
            while len(held) < n:
                (size,) = struct.unpack("!I", f.read(4))
                held.append(decode(f.read(size)))
    pipe.send(len(held))


def _grpc_receiver(pipe: Connection, n: int, batch: int) -> None:
    from horizonrl.learner.ingest import TrajectoryIngest

    with TrajectoryIngest(port=0, capacity=256) as ingest:
        pipe.send(ingest.port)
        held: list[Trajectory] = []
        deadline = time.monotonic() + 300
        while len(held) < n and time.monotonic() < deadline:
            held += ingest.take(min(batch, n - len(held)), timeout=0.5)
    pipe.send(len(held))


def across(receiver: Callable[[Connection, int, int], None],
           send: Callable[[int, list[Trajectory], int], None]) -> Callable:
    """A method: `receiver` in a fresh process, `send(port, trajs, batch)` here; seconds from
    the first send to the receiver holding all."""

    def run(trajs: list[Trajectory], batch: int) -> float:
        here, there = mp.get_context("spawn").Pipe()
        child = mp.get_context("spawn").Process(target=receiver, args=(there, len(trajs), batch))
        child.start()
        port = here.recv()  # the receiver is up (imports done) before the clock starts
        t0 = time.perf_counter()
        send(port, trajs, batch)
        got = here.recv()
        dt = time.perf_counter() - t0
        child.join(timeout=30)
        assert got == len(trajs), f"received {got} of {len(trajs)}"
        return dt

    return run


def _tcp_send(port: int, trajs: list[Trajectory], batch: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        for b in batches(trajs, batch):
            conn.sendall(b"".join(struct.pack("!I", len(d)) + d for d in map(encode, b)))


def _grpc_send(port: int, trajs: list[Trajectory], batch: int, senders: int = 1,
               pipelined: bool = True) -> None:
    """`senders` threads (generators) share the batches, each with its own channel. Pipelined
    as a generator pushes (`send_async`, the sender's default 2 batches in flight), or one
    batch at a time (`send` returns once the learner acked the batch)."""
    from concurrent.futures import ThreadPoolExecutor

    from horizonrl.actors.transport import TrajectorySender

    def one(k: int) -> None:
        with TrajectorySender(f"127.0.0.1:{port}", deadline_s=120.0) as sender:
            mine = batches(trajs, batch)[k::senders]
            if pipelined:
                for f in [sender.send_async(b) for b in mine]:
                    f.result()
            else:
                for b in mine:
                    sender.send(b)

    with ThreadPoolExecutor(max_workers=senders) as pool:
        list(pool.map(one, range(senders)))


def _grpc_send_4(port: int, trajs: list[Trajectory], batch: int) -> None:
    _grpc_send(port, trajs, batch, senders=4)


def _grpc_send_serial(port: int, trajs: list[Trajectory], batch: int) -> None:
    _grpc_send(port, trajs, batch, pipelined=False)


class Receiver:
    """Ray actor: gets a batch through the object store and rebuilds the dataclasses."""

    def __init__(self) -> None:
        self.held: list[Trajectory] = []  # kept, as every receiver keeps what it got

    def receive_bytes(self, batch: list[bytes]) -> int:
        self.held += [decode(b) for b in batch]
        return len(batch)

    def receive_dataclasses(self, batch: list[Trajectory]) -> int:
        self.held += batch  # Ray unpickled them already
        return len(batch)


def ray_objects(trajs: list[Trajectory], batch: int, *, as_bytes: bool) -> float:
    """Seconds to move `trajs` driver -> actor through `ray.put` refs, one call per batch."""
    import ray

    actor = ray.remote(num_cpus=1)(Receiver).remote()
    ray.get(actor.receive_bytes.remote([]))  # the actor process is up before the clock starts
    t0 = time.perf_counter()
    count = 0
    for b in batches(trajs, batch):
        if as_bytes:
            count += ray.get(actor.receive_bytes.remote(ray.put([encode(t) for t in b])))
        else:
            count += ray.get(actor.receive_dataclasses.remote(ray.put(b)))
    dt = time.perf_counter() - t0
    ray.kill(actor)
    assert count == len(trajs)
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trajectories", type=int, default=400)
    ap.add_argument("--tokens", type=int, default=5000, help="prompt + response per episode")
    ap.add_argument("--batch", type=int, default=16, help="trajectories per send")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per method (best kept)")
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray methods")
    ap.add_argument("--out", help="write the table as JSON here")
    args = ap.parse_args()

    trajs = make_trajectories(args.trajectories, args.tokens)
    mb = sum(len(encode(t)) for t in trajs) / 1e6
    n, k = len(trajs), args.batch
    print(f"[bench] {n} trajectories x {args.tokens} tokens, {mb / n * 1e3:.1f} kB each "
          f"encoded, batches of {k}, best of {args.repeats}", flush=True)
    methods: dict[str, Callable[[list[Trajectory], int], float]] = {
        "raw TCP, length-prefixed protobuf (ceiling)": across(_tcp_receiver, _tcp_send),
        "gRPC Push stream (credits, acks, dedup), pipelined": across(_grpc_receiver,
                                                                     _grpc_send),
        "gRPC, one batch at a time": across(_grpc_receiver, _grpc_send_serial),
        "gRPC, 4 senders at once": across(_grpc_receiver, _grpc_send_4),
    }
    if not args.no_ray:
        methods["Ray ray.put/ray.get, protobuf bytes"] = (
            lambda ts, b: ray_objects(ts, b, as_bytes=True))
        methods["Ray ray.put/ray.get, pickled dataclasses"] = (
            lambda ts, b: ray_objects(ts, b, as_bytes=False))
    from contextlib import nullcontext

    from horizonrl.cluster.config import RayConfig
    from horizonrl.cluster.ops.runtime import ray_session

    best = dict.fromkeys(methods, float("inf"))
    with nullcontext() if args.no_ray else ray_session(RayConfig(num_cpus=2)):
        for fn in methods.values():
            fn(trajs[:2 * k], k)  # warm-up: imports, connections, caches
        for r in range(args.repeats):
            for name, fn in methods.items():
                best[name] = min(best[name], fn(trajs, k))
            print(f"[bench] round {r + 1}/{args.repeats} done", flush=True)
    base = n / best[next(iter(methods))]
    print("\n| method | trajectories/s | MB/s | vs raw TCP |\n|---|---|---|---|")
    rows = {}
    for name, dt in best.items():
        print(f"| {name} | {n / dt:,.0f} | {mb / dt:,.1f} | {n / dt / base:.2f}x |")
        rows[name] = {"trajectories_per_s": round(n / dt, 1), "mb_per_s": round(mb / dt, 2),
                      "vs_raw_tcp": round(n / dt / base, 3)}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({
            "command": command_line(),
            "trajectories": n, "tokens": args.tokens, "batch": k, "repeats": args.repeats,
            "kb_per_trajectory": round(mb / n * 1e3, 1), "methods": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
