"""Keep freed memory in the process: glibc would return it and page-fault it back every step."""

from __future__ import annotations

import ctypes
import functools

# mallopt parameters (glibc's malloc.h).
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4


@functools.cache
def _mallopt():
    """glibc's mallopt, or None on other C libraries (macOS, musl, Windows)."""
    try:
        # The C library the process already runs on (no search: find_library spawns ldconfig).
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (raises AttributeError outside glibc)
    except (OSError, AttributeError, TypeError):
        return None
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return libc.mallopt


def glibc_malloc() -> bool:
    """Whether this process allocates with glibc, the one C library tuned here."""
    return _mallopt() is not None


def retain_freed_memory() -> bool:
    """Serve every allocation from the heap and never shrink it; False when the C library is
    not glibc. A training step frees and re-allocates the same activations: with
    glibc's defaults the large ones are unmapped on free and their pages faulted in and zeroed
    again next step (the cost is measured in the README); retained, the process keeps its peak
    size."""
    mallopt = _mallopt()
    if mallopt is None:
        return False
    return bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1)) and bool(mallopt(M_MMAP_MAX, 0))
