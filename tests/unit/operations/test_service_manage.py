"""`blazar service`'s decisions against a fake systemctl (its calls seen, its answers chosen) and unit places in
tmp_path: install reloads, enables and (re)starts; no reachable systemd still writes the file and says what to run;
a daemon already serving the home is not started beside; uninstall disables and removes; the place of each scope and
platform, root for a system unit, the user behind sudo; and doctor's check of an installed unit."""

from __future__ import annotations

import pwd
from pathlib import Path

import pytest

from blazar.adapters.systemctl import Ran
from blazar.errors import ServiceError
from blazar.operations.doctor.service import service
from blazar.operations.service import manage
from blazar.operations.service.manage import Place, install, look, place, uninstall
from blazar.operations.service.scope import invoking_user, pick, setup
from blazar.operations.service.target import Target, target
from blazar.paths import Paths

BUS_ERROR = "Failed to connect to bus: No medium found"


class FakeSystemctl:
    """Records each call; `reachable=False` answers as systemctl does with no user bus; `active` is is-active's."""

    def __init__(self, *, reachable: bool = True, active: str = "inactive") -> None:
        self.calls: list[tuple[str, ...]] = []
        self.reachable, self.active = reachable, active

    def __call__(self, *args: str, user: bool) -> Ran:
        argv = ("systemctl", *(("--user",) if user else ()), *args)
        self.calls.append(argv[1:])
        if not self.reachable:
            return Ran(argv, 1, BUS_ERROR)
        if args[0] == "is-active":
            return Ran(argv, 0 if self.active == "active" else 3, self.active)
        return Ran(argv, 0, "")


def _this(tmp_path: Path, home: str = "home") -> tuple[Target, Paths]:
    paths = Paths.from_env({"BLAZAR_HOME": str(tmp_path / home)})
    return target(paths, {"BLAZAR_HOME": "set"}, executable="/opt/blazar/bin/python", archive=paths.archive), paths


def _user_place(tmp_path: Path) -> Place:
    return Place("user", tmp_path / "config" / "systemd" / "user" / "blazar.service", "systemd")


def test_install_writes_the_unit_then_reloads_enables_and_restarts_and_a_second_install_changes_nothing(
        tmp_path: Path) -> None:
    t, paths = _this(tmp_path)
    where, ctl = _user_place(tmp_path), FakeSystemctl()
    done = install(t, where, ctl, daemon_pid=None, uid=1000)
    assert done.changed and done.todo == ()
    assert ctl.calls == [("--user", "daemon-reload"), ("--user", "is-active", "blazar.service"),
                         ("--user", "enable", "blazar.service"), ("--user", "restart", "blazar.service")]
    assert oct(where.path.stat().st_mode & 0o777) == "0o644"
    assert not [p for p in where.path.parent.iterdir() if p.name != "blazar.service"]  # no temporary left
    running = FakeSystemctl(active="active")
    again = install(t, where, running, daemon_pid=1234, uid=1000)  # the running daemon is the service's own
    assert not again.changed and again.todo == ()
    assert ("--user", "restart", "blazar.service") not in running.calls  # the same unit: not restarted for nothing
    older = FakeSystemctl(active="active")
    where.path.write_text(where.path.read_text().replace("TimeoutStopSec=90", "TimeoutStopSec=30"))
    assert install(t, where, older, daemon_pid=1234, uid=1000).changed
    assert older.calls[-1] == ("--user", "restart", "blazar.service")  # a changed unit restarts the service
    found = look(where, t, paths, FakeSystemctl(active="active"), user_home="/home/u")
    assert found is not None and found.points_here and found.active == "active"


def test_without_a_reachable_systemd_the_unit_is_written_and_the_commands_are_left_to_run(tmp_path: Path) -> None:
    t, _ = _this(tmp_path)
    where, ctl = _user_place(tmp_path), FakeSystemctl(reachable=False)
    done = install(t, where, ctl, daemon_pid=None, uid=1000)
    assert where.path.is_file() and done.changed
    assert ctl.calls == [("--user", "daemon-reload")]
    assert done.todo == ("systemctl --user daemon-reload", "systemctl --user enable --now blazar.service")
    assert BUS_ERROR in done.why_todo


def test_a_daemon_already_serving_the_home_is_not_doubled_the_unit_is_enabled_and_the_stop_is_named(
        tmp_path: Path) -> None:
    t, _ = _this(tmp_path)
    ctl = FakeSystemctl()
    done = install(t, _user_place(tmp_path), ctl, daemon_pid=4242, uid=1000)
    assert ("--user", "restart", "blazar.service") not in ctl.calls
    assert ("--user", "enable", "blazar.service") in ctl.calls
    assert done.todo == ("kill -TERM 4242", "systemctl --user start blazar.service")


def test_uninstall_disables_stops_removes_and_reloads_and_nothing_installed_is_nothing_done(tmp_path: Path) -> None:
    t, _ = _this(tmp_path)
    where = _user_place(tmp_path)
    install(t, where, FakeSystemctl(), daemon_pid=None, uid=1000)
    ctl = FakeSystemctl()
    done = uninstall(where, ctl, uid=1000)
    assert done.changed and not where.path.exists()
    assert ctl.calls == [("--user", "disable", "--now", "blazar.service"), ("--user", "daemon-reload")]
    assert uninstall(where, FakeSystemctl(), uid=1000) == manage.Done(where, False)


def test_uninstall_without_systemd_removes_the_unit_and_its_enable_link_and_says_what_to_run(tmp_path: Path) -> None:
    t, _ = _this(tmp_path)
    where = _user_place(tmp_path)
    install(t, where, FakeSystemctl(reachable=False), daemon_pid=None, uid=1000)
    wants = where.path.parent / "default.target.wants" / "blazar.service"
    wants.parent.mkdir()
    wants.symlink_to(where.path)  # as a `systemctl --user enable` run by hand leaves it
    done = uninstall(where, FakeSystemctl(reachable=False), uid=1000)
    assert not where.path.exists() and not wants.is_symlink()
    assert done.todo == ("systemctl --user stop blazar.service", "systemctl --user daemon-reload")


def test_the_launchd_agent_is_written_and_launchctl_is_left_to_the_user(tmp_path: Path) -> None:
    t, _ = _this(tmp_path)
    where = place("user", platform="darwin", config_home=None, user_home=str(tmp_path))
    assert where.path == tmp_path / "Library" / "LaunchAgents" / "dev.blazar.plist"
    ctl = FakeSystemctl()
    done = install(t, where, ctl, daemon_pid=None, uid=501)
    assert ctl.calls == [] and done.todo == (f"launchctl bootstrap gui/501 {where.path}",)
    assert install(t, where, ctl, daemon_pid=None, uid=501).todo[0] == "launchctl bootout gui/501/dev.blazar"
    found = look(where, t, _this(tmp_path)[1], None, user_home=str(tmp_path))
    assert found is not None and found.points_here
    assert uninstall(where, ctl, uid=501).todo == ("launchctl bootout gui/501/dev.blazar",)
    assert not where.path.exists()


def test_each_scope_has_its_place_and_what_a_platform_cannot_do_is_a_clear_error(tmp_path: Path) -> None:
    assert place("user", platform="linux", config_home=str(tmp_path / "xdg"), user_home="/home/u").path == \
        tmp_path / "xdg" / "systemd" / "user" / "blazar.service"
    assert place("user", platform="linux", config_home=None, user_home="/home/u").path == \
        Path("/home/u/.config/systemd/user/blazar.service")
    assert place("system", platform="linux", config_home=None, user_home="/home/u").path == \
        Path("/etc/systemd/system/blazar.service")
    with pytest.raises(ServiceError, match="system-wide daemon is not supported"):
        place("system", platform="darwin", config_home=None, user_home="/Users/u")
    with pytest.raises(ServiceError, match="this platform is win32"):
        place("user", platform="win32", config_home=None, user_home="C:/Users/u")
    with pytest.raises(ServiceError, match="choose one"):
        pick(True, True)


def test_a_system_unit_needs_root_and_runs_as_the_user_behind_sudo(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "BLAZAR_HOME": str(tmp_path / "home")}
    with pytest.raises(ServiceError, match="needs root"):
        setup("system", env, executable="/x/python", platform="linux", euid=1000, writing=True)
    other = next(p for p in pwd.getpwall() if p.pw_uid != 0)  # a user that is not root, whoever runs the tests
    looked = setup("system", env, executable="/x/python", platform="linux", euid=other.pw_uid, writing=False)
    assert looked.place.path == Path("/etc/systemd/system/blazar.service")  # status needs no root
    assert looked.target.user == other.pw_name
    assert invoking_user({"SUDO_USER": other.pw_name}, 0).pw_name == other.pw_name
    assert invoking_user({"SUDO_USER": "no-such-user-here"}, 0).pw_uid == 0
    assert invoking_user({"SUDO_USER": "root"}, other.pw_uid).pw_uid == other.pw_uid  # not root: no sudo in play
    as_root = setup("system", env, executable="/x/python", platform="linux", euid=0, writing=True)
    assert as_root.target.user == "root" and as_root.paths.data_dir == tmp_path / "home"


def test_doctor_says_nothing_is_installed_then_ok_then_warns_about_another_home_and_install(tmp_path: Path) -> None:
    t, paths = _this(tmp_path)
    env = {"HOME": str(tmp_path / "u"), "XDG_CONFIG_HOME": str(tmp_path / "config"), "BLAZAR_HOME": "set"}
    check = service(paths, env, executable="/opt/blazar/bin/python", platform="linux")
    if Path("/etc/systemd/system/blazar.service").exists():
        pytest.skip("this machine has a system unit of Blazar installed")
    assert (check.status, check.observation) == ("ok", "no Blazar service is installed (neither a user nor a "
                                                       "system unit)")
    install(t, _user_place(tmp_path), FakeSystemctl(), daemon_pid=None, uid=1000)
    assert service(paths, env, executable="/opt/blazar/bin/python", platform="linux").status == "ok"
    other = Paths.from_env({"BLAZAR_HOME": str(tmp_path / "other")})
    moved = service(other, env, executable="/usr/local/bin/python", platform="linux")
    assert moved.status == "warn" and moved.id == "machine.service"
    assert f"serves the home {paths.data_dir}, not this one ({other.data_dir})" in moved.observation
    assert "runs /opt/blazar/bin/python -m blazar.cli.main serve, not this install (/usr/local/bin/python" \
        in moved.observation
    assert moved.fix is not None and "`blazar service install`" in moved.fix
