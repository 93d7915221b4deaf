"""Device choice: one place that turns --device into a torch.device."""

from __future__ import annotations

import torch

from fewshot.runtime.errors import FewshotError
from fewshot.runtime.settings import setting

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available else cpu; 'cuda' without a GPU is a user error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise FewshotError("--device cuda was asked for, but no CUDA GPU is available")
    if name not in ("cpu", "cuda"):
        raise FewshotError(f"--device must be auto, cpu or cuda, not {name!r}")
    return torch.device(name)


def device_setting() -> str:
    """The --device setting of every command that computes."""
    return setting("auto", help="auto = cuda when available, else cpu", choices=DEVICES)
