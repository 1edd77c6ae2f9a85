"""`blazar launch [--model M] -- CMD ...`: run a command pointed at this gateway (OPENAI_*, ANTHROPIC_*, OLLAMA_*),
starting the daemon when none runs, with a short-lived scoped key while keys are on (blazar/operations/launch.py),
revoked when the command exits; signals to launch are passed on to the command, its exit code is launch's."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from types import FrameType
from typing import Annotated, Any

import httpx2
import typer

from blazar.bootstrap import paths_from_env
from blazar.cli.common import err, opened, run
from blazar.cli.daemon_client import (
    HEALTH_TIMEOUT_S,
    AdminClient,
    auth_headers,
    daemon_log,
    find_daemon,
    start_daemon,
    verify_of,
)
from blazar.daemon_file import DaemonInfo
from blazar.errors import DaemonUnavailable, KeyCommandError, RemoteError
from blazar.operations import launch as handlers
from blazar.paths import Paths

_VERBATIM: dict[str, Any] = {"markup": False, "emoji": False}
READY_TIMEOUT_S = 120.0
# One /ready may run the engine's smoke generation (up to 30 s) before it answers.
READY_CALL_TIMEOUT_S = 45.0
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
# A terminal sends these to its whole foreground process group, the command included: passing them on again
# would deliver them twice (a second Ctrl-C means "quit now" to many tools).
FROM_TERMINAL = (signal.SIGINT, signal.SIGQUIT)


class Forwarder:
    """While the command runs, a signal to launch goes on to it (launch then waits for it to exit and revokes the
    key). Before it runs, a signal ends launch through KeyboardInterrupt, so the key is revoked on the way out."""

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.received: int | None = None
        self.shielded = False
        self._before: dict[int, Any] = {}

    def __enter__(self) -> Forwarder:
        for sig in FORWARDED:
            self._before[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._before.items():
            if handler is not None:  # None: a handler not set from Python, which cannot be put back
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        child = self.child
        if self.shielded:
            return
        if child is None:
            raise KeyboardInterrupt
        if child.poll() is None and not (signum in FROM_TERMINAL and _terminal_delivers_to_us()):
            child.send_signal(signum)


def _terminal_delivers_to_us() -> bool:
    """True when our process group is the foreground one of our terminal: a Ctrl-C reached the command already."""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:
            continue
    return False


def _daemon(paths: Paths, ready_timeout_s: float) -> DaemonInfo:
    info = find_daemon(paths)
    if info is not None:
        return info
    err.print(f"blazar launch: no daemon is running: starting one in the background (it keeps running after the "
              f"command; its log: {daemon_log(paths)})", **_VERBATIM)
    info = start_daemon(paths, os.environ)
    _wait_ready(info, paths, ready_timeout_s)
    err.print(f"blazar launch: daemon started on {info.url} (pid {info.pid}); stop it with `kill {info.pid}`",
              **_VERBATIM)
    return info


def _wait_ready(info: DaemonInfo, paths: Paths, timeout_s: float) -> None:
    """GET /ready until it answers 200 (an engine is active and generates here), at most `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    detail = "no answer yet"
    with httpx2.Client(base_url=info.url, trust_env=False, verify=verify_of(info), headers=auth_headers(paths),
                       timeout=httpx2.Timeout(READY_CALL_TIMEOUT_S, connect=HEALTH_TIMEOUT_S)) as http:
        while time.monotonic() < deadline:
            try:
                r = http.get("/ready")
            except httpx2.TransportError as e:
                detail = f"no answer: {e}"
            else:
                if r.status_code == 200:
                    return
                detail = _not_ready(r)
                if "engine" in detail:  # no engine active: waiting will not install one
                    break
            time.sleep(0.5)
    raise DaemonUnavailable(f"the daemon at {info.url} (pid {info.pid}) started but is not ready ({detail}); it is "
                            f"left running; its log: {daemon_log(paths)}; `blazar engine list` shows the engines")


def _not_ready(r: httpx2.Response) -> str:
    try:
        checks = r.json()["checks"]
        failed = {name: c for name, c in checks.items() if not c.get("ok")}
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"/ready answered {r.status_code}"
    return "; ".join(f"{name}: {c.get('detail') or c}" for name, c in failed.items()) or f"/ready {r.status_code}"


def _mint(command: str, model: str | None, expires: str) -> tuple[handlers.Target | None, handlers.LaunchKey | None]:
    async def go() -> tuple[handlers.Target | None, handlers.LaunchKey | None]:
        async with opened() as app:
            target = handlers.pick_model(app.runner.state("catalog"), model)
            return target, await handlers.mint(app, command, target, expires=expires)

    return run(go())


def _revoke(info: DaemonInfo, paths: Paths, name: str) -> None:
    async def go() -> None:
        async with opened() as app:
            await handlers.revoke(app, name)

    try:
        run(go())
    except KeyCommandError as e:  # revoked by hand meanwhile: nothing left to do
        err.print(f"blazar launch: {e.message}", **_VERBATIM)
        return
    try:
        _sync(info, paths)
    except (DaemonUnavailable, RemoteError) as e:
        err.print(f"blazar launch: the daemon was not told of the revocation at once ({e.message}); it folds it "
                  "within a second", **_VERBATIM)
    err.print(f"blazar launch: revoked key {name}", **_VERBATIM)


def _sync(info: DaemonInfo, paths: Paths) -> None:
    """The daemon folds the key's event now, not within its poll interval: the key works (or stops) at once."""
    with AdminClient(info, paths=paths) as client:
        client.sync()


def _run_command(argv: list[str], env: dict[str, str], forwarder: Forwarder) -> int:
    try:
        forwarder.child = subprocess.Popen(argv, env=env)
    except (FileNotFoundError, NotADirectoryError):
        err.print(f"blazar launch: command not found: {argv[0]}", **_VERBATIM)
        return handlers.NOT_FOUND_EXIT
    except OSError as e:
        err.print(f"blazar launch: cannot run {argv[0]}: {e.strerror or e}", **_VERBATIM)
        return handlers.NOT_EXECUTABLE_EXIT
    return handlers.exit_code_of(forwarder.child.wait())


def launch(
    command: Annotated[list[str], typer.Argument(
        metavar="-- CMD [ARG]...", show_default=False,
        help="The command to run and its arguments (after --, so its own options stay its own).")],
    model: Annotated[str | None, typer.Option(
        "--model", "-m", help="The model the command should use: sets OPENAI_MODEL and ANTHROPIC_MODEL, and scopes "
        "the launch key to it. Default: the store's only model; with several, none is set (the command chooses).")
    ] = None,
    load: Annotated[bool, typer.Option(
        "--load", help="Load the model (--model, or the only one) before the command starts, so its first request "
        "does not wait for the load.")] = False,
    expires: Annotated[str, typer.Option(
        "--expires", help="With keys on: the launch key stops working after this long even if the command still "
        "runs (30d, 12h, 90m, 3600), bounding a key left behind by a launch that was killed hard.")
    ] = handlers.DEFAULT_EXPIRES,
    ready_timeout: Annotated[float, typer.Option(
        "--ready-timeout", min=1.0, help="Seconds to wait for a daemon launch started to be ready (/ready).")
    ] = READY_TIMEOUT_S,
) -> None:
    """Run CMD with OPENAI_*, ANTHROPIC_* and OLLAMA_* set for this gateway (its URL, a key, the model).

    Variables: OPENAI_BASE_URL (<url>/v1), ANTHROPIC_BASE_URL and OLLAMA_HOST (<url>),
    OPENAI_API_KEY, ANTHROPIC_API_KEY and OLLAMA_API_KEY (the key),
    OPENAI_MODEL and ANTHROPIC_MODEL (--model, else the store's only model; else unset).

    Keys on: CMD gets its own key (not admin, scoped to --model, expiring after --expires);
    it is revoked when CMD exits, also after Ctrl-C or SIGTERM (passed on to CMD, then awaited).
    Keys off: the key variables hold a placeholder (the SDKs refuse an empty key).

    No daemon running: launch starts one in the background and leaves it running after CMD.

    Exit code: CMD's; 128+N when signal N killed it; 127 when CMD is not found.
    Launch's own errors (before CMD runs) exit as other blazar commands do.

    Example: blazar launch --model gemma3-270m -- python agent.py
    """
    paths = paths_from_env()
    key: handlers.LaunchKey | None = None
    info: DaemonInfo | None = None
    with Forwarder() as forwarder:
        try:
            info = _daemon(paths, ready_timeout)
            target, key = _mint(command[0], model, expires)
            if key is not None:
                _sync(info, paths)
                err.print(f"blazar launch: key {key.name} for the command (revoked when it exits)", **_VERBATIM)
            if target is None:
                err.print("blazar launch: several models (or none) in the store: OPENAI_MODEL is not set "
                          "(--model M sets it)", **_VERBATIM)
            if load:
                if target is None:
                    raise typer.BadParameter("--load needs --model when the store has not exactly one model",
                                             param_hint="--load")
                with AdminClient(info, paths=paths) as client:
                    client.load(target.name)
            env = _environment(info, paths, key, target)
            code = _run_command(command, env, forwarder)
        except KeyboardInterrupt:
            code = 128 + (forwarder.received or signal.SIGINT)
        finally:
            if key is not None and info is not None:
                forwarder.shielded = True  # a second Ctrl-C must not cut the revocation short
                _revoke(info, paths, key.name)
    raise typer.Exit(code)


def _environment(info: DaemonInfo, paths: Paths, key: handlers.LaunchKey | None,
                 target: handlers.Target | None) -> dict[str, str]:
    bundle = None
    if info.ca_file is not None:
        bundle = handlers.write_ca_bundle(paths.run / "launch-ca.pem", info.ca_file, os.environ)
    return handlers.gateway_env(os.environ, url=info.url, secret=key.secret if key else None,
                                model=target.asked if target else None, ca_bundle=bundle, ca_file=info.ca_file)

