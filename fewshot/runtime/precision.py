"""Autocast precision of the backbone: the --amp choices and what 'auto' picks on a device."""

from __future__ import annotations

import functools

import torch

from fewshot.runtime.settings import setting

# Heads, QPs and losses always run in float32; --amp sets only the backbone's autocast dtype.
AMP_DTYPES = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}
AMP_CHOICES = ("auto", *AMP_DTYPES)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 in hardware (AVX-512 BF16 or AMX), as oneDNN needs."""
    # Private API: the public torch.backends.cpu.get_cpu_capability() tops out at "AVX512" and
    # says nothing of BF16 or AMX; if torch drops these, getattr's False keeps 'auto' at float32.
    cpu = torch.cpu
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(cpu, name, lambda: False)() for name in checks)


@functools.cache
def resolve_amp(amp: str, device_type: str) -> str:
    """The precision `amp` means on a device type: 'auto' is bf16 on CPUs with native bf16
    (faster at float32's accuracy: benchmarks/bench_precision.py, experiments/bf16_omniglot)
    and float32 ('off') elsewhere, CUDA included until a GPU measurement decides it."""
    if amp not in AMP_CHOICES:
        raise ValueError(f"amp must be one of {', '.join(AMP_CHOICES)}, not {amp!r}")
    if amp != "auto":
        return amp
    return "bf16" if device_type == "cpu" and cpu_has_native_bf16() else "off"


def autocast_dtype(amp: str, device_type: str) -> torch.dtype | None:
    """The autocast dtype of `amp` on a device type (None: float32, no autocast)."""
    return AMP_DTYPES[resolve_amp(amp, device_type)]


def precision_name(amp: str, device_type: str) -> str:
    """A word for logs and results: 'bf16', 'fp16' or 'float32'."""
    resolved = resolve_amp(amp, device_type)
    return "float32" if resolved == "off" else resolved


def amp_setting() -> str:
    """The --amp setting of training and evaluation."""
    return setting(
        "auto",
        help="backbone autocast: auto = bf16 on CPUs with native bf16, else float32; off = float32",
        choices=AMP_CHOICES,
    )
