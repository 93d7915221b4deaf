"""Memory checked before work: what a device has available, and the one-line refusal.

A command that can estimate its peak memory from its settings and shapes calls
`refuse_if_too_big(needed, device, what, lower)` before it reads data or takes a step, so a run
that cannot fit stops at once with the estimate, what is available and the setting to lower,
instead of swapping for hours or being killed by the kernel mid-run. Estimates should be lower
bounds (the tensors that are surely kept): the refusal is for runs that clearly cannot fit.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from fewshot.runtime.errors import FewshotError

MEMINFO = Path("/proc/meminfo")
SELF_CGROUP = Path("/proc/self/cgroup")  # lines "id:controllers:path"
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Where each cgroup version keeps (the limit, the usage, the reclaimable page cache's key in
# memory.stat), and where its memory hierarchy is mounted under CGROUP_ROOT.
_CGROUP_V2 = ("", ("memory.max", "memory.current", "inactive_file"))
_CGROUP_V1 = ("memory", ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"))


def available_bytes(device: torch.device) -> int:
    """Bytes that new tensors on `device` can take now without swapping or failing.

    CUDA: the GPU's free memory plus what torch's caching allocator holds unused (this process
    can reuse it). Any other device (cpu, and devices that share host memory): Linux's
    MemAvailable (free memory plus the page cache and slabs the kernel can reclaim), lowered
    to the room left under the memory limit of this process's cgroup (a container sees the
    host's /proc/meminfo, not its own limit); elsewhere the free physical pages.
    """
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return free + cached
    return min([_meminfo_available(), *_cgroup_room()])


def _meminfo_available() -> int:
    """MemAvailable of /proc/meminfo, else (not Linux, or a kernel before 3.14) free pages."""
    try:
        for line in MEMINFO.read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "MemAvailable":
                return int(value.split()[0]) * 1024  # the file counts kB
    except (OSError, ValueError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _cgroup_room() -> list[int]:
    """Limit minus usage (reclaimable page cache not counted as used) of this process's memory
    cgroup and each of its ancestors that has a limit; [] where none is visible."""
    try:
        lines = SELF_CGROUP.read_text().splitlines()
    except OSError:
        return []
    room = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # "0::/path": the unified (v2) hierarchy
            folder_name, (limit_file, usage_file, cache_key) = _CGROUP_V2
        elif "memory" in controllers.split(","):
            folder_name, (limit_file, usage_file, cache_key) = _CGROUP_V1
        else:
            continue
        mount = CGROUP_ROOT / folder_name
        folder = mount / path.lstrip("/")
        while True:  # a parent's limit binds its children too
            try:
                limit_text = (folder / limit_file).read_text().strip()
                if limit_text != "max" and int(limit_text) < 2**62:  # v1 writes "no limit" as ~2^63
                    usage = int((folder / usage_file).read_text())
                    free = int(limit_text) - usage + _stat_value(folder, cache_key)
                    room.append(max(free, 0))
            except (OSError, ValueError):
                pass  # not visible from here (another namespace) or not a memory cgroup
            if folder == mount or mount not in folder.parents:
                break
            folder = folder.parent
    return room


def _stat_value(folder: Path, key: str) -> int:
    """One counter of a cgroup's memory.stat (0 when absent)."""
    for line in (folder / "memory.stat").read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def format_bytes(size: float) -> str:
    """'41.2 GiB', '310.0 MiB' or '12.0 KiB': one decimal, the largest unit under the size."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if abs(size) >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size / 2**10:.1f} KiB"


def fits(needed: int, device: torch.device) -> bool:
    """Whether `needed` bytes fit in what `device` has available now."""
    return needed <= available_bytes(device)


def refuse_if_too_big(
    needed: int, device: torch.device, what: str, lower: str, detail: str = ""
) -> None:
    """FewshotError, one line, when `needed` bytes exceed what `device` has available.

    `what` names the work ("the run", "one outer step"), `detail` (optional) how the estimate
    is made up, `lower` the setting that shrinks it, e.g. "one outer step needs about 41.2 GiB
    (128 kept inner steps x 330 MiB) but 22.8 GiB are available on cpu: lower --inner-steps".
    """
    have = available_bytes(device)
    if needed > have:
        parts = f" ({detail})" if detail else ""
        raise FewshotError(
            f"{what} needs about {format_bytes(needed)}{parts} but {format_bytes(have)} are "
            f"available on {device}: lower {lower}"
        )


@dataclass(frozen=True)
class MemoryTerm:
    """One part of a memory estimate: bytes (a lower bound), what they hold, and the setting
    that shrinks them (None: fixed)."""

    size: int
    what: str
    lower: str | None


def check_memory(terms: Sequence[MemoryTerm], device: torch.device, what: str = "the run") -> None:
    """Refuse, in one line, work whose estimate (the sum of `terms`) exceeds what `device` has
    available, naming the setting of the largest term that has one."""
    largest = max((t for t in terms if t.lower), key=lambda term: term.size)
    detail = ", ".join(f"{t.what}: {format_bytes(t.size)}" for t in terms if t.size)
    refuse_if_too_big(sum(t.size for t in terms), device, what, str(largest.lower), detail)
