"""Argument checks of the backbones and the hub: one place, shared by the CLI and torch.hub.

Each refusal is one ValueError naming the owner, the argument, what it got and what is allowed.
"""

from __future__ import annotations

from typing import Any

import torch

from fewshot.runtime.shapes import describe_tensor, shape_fault


def require_int(owner: str, name: str, value: Any, low: int) -> None:
    """Refuse anything but an integer >= `low` (bool is not one), naming the argument."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{owner} {name} must be an integer >= {low}, got {value!r}")


def require_bool(owner: str, name: str, value: Any) -> None:
    """Refuse anything but True or False (the string 'False' would count as true)."""
    if not isinstance(value, bool):
        raise ValueError(f"{owner} {name} must be True or False, got {value!r}")


def require_images(owner: str, images: Any, channels: int, smallest: int) -> None:
    """Refuse anything but float images [N, channels, H, W] with H and W >= `smallest`, naming
    the wrong dimension in words (channels, height, width)."""
    if not (isinstance(images, torch.Tensor) and images.is_floating_point()):
        raise ValueError(
            f"{owner} input must be float images [N, {channels}, H, W] with H, W >= {smallest}, "
            f"got {describe_tensor(images)}"
        )
    sides = {"H": smallest, "W": smallest}
    fault = shape_fault(images.shape, ("N", "C", "H", "W"), {"C": channels}, sides)
    if fault:
        raise ValueError(f"{owner} input {fault}")


def require_rate(owner: str, name: str, value: Any) -> None:
    """Refuse anything but a number in [0, 1)."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value < 1:
        raise ValueError(f"{owner} {name} must be a number in [0, 1), got {value!r}")
