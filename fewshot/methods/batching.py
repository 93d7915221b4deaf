"""How the adaptation methods run the U*B problems of a step: all at once under vmap, one after
another, or in chunks of episodes side by side in threads (`--method-options batching`).

All three compute the same meta-gradient; they differ in speed by device. Under vmap every
convolution with per-problem weights becomes one grouped convolution: what a GPU wants, but on
a 2-core CPU a MAML or iMAML step took 1.5-2.0x the loop's time (one thread; grouped
convolutions, and 2.4-5x the loop's elementwise work in the batched BatchNorm). On a CPU the
threads run one chunk of episodes each, with one intra-op thread apiece: the cores work on
different problems instead of splitting every small convolution between them and meeting at a
barrier after each (which, on a loaded machine, waits for the slowest core every time): 1.1-1.3x
faster than the loop on two quiet cores, 2.4x loaded. Measured side by side in
benchmarks/bench_vs_learn2learn.py (benchmarks/results/bench_vs_learn2learn_cpu_xeon.txt).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch
from torch import nn

BATCHING = ("auto", "vmap", "loop", "threads")
Result = TypeVar("Result")


def check_batching(batching: str) -> None:
    """Refuse a value that is not one of BATCHING, in one line (ValueError)."""
    if batching not in BATCHING:
        raise ValueError(f"batching must be one of {', '.join(BATCHING)}, got {batching!r}")


def resolve_batching(batching: str, device_type: str) -> str:
    """What `batching` means on a device type: 'auto' is vmap on CUDA, threads elsewhere."""
    check_batching(batching)
    if batching != "auto":
        return batching
    return "vmap" if device_type == "cuda" else "threads"


def chunk_count(batching: str, episodes: int) -> int:
    """How many chunks of episodes `batching` (resolved) runs side by side: one per intra-op
    thread for threads (at most one per episode), else one."""
    return min(torch.get_num_threads(), episodes) if batching == "threads" else 1


def concurrently(work: Callable[[int], Result], count: int) -> list[Result]:
    """[work(0), ..., work(count - 1)]: in the calling thread when count is 1, else each in its
    own thread with one intra-op thread (the caller's count is restored after) and the caller's
    grad mode (thread-local in torch)."""
    if count == 1:
        return [work(0)]
    threads, grad = torch.get_num_threads(), torch.is_grad_enabled()

    def run(index: int) -> Result:
        torch.set_num_threads(1)  # per OpenMP thread: this worker's operations stay on it
        with torch.set_grad_enabled(grad):
            return work(index)

    try:
        with ThreadPoolExecutor(count) as pool:
            return list(pool.map(run, range(count)))
    finally:
        torch.set_num_threads(threads)


def replica(module: nn.Module) -> nn.Module:
    """A copy of `module` that shares its parameters and buffers: `functional_call` swaps a
    module's tensors while it runs, so threads calling it at once need a module each."""
    shared = {id(t): t for t in itertools.chain(module.parameters(), module.buffers())}
    return copy.deepcopy(module, memo=shared)
