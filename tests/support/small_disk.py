"""A full disk, for real: a tmpfs of a few MiB mounted under the test's own directory, and a file that takes every
free byte of it (removed to free the space again). Mounting needs root: as another user the test skips; as root (CI
runs as root) a refused mount is a failure, not a skip. Unmounted at the end."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

FILLER = "filler"


@contextlib.contextmanager
def small_disk(where: Path, size_mib: int) -> Iterator[Path]:
    """`where`, a fresh tmpfs of `size_mib` MiB, for the duration."""
    if os.geteuid() != 0:
        pytest.skip("a real full disk needs a tmpfs of its own, and mounting one needs root")
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0700", "tmpfs", str(where)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.fail(f"mount -t tmpfs refused as root: {done.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)  # still busy: detach it


def fill(disk: Path) -> Path:
    """Write a file on `disk` until the filesystem refuses another byte (ENOSPC); returns it."""
    path = disk / FILLER
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for block in (b"\0" * (1 << 20), b"\0" * 4096, b"\0"):  # large, then the last pages, then the last bytes
            while True:
                try:
                    os.write(fd, block)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    assert os.statvfs(disk).f_bavail == 0, "the disk still has room"
    return path


def free(disk: Path) -> None:
    """Give the space `fill` took back."""
    (disk / FILLER).unlink()
