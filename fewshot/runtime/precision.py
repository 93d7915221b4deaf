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


def cuda_has_native_bf16() -> bool:
    """Whether the CUDA GPU computes bfloat16 in its tensor cores (compute capability >= 8.0,
    Ampere and newer); older GPUs would emulate it, slower than float32."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8


@functools.cache
def resolve_amp(amp: str, device_type: str) -> str:
    """The precision `amp` means on a device type: 'auto' is bf16 where the hardware has it
    natively and float32 ('off') elsewhere. On CPUs bf16 trains at float32's accuracy in about
    half the time (benchmarks/bench_precision.py, experiments/bf16_omniglot); on an H200 it took
    ResNet-12 steps to 0.66-0.80x and left Conv-4's unchanged (shared/measurements)."""
    if amp not in AMP_CHOICES:
        raise ValueError(f"amp must be one of {', '.join(AMP_CHOICES)}, not {amp!r}")
    if amp != "auto":
        return amp
    native = {"cpu": cpu_has_native_bf16, "cuda": cuda_has_native_bf16}.get(device_type)
    return "bf16" if native is not None and native() else "off"


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
        help="backbone autocast: auto = bf16 where native (CPUs with AVX-512 BF16 or AMX, CUDA "
        "GPUs of compute capability 8.0+), else float32; off = float32",
        choices=AMP_CHOICES,
    )
