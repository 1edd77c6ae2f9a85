"""A batch's input file, read from disk a line at a time and never held whole (blazar/serving/batches.py runs it):
validation streams it once, keeping each request line's byte offset (8 bytes a line); the runner reads a line again,
by its offset, when the line runs. The content store never rewrites a file in place (a new file is a new name), so
an offset stays true for as long as the batch's link to its input exists.

A line is what OpenAI's Batch API calls one: the bytes between two newlines (b"\\n"); a line of only whitespace is
blank, no request, and still counted in the 1-based line numbers an error names.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

CHUNK = 1 << 20
# What bytes.strip() keeps: a line with one of these is not blank. Searched for at C speed, so a run of blank lines
# (a file of nothing but newlines) costs no Python step per line.
_NOT_SPACE = re.compile(rb"[^ \t\n\r\x0b\x0c]")


@dataclass(frozen=True, slots=True)
class Span:
    """One request line: its 1-based number in the file, its byte offset and length (the newline not counted), and
    its bytes, or None when it is longer than the reader's `keep` bound (the bytes past it are never held)."""

    number: int
    offset: int
    length: int
    data: bytes | None


class _Open:
    """The line being read across chunks: where it began, how long it is so far, whether it holds anything but
    whitespace, and its bytes while they are within `keep`."""

    __slots__ = ("blank", "kept", "length", "number", "offset", "over")

    def __init__(self, number: int, offset: int) -> None:
        self.number, self.offset = number, offset
        self.length, self.blank, self.over = 0, True, False
        self.kept = bytearray()

    def add(self, part: bytes, keep: int) -> None:
        if self.blank and _NOT_SPACE.search(part):
            self.blank = False
        self.length += len(part)
        if not self.over:
            if len(self.kept) + len(part) > keep:
                self.over = True
                self.kept = bytearray()
            else:
                self.kept += part

    def span(self) -> Span:
        return Span(self.number, self.offset, self.length, None if self.over else bytes(self.kept))


def spans(handle: BinaryIO, keep: int) -> Iterator[Span]:
    """Every line of `handle` that is not blank, in order, read a chunk at a time: memory is one chunk and at most
    `keep` bytes of one line, whatever the file holds (one line of 100 MiB, or 100 million blank ones)."""
    pos = 0  # the file offset of `chunk`
    line = _Open(1, 0)
    while chunk := handle.read(CHUNK):
        end = chunk.find(b"\n")
        if end < 0:  # the open line goes on past this chunk
            line.add(chunk, keep)
            pos += len(chunk)
            continue
        line.add(chunk[:end], keep)
        if not line.blank:
            yield line.span()
        number = line.number + 1
        start = end + 1  # a line starts here, inside this chunk
        last = chunk.rfind(b"\n")  # the lines between start and last end inside this chunk
        while start <= last and (m := _NOT_SPACE.search(chunk, start, last)) is not None:
            begin = chunk.rfind(b"\n", start, m.start()) + 1 or start
            stop = chunk.find(b"\n", m.start(), last + 1)
            number += chunk.count(b"\n", start, begin)
            length = stop - begin
            yield Span(number, pos + begin, length, chunk[begin:stop] if length <= keep else None)
            number += 1
            start = stop + 1
        if start <= last:
            number += chunk.count(b"\n", start, last + 1)
        line = _Open(number, pos + last + 1)
        line.add(chunk[last + 1:], keep)
        pos += len(chunk)
    if not line.blank:
        yield line.span()


def index(path: Path) -> array[int]:
    """The byte offset of every request line of the file (what validation kept, found again after a restart)."""
    offsets = array("q")
    with path.open("rb") as handle:
        for span in spans(handle, keep=0):
            offsets.append(span.offset)
    return offsets


def read_line(path: Path, offset: int, max_bytes: int) -> bytes | None:
    """The line of the file that starts at `offset`, its newline dropped; None when it is longer than `max_bytes`."""
    with path.open("rb") as handle:
        return read_at(handle, offset, max_bytes)


def read_at(handle: BinaryIO, offset: int, max_bytes: int) -> bytes | None:
    """The line that starts at `offset`, its newline dropped; None when it is longer than `max_bytes` (nothing more
    than `max_bytes` + 1 bytes is read)."""
    handle.seek(offset)
    raw = handle.readline(max_bytes + 1)
    data = raw[:-1] if raw.endswith(b"\n") else raw
    return None if len(data) > max_bytes else data
