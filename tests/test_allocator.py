"""retain_freed_memory: a freed block is reused without faulting its pages in again."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fewshot.runtime.allocator import glibc_malloc

PAGES = 2**24 * 4 // 4096  # a 64 MiB float32 tensor, in 4 KiB pages

# Allocate and free the same 64 MiB ten times (the heap settles in the first few, as a training
# loop does in its first steps), then five more; print the page faults per allocation of those.
PROGRAM = """
import resource, sys, torch
from fewshot.runtime.allocator import retain_freed_memory
if sys.argv[1] == "retain":
    assert retain_freed_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    x = torch.ones(2**24)
    del x
before = faults()
for _ in range(5):
    x = torch.ones(2**24)
    del x
print((faults() - before) / 5)
"""


def faults_per_allocation(mode: str) -> float:
    """Minor page faults per 64 MiB allocation in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, check=True
    )
    return float(out.stdout)


@pytest.mark.skipif(not glibc_malloc(), reason="not glibc: nothing to tune")
def test_retained_blocks_are_not_faulted_in_again():
    # glibc's default: a block this large is mmapped, unmapped on free, faulted in again.
    assert faults_per_allocation("default") > PAGES / 2
    assert faults_per_allocation("retain") < 100
