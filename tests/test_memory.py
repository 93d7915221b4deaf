"""fewshot.runtime.memory: what a device has available (meminfo, cgroup limits, CUDA) and the
one-line refusal of work that cannot fit."""

from __future__ import annotations

import os

import pytest
import torch

from fewshot.runtime import memory
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.memory import available_bytes, format_bytes, refuse_if_too_big

GIB = 2**30


@pytest.fixture
def fake_machine(tmp_path, monkeypatch):
    """/proc/meminfo with 8 GiB available and an empty cgroup tree, both under tmp_path."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {16 * GIB // 1024} kB\nMemAvailable: {8 * GIB // 1024} kB\n")
    monkeypatch.setattr(memory, "MEMINFO", meminfo)
    monkeypatch.setattr(memory, "SELF_CGROUP", tmp_path / "self_cgroup")
    monkeypatch.setattr(memory, "CGROUP_ROOT", tmp_path / "cgroup")
    return tmp_path


def write_cgroup(folder, limit: str, usage: int, cache: int, v2: bool) -> None:
    """A memory cgroup's limit, usage and reclaimable page cache in v2 or v1 file names."""
    folder.mkdir(parents=True, exist_ok=True)
    names = ("memory.max", "memory.current", "inactive_file")
    if not v2:
        names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
    (folder / names[0]).write_text(limit + "\n")
    (folder / names[1]).write_text(f"{usage}\n")
    (folder / "memory.stat").write_text(f"anon 1\n{names[2]} {cache}\n")


def test_cpu_memory_is_meminfo_without_a_cgroup_limit(fake_machine):
    assert available_bytes(torch.device("cpu")) == 8 * GIB
    (fake_machine / "self_cgroup").write_text("0::/\n")
    write_cgroup(fake_machine / "cgroup", "max", GIB, 0, v2=True)
    assert available_bytes(torch.device("cpu")) == 8 * GIB


@pytest.mark.parametrize("v2", [True, False], ids=["cgroup-v2", "cgroup-v1"])
def test_a_cgroup_limit_lowers_it_and_its_page_cache_counts_as_free(fake_machine, v2):
    line = "0::/job/run\n" if v2 else "1:cpu:/\n4:memory:/job/run\n"
    (fake_machine / "self_cgroup").write_text(line)
    mount = fake_machine / "cgroup" / ("" if v2 else "memory")
    write_cgroup(mount / "job" / "run", str(4 * GIB), 3 * GIB, GIB // 2, v2)
    assert available_bytes(torch.device("cpu")) == GIB + GIB // 2
    # A parent's tighter limit binds too; v1 writes "no limit" as a number near 2^63.
    write_cgroup(mount / "job", str(3 * GIB), 3 * GIB - GIB // 4, 0, v2)
    write_cgroup(mount, "max" if v2 else str(2**63 - 4096), 12 * GIB, 0, v2)
    assert available_bytes(torch.device("cpu")) == GIB // 4


def test_this_machine_has_memory_available_within_its_total():
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < available_bytes(torch.device("cpu")) <= total


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_memory_counts_what_torchs_cache_holds_unused():
    device = torch.device("cuda")
    block = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    with_block = available_bytes(device)
    del block  # back to torch's cache, not to the driver: still this process's to use
    assert available_bytes(device) >= with_block + 256 * 2**20
    assert available_bytes(device) <= torch.cuda.mem_get_info(device)[1]


def test_sizes_are_written_in_the_largest_unit_under_them():
    assert format_bytes(41.2 * GIB) == "41.2 GiB"
    assert format_bytes(310 * 2**20) == "310.0 MiB"
    assert format_bytes(12 * 1024) == "12.0 KiB"


def test_work_that_cannot_fit_is_one_line_with_the_estimate_and_the_setting(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device: int(22.8 * GIB))
    cpu = torch.device("cpu")
    refuse_if_too_big(22 * GIB, cpu, "one outer step", "--inner-steps")  # fits: nothing said
    with pytest.raises(FewshotError) as refused:
        refuse_if_too_big(int(41.2 * GIB), cpu, "one outer step", "--inner-steps", "128 x 330 MiB")
    assert str(refused.value) == (
        "one outer step needs about 41.2 GiB (128 x 330 MiB) but 22.8 GiB are available on "
        "cpu: lower --inner-steps"
    )
