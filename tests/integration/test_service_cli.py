"""`blazar service` end to end: the real CLI in a subprocess with HOME and XDG_CONFIG_HOME in tmp_path and a fake
`systemctl` first on PATH (a script that records its argv and keeps the unit's state): install writes the user unit
and enables and starts it, status reads it back (this install, this home, active), doctor warns when another home
asks, uninstall disables and removes it; and with no systemd to reach, install still writes the unit and prints the
commands to run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from blazar.cli.main import app as blazar_cli
from blazar.operations.service import systemd
from blazar.operations.service.target import this_install
from tests.conftest import Cli
from tests.support import cli_zygote
from tests.support.daemon import WAIT_S, free_port, healthy, wait_for

FAKE_SYSTEMCTL = """#!/bin/sh
# A stand-in for systemctl: each call's argv appended to $FAKE_SYSTEMCTL_LOG, the unit's state in a file beside it.
echo "$*" >> "$FAKE_SYSTEMCTL_LOG"
state="$FAKE_SYSTEMCTL_LOG.state"
if [ -n "$FAKE_SYSTEMCTL_NO_BUS" ]; then echo "Failed to connect to bus: No medium found" >&2; exit 1; fi
case "$*" in
  *is-active*) if [ -f "$state" ]; then echo active; exit 0; else echo inactive; exit 3; fi ;;
  *restart*|*start*) touch "$state" ;;
  *disable\\ --now*|*stop*) rm -f "$state" ;;
esac
exit 0
"""


@pytest.fixture
def service_cli(cli: Cli, tmp_path: Path) -> Cli:
    """The CLI with its user's home, config and PATH's systemctl all in tmp_path."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(FAKE_SYSTEMCTL)
    (bin_dir / "systemctl").chmod(0o755)
    cli.env.update({"HOME": str(tmp_path / "user"), "XDG_CONFIG_HOME": str(tmp_path / "user" / ".config"),
                    "PATH": f"{bin_dir}:{cli.env.get('PATH', '/usr/bin:/bin')}",
                    "FAKE_SYSTEMCTL_LOG": str(tmp_path / "systemctl.log")})
    return cli


def _calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "systemctl.log").read_text().splitlines()


def test_with_no_systemd_to_reach_install_writes_the_unit_and_prints_what_to_run(
        service_cli: Cli, home: Path, tmp_path: Path) -> None:
    service_cli.env["FAKE_SYSTEMCTL_NO_BUS"] = "1"
    done = service_cli("service", "install")
    unit = tmp_path / "user" / ".config" / "systemd" / "user" / "blazar.service"
    assert unit.is_file()
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"wrote: {unit} (user unit: runs ")
    assert "could not reach systemd (Failed to connect to bus: No medium found); run:" in done.stdout
    assert "  systemctl --user daemon-reload" in lines and "  systemctl --user enable --now blazar.service" in lines
    assert "loginctl enable-linger" in done.stdout
    assert _calls(tmp_path) == ["--user daemon-reload"]
    row = service_cli("service", "status", "--user", "--json").json()["services"][0]
    assert row["active"] is None and "could not reach systemd" in row["active_why"]


def test_install_status_doctor_and_uninstall_of_the_user_unit(service_cli: Cli, home: Path, tmp_path: Path) -> None:
    unit = tmp_path / "user" / ".config" / "systemd" / "user" / "blazar.service"
    installed = service_cli("service", "install", "--json").json()
    assert installed["path"] == str(unit) and installed["written"] is True and installed["todo"] == []
    assert installed["argv"] == [*this_install(sys.executable), "serve"]
    assert _calls(tmp_path) == ["--user daemon-reload", "--user is-active blazar.service",
                                "--user enable blazar.service", "--user restart blazar.service"]
    text = unit.read_text()
    assert f'Environment="BLAZAR_HOME={home}"' in text and f'ReadWritePaths="-{home}"' in text

    status = service_cli("service", "status", "--user", "--json")
    (row,) = status.json()["services"]
    assert status.code == 0 and row["installed"] and row["this_install"] and row["this_home"]
    assert row["active"] == "active" and row["home"] == str(home)

    elsewhere = Cli(tmp_path / "another home")
    elsewhere.env = {**service_cli.env, "BLAZAR_HOME": str(tmp_path / "another home")}
    report = elsewhere("doctor", "--json", check=False, timeout=120).json()
    (check,) = [c for c in report["checks"] if c["check"] == "machine.service"]
    assert check["status"] == "warn", check
    assert f"serves the home {home}, not this one ({tmp_path / 'another home'})" in check["observation"]
    assert "blazar service install" in check["fix"]
    assert elsewhere("service", "status", "--user", check=False).code == 1

    plain = service_cli("service", "uninstall")
    assert plain.stdout.startswith(f"removed: {unit}") and not unit.exists()
    assert _calls(tmp_path)[-2:] == ["--user disable --now blazar.service", "--user daemon-reload"]
    gone = service_cli("service", "status", "--user", "--json", check=False)
    assert gone.code == 1 and gone.json()["services"][0]["installed"] is False
    assert "nothing to remove" in service_cli("service", "uninstall").stdout


def test_service_explains_itself_and_refuses_both_scopes_at_once(service_cli: Cli) -> None:
    res = CliRunner().invoke(blazar_cli, ["service", "--help"], prog_name="blazar", env={"COLUMNS": "200"})
    assert res.exit_code == 0 and all(word in res.output for word in ("install", "uninstall", "status"))
    res = CliRunner().invoke(blazar_cli, ["service", "install", "--help"], prog_name="blazar", env={"COLUMNS": "200"})
    assert "--user" in res.output and "--system" in res.output
    both = service_cli("service", "install", "--user", "--system", check=False)
    assert both.code == 2 and both.stderr.startswith("error: --user and --system: choose one")


def test_the_units_own_command_serves_the_home_it_names_and_sigterm_stops_it_cleanly(
        service_cli: Cli, home: Path, tmp_path: Path) -> None:
    """What systemd would run, as it would run it (ExecStart's words, Environment=, HOME, a bare PATH, another
    working directory): the daemon for the unit's home; SIGTERM, systemd's stop, ends it with exit 0, which
    Restart=on-failure leaves stopped."""
    port = free_port()
    service_cli("config", "set", "server.port", str(port))
    service_cli("service", "install")
    unit = tmp_path / "user" / ".config" / "systemd" / "user" / "blazar.service"
    seen = systemd.read(unit.read_text(), user_home=str(tmp_path / "user"))
    program = this_install(sys.executable)
    assert seen.argv == (*program, "serve")
    env = {"HOME": str(tmp_path / "user"), "PATH": "/usr/bin:/bin", **seen.env}
    if os.environ.get("PYTHONPATH"):  # a checkout run without an editable install: the harness's, not systemd's
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    journal = tmp_path / "journal.log"
    # The zygote is this interpreter running blazar.cli.main, which is what `program` runs (its script's entry).
    proc: subprocess.Popen[bytes] | cli_zygote.Process
    if cli_zygote.enabled():
        proc = cli_zygote.start(list(seen.argv[len(program):]), env=env, stdout=journal, stderr=journal)
    else:
        with journal.open("wb") as sink:
            proc = subprocess.Popen(list(seen.argv), env=env, cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: healthy(port), "the service's daemon to answer /health", proc=proc)
        assert (home / "run" / "daemon.json").is_file()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT_S) == 0, journal.read_text()
        assert not (home / "run" / "daemon.json").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=WAIT_S)
