"""How a file enters the store (blazar/store/placement.py): a hardlink, else a reflink, else a copy, each fallback
reached through the ports a real cross-device pair would refuse."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from blazar.store import placement
from blazar.store.models import store_split
from blazar.store.placement import place_file


def refuse(code: int):  # type: ignore[no-untyped-def]
    def refused(*_: object) -> None:
        raise OSError(code, os.strerror(code))

    return refused


@pytest.fixture
def src(tmp_path: Path) -> Path:
    path = tmp_path / "src.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * 40)
    return path


def test_a_file_on_the_same_filesystem_is_hardlinked(src: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest.gguf"
    assert place_file(src, dest) == "hardlink"
    assert dest.samefile(src)


def test_a_symlink_is_followed_so_the_store_never_links_the_link_itself(src: Path, tmp_path: Path) -> None:
    link = tmp_path / "snapshot.gguf"
    link.symlink_to(src)
    dest = tmp_path / "dest.gguf"
    assert place_file(link, dest) == "hardlink"
    assert not dest.is_symlink() and dest.samefile(src)


def test_across_devices_a_reflink_comes_before_a_copy(src: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cloned: list[tuple[int, int]] = []

    def clone(fin: int, fout: int) -> None:  # what FICLONE does, as far as the bytes go
        cloned.append((fin, fout))
        os.write(fout, os.pread(fin, os.fstat(fin).st_size, 0))

    monkeypatch.setattr(placement, "hardlink", refuse(errno.EXDEV))
    monkeypatch.setattr(placement, "reflink", clone)
    dest = tmp_path / "dest.gguf"
    assert place_file(src, dest) == "reflink"
    assert len(cloned) == 1 and dest.read_bytes() == src.read_bytes() and not dest.samefile(src)


@pytest.mark.parametrize("clone_error", [errno.EOPNOTSUPP, errno.EXDEV, errno.ENOTTY, errno.EINVAL])
def test_where_neither_a_link_nor_a_clone_is_possible_the_file_is_copied(
        src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clone_error: int) -> None:
    monkeypatch.setattr(placement, "hardlink", refuse(errno.EXDEV))
    monkeypatch.setattr(placement, "reflink", refuse(clone_error))
    dest = tmp_path / "dest.gguf"
    assert place_file(src, dest) == "copy"
    assert dest.read_bytes() == src.read_bytes() and not dest.samefile(src)


def test_the_real_clone_on_this_filesystem_falls_back_to_a_copy_or_clones(src: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Linux's FICLONE itself: ext4 and tmpfs refuse it (a copy), btrfs and XFS clone; the bytes are the same."""
    monkeypatch.setattr(placement, "hardlink", refuse(errno.EXDEV))
    dest = tmp_path / "dest.gguf"
    assert place_file(src, dest) in ("reflink", "copy")
    assert dest.read_bytes() == src.read_bytes()


def test_an_unexpected_link_error_is_raised_not_hidden_by_a_copy(src: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement, "hardlink", refuse(errno.ENOSPC))
    with pytest.raises(OSError) as caught:
        place_file(src, tmp_path / "dest.gguf")
    assert caught.value.errno == errno.ENOSPC and not (tmp_path / "dest.gguf").exists()


def test_a_split_model_reports_the_weakest_way_any_part_was_placed(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    parts = []
    for i in (1, 2):
        part = tmp_path / f"m-0000{i}-of-00002.gguf"
        part.write_bytes(b"GGUF" + bytes([i]) * 100)
        parts.append(part)
    real_link = placement.hardlink

    def link_first_only(src: str, dest: Path) -> None:
        if src.endswith("00002-of-00002.gguf"):
            raise OSError(errno.EXDEV, "cross-device")
        real_link(src, dest)

    monkeypatch.setattr(placement, "hardlink", link_first_only)
    monkeypatch.setattr(placement, "reflink", refuse(errno.EOPNOTSUPP))
    shards, placed = store_split(parts, tmp_path / "models", "m")
    assert placed == "copy" and [s.path for s in shards] == ["m/m-00001-of-00002.gguf", "m/m-00002-of-00002.gguf"]
