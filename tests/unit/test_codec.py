"""The protobuf codec: exact round trips, float32 on the wire, malformed input -> ValueError,
and chunking: slices that reassemble exactly, broken sequences -> ChunkError."""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import pytest

from horizonrl.protos import trajectory_pb2
from horizonrl.protos.codec import (
    ChunkAssembler,
    ChunkError,
    decode,
    encode,
    from_proto,
    to_chunks,
    to_proto,
)
from horizonrl.protos.trajectory import Failure, Trajectory


def multi_turn(**overrides: Any) -> Trajectory:
    """Three turns: model tokens (mask 1) interleaved with env observations (mask 0)."""
    fields: dict[str, Any] = {
        "trajectory_id": "traj-0001",
        "group_id": "group-7",
        "task_id": "babyai/GoToObj-42",
        "env_name": "babyai",
        "policy_version": 12,
        "horizon": 6,
        "prompt_ids": (151644, 8948, 198, 2610, 525),
        # turn 1: 3 model tokens; obs: 2 env tokens; turn 2: 2 model; obs: 1 env; turn 3: 1 model
        "response_ids": (40, 3278, 2115, 198, 1001, 17, 18, 198, 42),
        "response_mask": (1, 1, 1, 0, 0, 1, 1, 0, 1),
        # float32-representable on purpose: logprobs travel as float32
        "response_logprobs": (-0.5, -1.25, -0.125, 0.0, 0.0, -2.0, -0.75, 0.0, -3.5),
        "rewards": (0.0, 0.0, 1.0),
        "reward": 1.0,
        "num_turns": 3,
        "terminated": True,
        "truncated": False,
        "failure": Failure.NONE,
        "turn_seconds": (0.123456789, 1.5, 0.3),  # float64 on the wire: exact
        "info": {"seed": 42, "mission": "go to the red ball", "invalid_actions": [1, 3]},
    }
    fields.update(overrides)
    return Trajectory(**fields)


def test_multi_turn_round_trip_is_exact() -> None:
    t = multi_turn()
    back = decode(encode(t))
    assert back == t
    assert isinstance(back.response_ids, tuple) and isinstance(back.response_logprobs, tuple)
    assert from_proto(to_proto(t)) == t


@pytest.mark.parametrize("failure", list(Failure))
def test_every_failure_kind_round_trips(failure: Failure) -> None:
    t = multi_turn(failure=failure, info={})
    assert decode(encode(t)).failure is failure


def test_logprobs_and_rewards_are_float32_on_the_wire() -> None:
    back = decode(encode(multi_turn(response_logprobs=(0.1,) * 9, reward=0.1)))
    as_f32 = struct.unpack("f", struct.pack("f", 0.1))[0]
    assert back.response_logprobs == (as_f32,) * 9
    assert back.reward == as_f32


def test_proto_mirrors_every_dataclass_field() -> None:
    wire = {f.name for f in trajectory_pb2.Trajectory.DESCRIPTOR.fields}
    python = {f.name for f in dataclasses.fields(Trajectory)}
    assert wire == (python - {"info"}) | {"info_json"}


def test_mismatched_lengths_raise_value_error() -> None:
    with pytest.raises(ValueError, match="same length"):
        multi_turn(response_mask=(1, 1))
    bad = to_proto(multi_turn())
    del bad.response_logprobs[-1]
    with pytest.raises(ValueError, match="same length"):
        from_proto(bad)
    with pytest.raises(ValueError, match="same length"):
        decode(bad.SerializeToString())


def test_other_malformed_messages_raise_value_error() -> None:
    unknown_failure = to_proto(multi_turn())
    unknown_failure.failure = 99  # proto3 enums are open: any int parses
    not_an_object = to_proto(multi_turn())
    not_an_object.info_json = "[1, 2]"
    broken_json = to_proto(multi_turn())
    broken_json.info_json = "{"
    for m in (unknown_failure, not_an_object, broken_json):
        with pytest.raises(ValueError):
            from_proto(m)
    with pytest.raises(ValueError):
        decode(b"\xff\xff\xff")


def test_info_must_be_json() -> None:
    with pytest.raises(TypeError):
        to_proto(multi_turn(info={"obj": object()}))


def test_chunks_reassemble_to_the_same_trajectory() -> None:
    t = multi_turn(response_ids=tuple(range(30_000, 31_000)), response_mask=(1,) * 1000,
                   response_logprobs=(-0.5,) * 1000)
    data = encode(t)
    chunks = to_chunks(t.trajectory_id, data, 700)
    assert len(chunks) == -(-len(data) // 700) and all(len(c.data) <= 700 for c in chunks)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assembler = ChunkAssembler()
    done = [assembler.add(c) for c in chunks]
    assert done[:-1] == [None] * (len(chunks) - 1) and assembler.active is None
    assert done[-1] is not None and done[-1].trajectory_id == t.trajectory_id
    assert decode(done[-1].data) == t
    assert len(to_chunks("empty", b"", 10)) == 1  # an empty payload is still one set


def test_a_set_not_kept_is_checked_but_its_bytes_dropped() -> None:
    chunks = to_chunks("dup", bytes(range(256)) * 4, 100)
    assembler = ChunkAssembler()
    assert assembler.add(chunks[0], keep=False) is None
    assert assembler.active == "dup"
    for c in chunks[1:-1]:
        assert assembler.add(c, keep=True) is None  # keep is read on the first chunk only
    done = assembler.add(chunks[-1])
    assert done is not None and (done.trajectory_id, done.data) == ("dup", None)


def _tampered(chunks: list, i: int, **fields: Any) -> list:
    out = [type(c)() for c in chunks]
    for new, old in zip(out, chunks):
        new.CopyFrom(old)
    for name, value in fields.items():
        setattr(out[i], name, value)
    return out


@pytest.mark.parametrize(("index", "fields", "match"), [
    (0, {"index": 1}, "must start at index 0"),
    (1, {"index": 2}, "expected chunk"),
    (1, {"trajectory_id": "other"}, "expected chunk"),
    (1, {"count": 9}, "expected chunk"),
    (1, {"data": b"x" * 101}, "exceeds its declared"),
    (2, {"data": b"x"}, "ended with"),
])
def test_broken_chunk_sequences_raise_chunk_error(index: int, fields: dict, match: str) -> None:
    chunks = _tampered(to_chunks("t", b"y" * 250, 100), index, **fields)
    assembler = ChunkAssembler()
    with pytest.raises(ChunkError, match=match):
        for c in chunks:
            assembler.add(c)
    assert assembler.active is None  # the broken set is gone: the next one starts clean
    assert assembler.discard() is False


def test_discard_drops_a_set_in_progress() -> None:
    chunks = to_chunks("t", b"z" * 250, 100)
    assembler = ChunkAssembler()
    assembler.add(chunks[0])
    assert assembler.discard() is True and assembler.active is None
    assert [assembler.add(c) for c in chunks][-1].data == b"z" * 250
