"""`auto` precision: one rule for the learner and the generators, decided by the device."""

from __future__ import annotations

import pytest

from horizonrl.learner.group import agreed_precision
from horizonrl.protos.precision import (
    bf16_native,
    cpu_flags,
    emulated_bf16,
    emulated_bf16_warning,
    engine_dtype,
    learner_dtype,
)

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu sse2 avx2 avx512f {extra}
processor\t: 1
flags\t\t: fpu sse2 avx2 avx512f {extra}
"""


@pytest.mark.parametrize("extra,native", [("avx512_bf16", True), ("amx_tile amx_bf16", True),
                                          ("avx512vl", False), ("", False)])
def test_cpu_bf16_is_native_with_avx512_bf16_or_amx(tmp_path, extra, native):
    info = tmp_path / "cpuinfo"
    info.write_text(CPUINFO.format(extra=extra))
    flags = cpu_flags(info)
    assert "avx2" in flags and "avx512f" in flags
    assert bf16_native("cpu", flags=flags) is native


def test_no_cpuinfo_means_no_native_bf16(tmp_path):
    assert cpu_flags(tmp_path / "missing") == set()
    assert bf16_native("cpu", flags=set()) is False


def test_cuda_without_a_gpu_is_not_native_bf16():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the CUDA answer is the device's own")
    assert bf16_native("cuda:0") is False


@pytest.mark.parametrize("native", [True, False])
def test_auto_resolves_alike_for_both_roles_and_explicit_settings_stay(native):
    want = "bfloat16" if native else "float32"
    assert learner_dtype("auto", native_bf16=native) == engine_dtype("auto", native_bf16=native) \
        == want
    for setting in ("float32", "bfloat16"):
        assert learner_dtype(setting, native_bf16=not native) == setting
    for setting in ("float32", "bfloat16", "float16"):
        assert engine_dtype(setting, native_bf16=not native) == setting


def test_emulated_bf16_is_named_once_per_device_and_only_where_it_happens():
    native = bf16_native("cpu")
    assert emulated_bf16("bfloat16", "cpu") == (None if native else "cpu")
    assert emulated_bf16("float32", "cpu") is None
    assert emulated_bf16_warning("learner.dtype", []) is None
    text = emulated_bf16_warning("generator.dtype", ["cpu", "cuda", "cpu"])
    assert "generator.dtype is bfloat16 on cpu, cuda without native bf16" in text
    assert "`auto`" in text


def test_learner_ranks_that_resolve_differently_are_refused():
    assert agreed_precision(["bfloat16", "bfloat16"]) == "bfloat16"
    with pytest.raises(ValueError, match=r"\['bfloat16', 'float32'\].*set learner.dtype"):
        agreed_precision(["bfloat16", "float32"])


def test_the_memory_plan_counts_auto_as_bf16(capsys):
    """The plan is per GPU, where `auto` means bf16."""
    from horizonrl.cluster.config import load_config
    from horizonrl.cluster.ops.plan import memory_report

    printed = {}
    for learner, engine in (("auto", "auto"), ("bfloat16", "bfloat16"), ("float32", "float32")):
        memory_report(load_config("configs/babyai-local.yaml", [
            f"learner.dtype={learner}", f"generator.dtype={engine}"]), gpu_gib=None)
        printed[learner] = capsys.readouterr().out
    assert printed["auto"] == printed["bfloat16"] != printed["float32"]
