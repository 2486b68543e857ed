"""Which precision `auto` means on a device: one rule that the learner and the generators both
follow, so that with `auto` on both sides the policy that samples and the policy that trains
compute in the same dtype on the same hardware.

bf16 where the hardware computes it natively (CUDA GPUs that report bf16 support, i.e. Ampere
and later; CPUs with AVX-512 BF16 or AMX), fp32 elsewhere: emulated bf16 is slower than fp32
(vLLM on an AVX2 CPU took twice as long in bf16), and fp16 needs loss scaling. docs/precision.md
measures both precisions on a CPU with AVX-512 BF16.
"""

from __future__ import annotations

from pathlib import Path

# Learner names (DeepSpeed's "bf16" mode) and engine names (vLLM's dtype) of one precision.
ENGINE_DTYPE = {"fp32": "float32", "bf16": "bfloat16"}
_CPU_BF16_FLAGS = {"avx512_bf16", "amx_bf16"}


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The instruction-set flags of this machine's first CPU (empty where there is no
    /proc/cpuinfo, e.g. macOS: `auto` then means fp32 on CPU)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def bf16_native(device: str = "cpu", *, flags: set[str] | None = None) -> bool:
    """Whether `device` ("cpu", "cuda", "cuda:N") computes bf16 natively."""
    if device.startswith("cuda"):
        import torch

        # Not emulated bf16 (pre-Ampere GPUs run it slower than fp32).
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(
            including_emulation=False)
    return bool(_CPU_BF16_FLAGS & (cpu_flags() if flags is None else flags))


def learner_dtype(setting: str, *, native_bf16: bool) -> str:
    """`learner.dtype` resolved to "fp32" or "bf16" (`auto`: bf16 where it is native)."""
    if setting != "auto":
        return setting
    return "bf16" if native_bf16 else "fp32"


def engine_dtype(setting: str, *, native_bf16: bool) -> str:
    """`generator.dtype` resolved to a vLLM dtype (`auto` by the learner's rule)."""
    if setting != "auto":
        return setting
    return ENGINE_DTYPE[learner_dtype("auto", native_bf16=native_bf16)]
