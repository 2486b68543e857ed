"""The broadcast weight sync's pieces without Ray or vLLM: the bucket plan, packing, the backend
choice, and a real gloo group (two threads) carrying a push into a stand-in vLLM worker."""

from __future__ import annotations

import socket
import threading
from itertools import pairwise

import pytest
import torch

from horizonrl.actors.weight_receiver import WeightReceiverExtension
from horizonrl.learner.config import LearnerConfig
from horizonrl.learner.weights import (
    ALIGN,
    BroadcastWeightSync,
    ObjectStoreWeightSync,
    bucket_plan,
    choose_backend,
    hf_state_dict,
    make_weight_sync,
    pack_bucket,
    send_buckets,
    state_specs,
)
from horizonrl.protos.weight_wire import BroadcastGroup, unpack_bucket

KB = 1024


def specs(*sizes: int, dtype: str = "float32") -> list[tuple[str, tuple[int, ...], str]]:
    return [(f"t{i}", (n,), dtype) for i, n in enumerate(sizes)]


def test_buckets_keep_order_and_stay_within_the_budget() -> None:
    items = specs(100, 300, 50, 400, 10, 256, 256, 1)  # float32: 4 bytes each
    buckets = bucket_plan(items, bucket_bytes=2 * KB)
    assert [t.name for b in buckets for t in b.tensors] == [n for n, _, _ in items]
    assert all(b.nbytes <= 2 * KB for b in buckets)
    assert len(buckets) > 1
    assert sum(b.payload_bytes for b in buckets) == 4 * sum(s[0] for _, s, _ in items)
    for b in buckets:
        ends = [t.offset + t.nbytes for t in b.tensors]
        assert all(t.offset % ALIGN == 0 for t in b.tensors)
        assert all(nxt.offset >= end for nxt, end in zip(b.tensors[1:], ends))  # no overlap
        assert b.nbytes == ends[-1]
    # Greedy: no bucket could have taken the next bucket's first tensor.
    for b, nxt in pairwise(buckets):
        first = nxt.tensors[0]
        assert -(-b.nbytes // ALIGN) * ALIGN + first.nbytes > 2 * KB


def test_a_tensor_larger_than_a_bucket_travels_alone() -> None:
    buckets = bucket_plan(specs(10, 10, 5000, 10, 10), bucket_bytes=1 * KB)
    names = [[t.name for t in b.tensors] for b in buckets]
    assert names == [["t0", "t1"], ["t2"], ["t3", "t4"]]
    assert buckets[1].nbytes == 20000
    assert bucket_plan(specs(5000), bucket_bytes=KB)[0].nbytes == 20000


def test_plan_is_deterministic_and_reads_torch_dtype_names() -> None:
    items = [("a", (3, 5), "torch.bfloat16"), ("b", (), "torch.float32"), ("c", (0,), "int64")]
    one, two = bucket_plan(items, 64), bucket_plan(list(items), 64)
    assert one == two
    assert [t.dtype for b in one for t in b.tensors] == ["bfloat16", "float32", "int64"]
    assert [t.nbytes for b in one for t in b.tensors] == [30, 4, 0]
    with pytest.raises(ValueError):
        bucket_plan(items, 0)


@pytest.fixture(scope="module")
def tied_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg)


def test_tied_lm_head_is_in_the_plan_and_round_trips(tied_model) -> None:
    state = hf_state_dict(tied_model)
    buckets = bucket_plan(state_specs(state), bucket_bytes=8 * KB)
    names = [t.name for b in buckets for t in b.tensors]
    assert "lm_head.weight" in names and "model.embed_tokens.weight" in names
    assert names == list(state)
    assert sum(b.payload_bytes for b in buckets) == sum(
        v.numel() * v.element_size() for v in state.values())
    got = dict(kv for b in buckets for kv in unpack_bucket(pack_bucket(b, state), b))
    assert got.keys() == state.keys()
    for k, v in state.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
    assert torch.equal(got["lm_head.weight"], state["model.embed_tokens.weight"])


def test_pack_unpack_mixed_dtypes_and_shapes() -> None:
    g = torch.Generator().manual_seed(1)
    state = {"w": torch.randn(7, 3, generator=g), "h": torch.randn(5, generator=g).bfloat16(),
             "i": torch.arange(9, dtype=torch.int64).view(3, 3), "s": torch.tensor(2.5),
             "e": torch.empty(0, 4), "t": torch.randn(4, 6, generator=g).t()}  # not contiguous
    buckets = bucket_plan(state_specs(state), bucket_bytes=64)
    assert len(buckets) > 2
    got = dict(kv for b in buckets for kv in unpack_bucket(pack_bucket(b, state), b))
    for k, v in state.items():
        assert got[k].shape == v.shape and got[k].dtype == v.dtype and torch.equal(got[k], v), k


def test_pack_refuses_a_tensor_that_changed_shape() -> None:
    bucket = bucket_plan([("w", (4,), "float32")], 64)[0]
    with pytest.raises(ValueError, match="changed"):
        pack_bucket(bucket, {"w": torch.zeros(5)})
    with pytest.raises(ValueError, match="changed"):
        pack_bucket(bucket, {"w": torch.zeros(4, dtype=torch.float64)})


def test_backend_is_nccl_only_with_a_gpu_per_member() -> None:
    assert choose_backend(["gpu-a", "gpu-b", "gpu-c"]) == "nccl"
    assert choose_backend(["gpu-a", "gpu-a"]) == "gloo"  # NCCL refuses duplicate devices
    assert choose_backend(["gpu-a", None]) == "gloo"
    assert choose_backend([None, None]) == "gloo"


def test_factory_picks_the_configured_strategy() -> None:
    assert isinstance(make_weight_sync(LearnerConfig(), None, []), ObjectStoreWeightSync)
    sync = make_weight_sync(LearnerConfig(weight_sync="broadcast", weight_bucket_mb=0.5),
                            None, [])
    assert isinstance(sync, BroadcastWeightSync) and sync.bucket_bytes == 512 * KB


class FakeWorker(WeightReceiverExtension):
    """What the extension needs of vLLM's worker: `device` and `reload_weights`."""

    def __init__(self, take: int | None = None) -> None:
        self.device = torch.device("cpu")
        self.take, self.loaded = take, {}

    def reload_weights(self, weights_iterator) -> None:
        for n, (name, t) in enumerate(weights_iterator):
            self.loaded[name] = t.clone()
            if self.take is not None and n + 1 >= self.take:
                return  # a loader that stops early: the receiver must still drain the stream


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("take", [None, 2])
def test_gloo_pushes_reach_the_worker_extension(tied_model, take) -> None:
    """Two pushes over one group; the second must arrive intact even when the loader stopped
    early on the first (the receiver drains what it did not load)."""
    first = hf_state_dict(tied_model)
    second = {k: v + 1 for k, v in first.items()}
    buckets = bucket_plan(state_specs(first), bucket_bytes=4 * KB)
    common = {"host": "127.0.0.1", "port": _free_port(), "world_size": 2, "backend": "gloo",
              "timeout_s": 60.0}
    worker, received = FakeWorker(take), []

    def receive() -> None:
        worker.join_weight_broadcast(rank=1, **common)
        received.extend(worker.receive_weight_buckets(buckets) for _ in range(2))
        worker.leave_weight_broadcast()

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    group = BroadcastGroup(rank=0, device="cpu", **common)
    try:
        sent = [send_buckets(group, buckets, state) for state in (first, second)]
    finally:
        group.close()
    thread.join(timeout=60)
    assert not thread.is_alive()
    size = sum(v.numel() * v.element_size() for v in first.values())
    assert received == sent == [size, size]
    want = list(first) if take is None else list(first)[:take]
    assert list(worker.loaded) == want
    for k in want:
        assert torch.equal(worker.loaded[k], second[k]), k


def test_sync_stats_name_the_same_metrics_for_both_strategies():
    from horizonrl.learner.weights import SyncStats

    store = SyncStats(seconds=0.5, reload_seconds=0.2)
    assert store.metrics() == {"weight_sync_seconds": 0.5, "weight_reload_seconds": 0.2}
    cast = SyncStats(seconds=0.5, reload_seconds=0.2, bytes=1024.0, buckets=3.0,
                     group_setup_seconds=0.0)
    assert cast.metrics() == {**store.metrics(), "weight_sync_bytes": 1024.0,
                              "weight_sync_buckets": 3.0, "weight_group_setup_seconds": 0.0}
