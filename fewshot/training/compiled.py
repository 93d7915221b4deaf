"""`--compile`: the backbone of the training steps through torch.compile, everything else eager."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

# off: eager; default: fused kernels (Inductor); reduce-overhead: also replayed as CUDA graphs.
COMPILE_MODES = ("off", "default", "reduce-overhead")


class CompiledBackbone:
    """A method's backbone compiled once (torch.compile in `mode`), put in the backbone's place
    for the training step only: validation, checkpoints (the same parameters, the same keys)
    and anything after training see the eager module, so only the step's shapes compile."""

    def __init__(self, method: nn.Module, mode: str):
        if mode not in COMPILE_MODES:
            raise ValueError(f"mode must be one of {COMPILE_MODES}, got {mode!r}")
        self.method = method
        self.graphs = mode == "reduce-overhead"
        self.compiled = None if mode == "off" else torch.compile(method.backbone, mode=mode)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The compiled backbone in the method for the duration of one training step."""
        if self.compiled is None:
            yield
            return
        if self.graphs:  # a new step: the previous step's graph outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        eager = self.method.backbone
        self.method.backbone = self.compiled
        try:
            yield
        finally:
            self.method.backbone = eager
