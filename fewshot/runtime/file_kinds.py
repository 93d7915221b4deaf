"""What kind of file a path is, in words, for refusing outputs that are not regular files.

A regular file is what an output may replace. A folder, a device node, a pipe or a socket is
not; neither is a file of a kernel pseudo-filesystem (/proc, /sys): `stat` calls those
regular, but their folders take no new files, so an atomic write there fails only after the
work, with a cause ("No such file or directory") that names nothing the user did.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

MOUNTS = Path("/proc/self/mounts")  # lines "device mount-point type options 0 0"
# Filesystems through which the kernel shows its own state: their files are not data files.
KERNEL_FILESYSTEMS = frozenset(
    {
        "binfmt_misc",
        "bpf",
        "cgroup",
        "cgroup2",
        "configfs",
        "debugfs",
        "devpts",
        "devtmpfs",
        "efivarfs",
        "proc",
        "pstore",
        "securityfs",
        "sysfs",
        "tracefs",
    }
)


def non_regular_kind(path: Path) -> str | None:
    """What `path` is when it exists and is not a regular file of an ordinary filesystem
    ('a folder', 'a device node', 'a file of the kernel's proc filesystem', ...); None for
    a regular file or a path that does not exist (symlinks followed)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device node"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    kernel = kernel_filesystem(path)
    return f"a file of the kernel's {kernel} filesystem" if kernel else None


def kernel_filesystem(path: Path) -> str | None:
    """The type of the kernel pseudo-filesystem that holds the existing `path` (proc, sysfs,
    ...), from the mount table; None for any other, and where no mount table is readable."""
    try:
        device = path.stat().st_dev
        lines = MOUNTS.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) < 3 or fields[2] not in KERNEL_FILESYSTEMS:
            continue
        # The table writes a space, tab, newline or backslash of a mount point as \NNN (octal).
        mount = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
        try:
            if os.stat(mount).st_dev == device:
                return fields[2]
        except OSError:
            continue  # a mount point this process cannot see
    return None


def kernel_folder_refusal(path: Path) -> str | None:
    """Why nothing can be created at the new `path`, when the nearest existing folder above it
    belongs to a kernel pseudo-filesystem: '/proc is a folder of the kernel's proc filesystem,
    not one for data files'; None otherwise."""
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    kernel = kernel_filesystem(folder)
    if kernel is None:
        return None
    return f"{folder} is a folder of the kernel's {kernel} filesystem, not one for data files"
