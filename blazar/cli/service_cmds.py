"""`blazar service install|uninstall|status [--user|--system]`: the daemon as a systemd unit (a user unit by default)
or a launchd agent on macOS (blazar/operations/service/). systemctl is run where it can reach a systemd; where it
cannot, the file is still written or removed and the commands to run are printed."""

from __future__ import annotations

import os
import sys
from typing import Any

import typer
from rich.text import Text

from blazar.adapters.systemctl import Ran, systemctl
from blazar.cli.common import JSON_OPTION, out, print_json
from blazar.errors import ServiceError
from blazar.operations.doctor.machine import see_daemon
from blazar.operations.service import manage
from blazar.operations.service.scope import Setup, pick, setup
from blazar.operations.service.target import Scope

app = typer.Typer(help="Run the daemon as a service: a systemd unit (a user unit by default; --system for one that "
                  "starts at boot as you) or, on macOS, a launchd agent.", no_args_is_help=True)

USER_OPTION = typer.Option(False, "--user", help="This user's unit (the default): "
                           "~/.config/systemd/user/blazar.service, started with your session manager.")
SYSTEM_OPTION = typer.Option(False, "--system", help="A system unit, /etc/systemd/system/blazar.service, started at "
                             "boot and run as the user behind sudo (needs root: sudo).")


def _setup(user: bool, system: bool, *, writing: bool, scope: Scope | None = None) -> Setup:
    return setup(scope or pick(user, system), os.environ, executable=sys.executable, platform=sys.platform,
                 euid=os.geteuid(), writing=writing)


def _ran(ran: tuple[Ran, ...]) -> list[dict[str, Any]]:
    return [{"command": r.command, "exit_code": r.code, "output": r.output} for r in ran]


def _say(line: str) -> None:
    out.print(Text(line), soft_wrap=True)


def _report(s: Setup, done: manage.Done, verb: str) -> dict[str, Any]:
    return {"scope": s.place.scope, "kind": s.place.kind, "path": str(s.place.path), verb: done.changed,
            "ran": _ran(done.ran), "todo": list(done.todo), "why_todo": done.why_todo or None}


def _print_ran(done: manage.Done) -> None:
    """The systemctl calls that changed something (is-active only asked), then what is left to run."""
    for r in done.ran:
        if r.argv[-2:] != ("is-active", manage.UNIT_NAME):
            _say(f"ran: {r.command}" + ("" if r.ok else f" (exit {r.code}: {r.output})"))
    if done.todo:
        _say(f"{done.why_todo}; run:")
        for cmd in done.todo:
            _say(f"  {cmd}")


@app.command("install")
def install(user: bool = USER_OPTION, system: bool = SYSTEM_OPTION, as_json: bool = JSON_OPTION) -> None:
    """Write the unit for this install and this home (hardened: read-only system, the home writable, a private
    /tmp, restarted on failure, the engines stopped with the daemon), then `systemctl daemon-reload`, `enable` and
    `restart` it. Installing again rewrites it (after a move of the home or the install) and restarts it, unless it
    is unchanged and running. Without a reachable systemd the file is still written and the commands are printed.
    On macOS: the launchd agent, and the launchctl command that loads it."""
    s = _setup(user, system, writing=True)
    if s.place.scope == "user":
        s.paths.ensure()  # the service could not make it: under ProtectSystem=strict only what exists is writable
    elif not s.paths.data_dir.is_dir():
        raise ServiceError(f"the home {s.paths.data_dir} does not exist yet: run `blazar list` once as "
                                  f"{s.target.user} to make it, then install again")
    seen = see_daemon(s.paths)
    done = manage.install(s.target, s.place, systemctl, daemon_pid=seen.holder if seen.live else None, uid=s.uid)
    if as_json:
        print_json({**_report(s, done, "written"), "argv": list(s.target.argv), "home": str(s.paths.data_dir)})
        return
    kind = {"systemd": f"{s.place.scope} unit", "launchd": "launchd agent"}[s.place.kind]
    _say(f"{'wrote' if done.changed else 'unchanged'}: {s.place.path} ({kind}: runs {' '.join(s.target.argv)} for "
         f"the home {s.paths.data_dir})")
    _print_ran(done)
    if s.place.kind == "systemd" and not done.todo:
        flag = " --user" if s.place.scope == "user" else ""
        _say(f"running: `systemctl{flag} status blazar`; its output: `journalctl{flag} -u blazar -f`")
    if s.place.kind == "systemd" and s.place.scope == "user":
        _say("a user unit starts with your session; to start it at boot without a login: "
             "`loginctl enable-linger $USER`")


@app.command("uninstall")
def uninstall(user: bool = USER_OPTION, system: bool = SYSTEM_OPTION, as_json: bool = JSON_OPTION) -> None:
    """Stop and disable the service, remove its file (found at its fixed place), and reload systemd. Nothing
    installed: nothing to do (exit 0)."""
    s = _setup(user, system, writing=True)
    done = manage.uninstall(s.place, systemctl, uid=s.uid)
    if as_json:
        print_json(_report(s, done, "removed"))
        return
    _say(f"removed: {s.place.path}" if done.changed else f"nothing to remove: no {s.place.path}")
    _print_ran(done)


@app.command("status")
def status(user: bool = USER_OPTION, system: bool = SYSTEM_OPTION, as_json: bool = JSON_OPTION) -> None:
    """Whether a service is installed (the user unit and the system unit, unless one is asked for), what it runs,
    whether that is this install and this home, and whether systemd says it is active. Exit 0 when one is installed
    and every installed one runs this install for this home, else 1."""
    scopes: tuple[Scope, ...] = (pick(user, system),) if user or system else ("user", "system")
    rows: list[dict[str, Any]] = []
    for scope in scopes:
        try:
            s = _setup(user, system, writing=False, scope=scope)
        except ServiceError:
            if len(scopes) == 1:
                raise
            continue  # macOS has no system unit of ours
        f = manage.look(s.place, s.target, s.paths, systemctl, user_home=s.user_home)
        rows.append({"scope": scope, "path": str(s.place.path), "installed": f is not None,
                     "argv": list(f.argv) if f else None, "home": f.home if f else None,
                     "this_install": f.same_install if f else None, "this_home": f.same_home if f else None,
                     "active": f.active if f else None, "active_why": (f.active_why or None) if f else None})
    installed = [r for r in rows if r["installed"]]
    code = 0 if installed and all(r["this_install"] and r["this_home"] for r in installed) else 1
    if as_json:
        print_json({"services": rows, "points_here": code == 0})
    else:
        for r in rows:
            if not r["installed"]:
                _say(f"{r['scope']}: not installed ({r['path']})")
                continue
            where = [("this install" if r["this_install"] else "ANOTHER install"),
                     ("this home" if r["this_home"] else f"ANOTHER home ({r['home']})")]
            state = r["active"] or f"state unknown: {r['active_why']}"
            _say(f"{r['scope']}: {r['path']}: runs {' '.join(r['argv'] or ['nothing'])}; {', '.join(where)}; {state}")
    raise typer.Exit(code)

