"""Which precision `auto` means on a device: one rule that the learner and the generators both
follow, so that with `auto` on both sides the policy that samples and the policy that trains
compute in the same dtype on the same hardware.

bf16 where the hardware computes it natively (CUDA GPUs that report bf16 support, i.e. Ampere
and later; CPUs with AVX-512 BF16 or AMX), fp32 elsewhere: emulated bf16 is slower than fp32
(vLLM on an AVX2 CPU took twice as long in bf16), and fp16 needs loss scaling. docs/precision.md
measures both precisions on a CPU with AVX-512 BF16.
"""

from __future__ import annotations

import warnings
from pathlib import Path

# The learner's former names of its precisions (before both roles took torch's dtype names);
# read for one release with a warning naming the new one.
OLD_DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16"}
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


def dtype_name(value: object, field: str) -> object:
    """`value` of config field `field` with a former name (fp32, bf16) replaced by torch's
    (float32, bfloat16), saying so; anything else as given, for the field's own check."""
    new = OLD_DTYPE_NAMES.get(value) if isinstance(value, str) else None
    if new is None:
        return value
    warnings.warn(f"{field}: {value!r} is now called {new!r} (the old name is read for one "
                  "release)", FutureWarning, stacklevel=2)
    return new


def learner_dtype(setting: str, *, native_bf16: bool) -> str:
    """`learner.dtype` resolved to "float32" or "bfloat16" (`auto`: bfloat16 where native)."""
    if setting != "auto":
        return setting
    return "bfloat16" if native_bf16 else "float32"


def emulated_bf16(dtype: str, device: str) -> str | None:
    """`device` where a role computing in resolved `dtype` there would emulate bf16, else None."""
    return device if dtype == "bfloat16" and not bf16_native(device) else None


def emulated_bf16_warning(field: str, devices: list[str]) -> str | None:
    """The warning for an explicit `bfloat16` resolved on devices (by name) that have no native
    bf16; None where there are none. Explicit settings are kept (a user may want bf16 on purpose),
    but a 2-core AVX2 CPU trains many times slower in emulated bf16 than in fp32
    (docs/precision.md), which without a word looks like a hang."""
    if not devices:
        return None
    return (f"[horizonrl] warning: {field} is bfloat16 on {', '.join(sorted(set(devices)))} "
            "without native bf16 (AVX-512 BF16 or AMX on a CPU, Ampere or later on a GPU): it is "
            "emulated there, many times slower than float32 (docs/precision.md); `auto` picks "
            "bf16 only where it is native")


def engine_dtype(setting: str, *, native_bf16: bool) -> str:
    """`generator.dtype` resolved to a vLLM dtype (`auto` by the learner's rule)."""
    if setting != "auto":
        return setting
    return learner_dtype("auto", native_bf16=native_bf16)
