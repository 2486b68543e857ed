"""The committed generated protobuf code matches protos/trajectory.proto.

If this fails, run `python -m horizonrl.protos.generate` (or `make protos`) and commit the result.
"""

from __future__ import annotations

from pathlib import Path

from horizonrl.protos.generate import GENERATED, generated_sources

PROTOS = Path(__file__).resolve().parents[2] / "protos"


def test_generated_code_is_fresh() -> None:
    fresh = generated_sources()
    assert sorted(fresh) == sorted(GENERATED)
    stale = [name for name, text in fresh.items() if (PROTOS / name).read_text() != text]
    assert not stale, f"stale generated files {stale}: run `python -m horizonrl.protos.generate`"


def test_grpc_module_imports_as_package() -> None:
    text = (PROTOS / "trajectory_pb2_grpc.py").read_text()
    assert "from horizonrl.protos import trajectory_pb2" in text
