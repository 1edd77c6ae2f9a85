"""How a file enters the store without copying a byte where the filesystem allows: a hardlink, else a reflink (a
copy-on-write clone: btrfs, XFS, bcachefs on Linux), else a plain copy. The store's file helpers
(blazar/store/models.py) place every file through `place_file` and record which of the three it was."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from blazar.events.models import Placed

# Errors that mean "a hardlink is impossible here", so the next way is the right fallback.
_NO_LINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES}
# Errors that mean "this filesystem (or pair of them) cannot clone": ext4, tmpfs, across devices, no such ioctl.
_NO_CLONE = {errno.EXDEV, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOTTY, errno.EINVAL, errno.ENOSYS, errno.EPERM,
             errno.EBADF}
FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)


def _clone(src: int, dest: int) -> None:
    """Linux's FICLONE: `dest` shares `src`'s extents. NOTE: macOS's clonefile(2) is not reachable from the standard
    library; there the reflink step is skipped (a copy on APFS follows, or a hardlink before it)."""
    if not sys.platform.startswith("linux"):
        raise OSError(errno.ENOTSUP, "reflinks are cloned through Linux's FICLONE only")
    fcntl.ioctl(dest, FICLONE, src)


def _link(src: str, dest: Path) -> None:
    os.link(src, dest)  # looked up at each call: a test may stand a refusing os.link in for it


# The ports tests replace to reach each fallback (a real cross-device pair is not available to a test).
hardlink: Callable[[str, Path], None] = _link
reflink: Callable[[int, int], None] = _clone


def place_file(src: Path, dest: Path) -> Placed:
    """Put the bytes of `src` at `dest` (which must not exist): hardlinked, else reflinked, else copied (and
    synced). Returns which.

    NOTE: the link is to what `src` leads to: on Linux os.link links a symlink itself (link(2) does not follow it),
    which would leave in the store a link to a path outside the home that every later use refuses."""
    real = os.path.realpath(src)
    try:
        hardlink(real, dest)
        return "hardlink"
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
    if _reflinked(real, dest):
        return "reflink"
    shutil.copyfile(real, dest)
    with dest.open("rb") as fh:
        os.fsync(fh.fileno())
    return "copy"


def _reflinked(src: str, dest: Path) -> bool:
    with open(src, "rb") as fin, open(dest, "wb") as fout:
        try:
            reflink(fin.fileno(), fout.fileno())
            return True
        except OSError as exc:
            if exc.errno not in _NO_CLONE:
                raise
    with contextlib.suppress(FileNotFoundError):
        dest.unlink()  # the empty file the attempt opened: the copy starts afresh
    return False
