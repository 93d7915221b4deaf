"""Argument checks of the backbone constructors: one place, shared by the CLI and torch.hub."""

from __future__ import annotations

from typing import Any


def require_int(owner: str, name: str, value: Any, low: int) -> None:
    """Refuse anything but an integer >= `low` (bool is not one), naming the argument."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{owner} {name} must be an integer >= {low}, got {value!r}")


def require_rate(owner: str, name: str, value: Any) -> None:
    """Refuse anything but a number in [0, 1)."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value < 1:
        raise ValueError(f"{owner} {name} must be a number in [0, 1), got {value!r}")
