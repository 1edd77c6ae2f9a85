"""The service's files: the systemd unit as rendered (its hardening, its quoting of awkward paths, read back as
written) and checked by the real `systemd-analyze verify` for a user and a system unit; what this install is (the
console script beside the interpreter, else `python -m`); and the launchd plist through plistlib."""

from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
from pathlib import Path

import pytest

from blazar.errors import ServiceError
from blazar.operations.service import launchd, systemd
from blazar.operations.service.target import Target, home_env, home_of, target, this_install
from blazar.paths import Paths

# A directory name with what systemd's unit syntax treats specially: a space, a specifier, a variable, a quote.
AWKWARD = 'my home %h $HOME "q"'


def _script(path: Path, shebang: str = "#!/bin/sh") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{shebang}\nexit 0\n")
    path.chmod(0o755)
    return path


def _target(tmp_path: Path, home: str = "home", *, bin_dir: str = "venv/bin", user: str | None = None) -> Target:
    _script(tmp_path / bin_dir / "blazar")
    paths = Paths.from_env({"BLAZAR_HOME": str(tmp_path / home)})
    return target(paths, {"BLAZAR_HOME": "set"}, executable=str(tmp_path / bin_dir / "python"),
                  archive=paths.archive, user=user)


def _lines(unit: str) -> set[str]:
    return {line for line in unit.splitlines() if line and not line.startswith("#")}


def test_the_user_unit_runs_this_install_for_this_home_hardened_and_restarted_on_failure() -> None:
    t = Target(argv=("/opt/blazar/bin/blazar", "serve"), env=(("BLAZAR_HOME", "/home/alice/blazar"),),
               writable=("/home/alice/blazar", "/srv/archive"), log_dir="/home/alice/blazar/log")
    unit = systemd.render(t, "user")
    assert {'ExecStart="/opt/blazar/bin/blazar" "serve"', 'Environment="BLAZAR_HOME=/home/alice/blazar"',
            "Type=exec", "Restart=on-failure", "RestartSec=5", "KillMode=mixed", "TimeoutStopSec=90",
            "NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes",
            'ReadWritePaths="-/home/alice/blazar" "-/srv/archive"', "WantedBy=default.target"} <= _lines(unit)
    # What would take the GPUs or the engines' memory away from llama-server is not there.
    for absent in ("PrivateDevices", "DeviceAllow", "ProtectClock", "MemoryDenyWriteExecute", "NoExecPaths", "User="):
        assert absent not in unit
    system = systemd.render(Target(**{**_fields(t), "user": "alice"}), "system")
    assert {"User=alice", "WantedBy=multi-user.target", "After=network-online.target",
            "CapabilityBoundingSet="} <= _lines(system)


def test_a_home_in_the_shared_tmp_gets_no_private_tmp_which_would_hide_it() -> None:
    t = Target(argv=("/opt/b/blazar", "serve"), env=(("BLAZAR_HOME", "/var/tmp/b"),), writable=("/var/tmp/b",),
               log_dir="/var/tmp/b/log")
    unit = systemd.render(t, "user")
    assert "PrivateTmp=yes" not in unit
    assert "# No PrivateTmp: /var/tmp/b is in the shared /tmp, which a private one would hide." in unit
    assert "PrivateTmp=yes" in systemd.render(Target(**{**_fields(t), "writable": ("/var/tmpfoo",)}), "user")


def _fields(t: Target) -> dict[str, object]:
    return {"argv": t.argv, "env": t.env, "writable": t.writable, "log_dir": t.log_dir, "user": t.user}


def test_an_awkward_home_and_install_path_read_back_exactly_as_written(tmp_path: Path) -> None:
    t = _target(tmp_path, f"{AWKWARD}/home", bin_dir="my venv %i $X/bin")
    t = Target(argv=(*t.argv, "--arg $VAR 100%"), env=t.env, writable=t.writable, log_dir=t.log_dir)
    unit = systemd.render(t, "user")
    seen = systemd.read(unit, user_home="/home/someone")
    assert seen.argv == t.argv
    assert seen.env == {"BLAZAR_HOME": f"{tmp_path}/{AWKWARD}/home"}
    assert "$$VAR 100%%" in unit and "%%h" in unit  # an argument's variable and every specifier escaped


def test_a_hand_edited_unit_is_read_as_systemd_reads_it() -> None:
    text = "\n".join([
        "[Unit]", "Environment=BLAZAR_HOME=/not/the/service/section",
        "[Service]", "# ExecStart=/commented/out", "Environment=BLAZAR_HOME=/dropped",
        "Environment=", "Environment=XDG_DATA_HOME=%h/data 'XDG_CONFIG_HOME=/etc/b z'",
        "ExecStart=-/opt/b\\x20z/blazar \\", "  serve", "User=bob"])
    seen = systemd.read(text, user_home="/home/bob")
    assert seen.argv == ("/opt/b z/blazar", "serve")
    assert seen.env == {"XDG_DATA_HOME": "/home/bob/data", "XDG_CONFIG_HOME": "/etc/b z"}
    assert seen.user == "bob"
    assert home_of(seen.env, "/home/bob").data_dir == Path("/home/bob/data/blazar")


def test_what_systemd_cannot_hold_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    quoted = _target(tmp_path, bin_dir='a"b/bin')
    with pytest.raises(ServiceError, match="quote or a backslash"):
        systemd.render(quoted, "user")
    newline = _target(tmp_path, "home\nExecStartPre=/bin/evil")
    with pytest.raises(ServiceError, match="control character"):
        systemd.render(newline, "user")


def _verify(unit: Path, *, user: bool, runtime: Path) -> subprocess.CompletedProcess[str]:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        if os.environ.get("BLAZAR_REQUIRE_SYSTEMD") == "1":
            pytest.fail("systemd-analyze is required here (BLAZAR_REQUIRE_SYSTEMD=1): apt-get install systemd")
        pytest.skip("systemd-analyze is not installed (the systemd package); CI installs it")
    runtime.mkdir(mode=0o700, exist_ok=True)
    argv = [analyze, *(["--user"] if user else []), "verify", "--man=no", str(unit)]
    # A user manager's runtime directory is where `--user` looks; no running systemd is needed.
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=unit.parent,
                          env={**os.environ, "XDG_RUNTIME_DIR": str(runtime), "SYSTEMD_LOG_LEVEL": "notice"})


@pytest.mark.parametrize("scope", ["user", "system"])
def test_systemd_analyze_verifies_the_unit_without_a_word_even_for_an_awkward_home(tmp_path: Path, scope: str) -> None:
    t = _target(tmp_path, f"{AWKWARD}/home", bin_dir="my venv %i $X/bin", user="root")
    Path(t.writable[0]).mkdir(parents=True)
    unit = tmp_path / "units" / "blazar.service"
    unit.parent.mkdir()
    # Both shapes: the home in the shared /tmp (as tmp_path is), and elsewhere (with PrivateTmp).
    for writable in (t.writable, ("/srv/blazar home %h",)):
        text = systemd.render(Target(**{**_fields(t), "writable": writable}), "system" if scope == "system" else "user")
        unit.write_text(text)
        done = _verify(unit, user=scope == "user", runtime=tmp_path / "runtime")
        assert (done.returncode, done.stdout + done.stderr) == (0, ""), text
    assert "PrivateTmp=yes" in text
    # The check has teeth: ExecStart's program is looked up, through the same quoting.
    os.unlink(t.argv[0])
    broken = _verify(unit, user=scope == "user", runtime=tmp_path / "runtime")
    assert broken.returncode != 0 and "is not executable" in broken.stdout + broken.stderr


def test_this_install_is_the_script_beside_the_interpreter_else_the_interpreter_with_dash_m(tmp_path: Path) -> None:
    python = tmp_path / "venv" / "bin" / "python"
    assert this_install(str(python)) == (str(python), "-m", "blazar.cli.main")
    script = _script(tmp_path / "venv" / "bin" / "blazar", shebang=f"#!{tmp_path}/moved/venv/bin/python")
    assert this_install(str(python)) == (str(python), "-m", "blazar.cli.main")  # a moved venv's script
    _script(script, shebang="#!/bin/sh")
    assert this_install(str(python)) == (str(script),)
    script.chmod(0o644)
    assert this_install(str(python)) == (str(python), "-m", "blazar.cli.main")


def test_the_home_is_named_so_the_service_finds_it_whatever_its_home_directory(tmp_path: Path) -> None:
    xdg = {"HOME": str(tmp_path / "u"), "XDG_DATA_HOME": str(tmp_path / "data")}
    paths = Paths.from_env(xdg)
    env = dict(home_env(paths, xdg))
    assert env == {"XDG_CONFIG_HOME": str(tmp_path / "u" / ".config"), "XDG_DATA_HOME": str(tmp_path / "data")}
    assert home_of(env, "/somewhere/else") == paths
    archive = tmp_path / "elsewhere" / "archive"
    t = target(paths, xdg, executable=str(tmp_path / "python"), archive=archive)
    assert t.writable == (str(paths.config_dir), str(paths.data_dir), str(archive))


def test_the_launchd_agent_round_trips_through_plistlib(tmp_path: Path) -> None:
    t = _target(tmp_path, AWKWARD)
    data = launchd.render(t)
    plist = plistlib.loads(data)
    assert plist["Label"] == "dev.blazar"
    assert plist["ProgramArguments"] == [f"{tmp_path}/venv/bin/blazar", "serve"]
    assert plist["EnvironmentVariables"] == {"BLAZAR_HOME": f"{tmp_path}/{AWKWARD}"}
    assert plist["KeepAlive"] == {"SuccessfulExit": False} and plist["RunAtLoad"] is True
    assert plist["StandardErrorPath"] == f"{tmp_path}/{AWKWARD}/log/service.err.log"
    seen = launchd.read(data)
    assert (seen.argv, seen.env) == (t.argv, dict(t.env))
    assert launchd.read(b"not a plist").argv == ()
