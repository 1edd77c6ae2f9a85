"""The content store of `/v1/files` and batches: what the log never holds (a file's bytes, a batch line's answer).

    <data>/files/<file-id>                      a stored file (uploaded, or a batch's output or error file)
    <data>/batches/<batch-id>/input.jsonl       the batch's own link to its input file (a delete of the file keeps it)
    <data>/batches/<batch-id>/lines/<n>.json    line n's result line, written before its `batch.line_done`

Every path is made from an id checked against its pattern (blazar/events/batches.py), then confined to its directory
(blazar/confine.py) right before it is opened or removed: the log names ids, and is not trusted with paths.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from blazar.confine import inside
from blazar.errors import FileTooLarge
from blazar.events.batches import BATCH_ID, FILE_ID
from blazar.paths import Paths


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def new_batch_id() -> str:
    return f"batch_{secrets.token_hex(12)}"


@dataclass(frozen=True, slots=True)
class Stored:
    bytes: int
    sha256: str


class Writing:
    """An upload on its way to disk: a temporary file in the store's directory, hashed and counted as it is written,
    made the file's content by `keep`, removed by `discard` (or whatever ends it without `keep`)."""

    def __init__(self, store: FileStore, limit: int) -> None:
        self._store, self._limit = store, limit
        store.files_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, name = _temp(store.files_dir)
        self._fd, self._tmp = fd, Path(name)
        self._hash = hashlib.sha256()
        self.bytes = 0

    def write(self, chunk: bytes) -> None:
        self.bytes += len(chunk)
        if self.bytes > self._limit:
            raise FileTooLarge(f"the file is over the limit of {self._limit} bytes (inputs.files_max_bytes)")
        self._hash.update(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(self._fd, view):]

    def keep(self, file_id: str) -> Stored:
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        os.replace(self._tmp, self._store.file_path(file_id))
        return Stored(bytes=self.bytes, sha256=self._hash.hexdigest())

    def discard(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._tmp.unlink(missing_ok=True)


def _temp(directory: Path) -> tuple[int, str]:
    name = directory / f".upload-{secrets.token_hex(8)}"
    return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), str(name)


class FileStore:
    def __init__(self, paths: Paths) -> None:
        self.files_dir = paths.data_dir / "files"
        self.batches_dir = paths.data_dir / "batches"

    # -- files ---------------------------------------------------------------------------------------------------------

    def file_path(self, file_id: str) -> Path:
        if not FILE_ID.fullmatch(file_id):
            raise ValueError(f"not a file id: {file_id[:80]!r}")
        self.files_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        return inside(self.files_dir, file_id, what=f"file {file_id}")

    def writing(self, limit: int) -> Writing:
        return Writing(self, limit)

    def write_file(self, file_id: str, lines: Iterator[bytes]) -> Stored:
        """A file written whole by Blazar (a batch's output): its lines, each ending in a newline."""
        w = self.writing(limit=1 << 62)
        try:
            for line in lines:
                w.write(line)
            return w.keep(file_id)
        finally:
            w.discard()

    def open_file(self, file_id: str) -> Path:
        return self.file_path(file_id)

    def remove_file(self, file_id: str) -> None:
        self.file_path(file_id).unlink(missing_ok=True)

    # -- a batch's own files -------------------------------------------------------------------------------------------

    def batch_dir(self, batch_id: str) -> Path:
        if not BATCH_ID.fullmatch(batch_id):
            raise ValueError(f"not a batch id: {batch_id[:80]!r}")
        self.batches_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        return inside(self.batches_dir, batch_id, what=f"batch {batch_id}")

    def link_input(self, batch_id: str, file_id: str) -> bool:
        """The batch's own name for its input file (a hard link: no copy; a copy where links are not to be had).
        True when it is a copy (more disk: its key's storage counts it)."""
        d = self.batch_dir(batch_id)
        (d / "lines").mkdir(mode=0o700, parents=True, exist_ok=True)
        target = d / "input.jsonl"
        source = self.file_path(file_id)
        if target.exists():
            return not os.path.samefile(source, target)
        try:
            os.link(source, target)
        except OSError:
            shutil.copyfile(source, target)
            return True
        return False

    def input_path(self, batch_id: str) -> Path:
        return self.batch_dir(batch_id) / "input.jsonl"

    def line_path(self, batch_id: str, index: int) -> Path:
        return self.batch_dir(batch_id) / "lines" / f"{int(index)}.json"

    def write_line(self, batch_id: str, index: int, data: bytes) -> None:
        """A line's result, durable before its event is recorded (a crash in between runs the line again, and this
        file is simply written again)."""
        path = self.line_path(batch_id, index)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)

    def read_line(self, batch_id: str, index: int) -> bytes | None:
        try:
            return self.line_path(batch_id, index).read_bytes()
        except FileNotFoundError:
            return None

    def remove_batch_work(self, batch_id: str) -> None:
        """The batch's working files, once its output files hold what they had."""
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.batch_dir(batch_id))
