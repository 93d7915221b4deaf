"""The outer loop's TensorBoard log: per outer step, the hypergradient's norm, the
hyperparameters and the validation loss.

A task run opens the log (`logging_to`) around its task; the outer loops of `fewshot.hpo.ensemble`
report each step to it (`log_outer_step`), so the tasks and their step callbacks stay as they are.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch

from fewshot.hpo.trees import Tree
from fewshot.runtime.events import EventLog

VAL_LOSS = "outer/val_loss"
# At most about this many distributions of a larger lam per run: each costs milliseconds and
# kilobytes, more than an outer step of the small tasks.
HISTOGRAMS = 100


@dataclass(frozen=True)
class _Target:
    """The log of the running task and its number of outer steps."""

    log: EventLog
    outer_steps: int


_target: ContextVar[_Target | None] = ContextVar("hpo_event_log", default=None)


@contextmanager
def logging_to(log: EventLog, outer_steps: int) -> Iterator[None]:
    """Log the outer steps (`outer_steps` of them) run inside this block to `log`."""
    token = _target.set(_Target(log, outer_steps))
    try:
        yield
    finally:
        _target.reset(token)


def named_leaves(tree: Tree, name: str = "lam") -> list[tuple[str, torch.Tensor]]:
    """(tag, leaf) for every leaf: dict keys and list positions joined by "/"."""
    if isinstance(tree, dict | list | tuple):
        items = tree.items() if isinstance(tree, dict) else enumerate(tree)
        return [leaf for key, value in items for leaf in named_leaves(value, f"{name}/{key}")]
    return [(name, tree)]


def log_outer_step(t: int, hypergrad: Tree, lam: Tree, val_loss: float) -> None:
    """Outer step `t` (0-based; logged as step t + 1): the norm of the hypergradient (and of
    each leaf's, when lam has several), lam (scalars, or histograms of larger leaves at up to
    HISTOGRAMS evenly spaced steps and the last) and the mean validation loss; nothing when no
    log is open."""
    target = _target.get()
    if target is None:
        return
    log, step = target.log, t + 1
    every = -(-target.outer_steps // HISTOGRAMS)
    histogram_due = step % every == 0 or step == target.outer_steps
    grads = named_leaves(hypergrad)
    norms = torch.stack([g.detach().norm() for _, g in grads]).tolist()  # one synchronisation
    scalars = {VAL_LOSS: val_loss, "outer/hypergrad_norm": math.hypot(*norms)}
    if len(grads) > 1:
        scalars |= {f"hypergrad_norm/{name}": n for (name, _), n in zip(grads, norms, strict=True)}
    for name, value in named_leaves(lam):
        if value.numel() == 1:
            scalars[name] = float(value)
        elif histogram_due:
            log.histogram(name, value, step)
    log.scalars(step, scalars)
