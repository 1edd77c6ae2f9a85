"""Instance commands: `blazar serve` (the daemon, in the foreground), `load`, `stop` and `ps`. `load`, `stop` and
`ps` speak to the running daemon (blazar/cli/daemon_client.py); `load` starts one when none runs; `ps` without one
shows what the log last recorded."""

from __future__ import annotations

import logging
import sys
import time
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from blazar.bootstrap import bootstrap, default_actor, paths_from_env
from blazar.cli.common import JSON_OPTION, err, fmt_ts, opened, out, print_json, run
from blazar.cli.daemon_client import AdminClient, daemon_or_start, find_daemon
from blazar.daemon_file import DaemonInfo
from blazar.durations import format_duration, keep_alive_seconds
from blazar.errors import ModelNotLoaded
from blazar.queries.catalog import model as stored_model
from blazar.queries.ps import open_circuits, ps_rows

_VERBATIM: dict[str, Any] = {"markup": False, "emoji": False}


def serve(
    host: Annotated[str | None, typer.Option("--host", help="Address to bind (default: the `host` setting, "
                                             "127.0.0.1). Anything wider than loopback: on purpose only.")] = None,
    port: Annotated[int | None, typer.Option("--port", min=1, max=65535,
                                             help="Port to listen on (default: the `port` setting).")] = None,
    insecure_no_auth: Annotated[bool, typer.Option(
        "--insecure-no-auth", help="Serve a host wider than loopback even though no API key exists (anyone who "
        "reaches it can run, pull and delete models); without it such a bind is refused.")] = False,
    insecure_cluster: Annotated[bool, typer.Option(
        "--insecure-cluster", help="On a PostgreSQL log: start as a node even though its node_url is plain http off "
        "this machine, and send the cluster key to peers reached over plain http (anyone on those networks can read "
        "it). Warned at every start and recorded in node.started; without it such a node refuses to start.")] = False,
) -> None:
    """Run the daemon in the foreground: the HTTP API and the engine children. Ctrl-C or SIGTERM stops both.
    Wider than loopback (--host 0.0.0.0) needs an API key (`blazar keys create NAME --admin`); https with the
    tls_cert and tls_key settings."""
    from blazar import daemon  # the server: imported by this command alone
    from blazar.bootstrap import build_services

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("blazar").addHandler(handler)

    def listening(info: DaemonInfo) -> None:
        local = f" (on this machine: {info.url})" if info.url != info.bound else ""
        err.print(f"blazar daemon listening on {info.bound}{local} (pid {info.pid}); Ctrl-C stops it", **_VERBATIM)

    async def go() -> int:
        app = await bootstrap(actor=default_actor().replace("cli:", "daemon:", 1))
        try:
            settings = app.settings()
            # An unsafe bind is refused (or, forced, warned about in the log, which `serve` shows on stderr).
            return await daemon.serve(app, build_services(app), host=host or settings.server.host,
                                      port=port or settings.server.port,
                                      on_listening=listening, insecure_no_auth=insecure_no_auth,
                                      insecure_cluster=insecure_cluster)
        finally:
            await app.close()

    code = run(go())
    err.print("blazar daemon stopped")
    if code:
        raise typer.Exit(code)


def load(
    model: Annotated[str, typer.Argument(help="A model name from `blazar list`.")],
    keep_alive: Annotated[str | None, typer.Option(
        "--keep-alive", help="How long to stay loaded after the last use: 5m, 1h, 300; negative: forever; "
        "0: unload when idle. Default: the keep_alive setting (a loaded instance keeps its own).")] = None,
    pin: Annotated[bool | None, typer.Option(
        "--pin/--unpin", help="Pinned instances are never evicted (default: unchanged; a new one is unpinned).")
    ] = None,
    ctx: Annotated[int | None, typer.Option("--ctx", min=1, help="Context tokens per slot (default: the ctx "
                                            "setting).")] = None,
    sessions: Annotated[bool, typer.Option(
        "--sessions", help="Start it ready for sessions: a sliding-window model gets its full window cache "
        "(sessions.session_swa_full), which restoring a saved slot needs; costs memory, counted by the fit.")] = False,
    as_json: bool = JSON_OPTION,
) -> None:
    """Load a model into an engine instance (or reuse a running one) and wait until it serves; starts the daemon."""
    if keep_alive is not None:
        try:
            keep_alive_seconds(keep_alive)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--keep-alive") from None
    inst = load_in_daemon(model, keep_alive=keep_alive, pin=pin, ctx=ctx, sessions=sessions or None)
    if as_json:
        print_json(inst)
        return
    say_ready(inst)


def load_in_daemon(model: str, **asked: Any) -> dict[str, Any]:
    """Ask the running daemon (or one started for it) to load `model`, and wait until it serves: `blazar load`, and
    `pull --load` and `import --load` after they stored it. The instance, as the admin route answers it."""
    with AdminClient(daemon_or_start(paths_from_env())) as client:
        return client.load(model, **asked)


def say_ready(inst: dict[str, Any]) -> None:
    where = f"on port {inst['port']}" if inst.get("port") else "on its Unix socket"  # port 0: piper
    if inst.get("kind", "llama-server") != "llama-server":
        out.print(f"{inst['model']} ({inst['kind']}) is ready {where}: instance {inst['instance_id']}", **_VERBATIM)
        return
    out.print(f"{inst['model']} is ready {where}: instance {inst['instance_id']}, "
              f"{inst['slots']} slot(s) of {inst['ctx_tokens']} tokens", **_VERBATIM)


def stop(
    model: Annotated[str, typer.Argument(help="A loaded model (see `blazar ps`).")],
    as_json: bool = JSON_OPTION,
) -> None:
    """Stop every instance of a model."""
    info = find_daemon(paths_from_env())
    if info is None:
        raise ModelNotLoaded(f"{model} is not loaded: no daemon is running")
    with AdminClient(info) as client:
        stopped = client.stop(model)
    if as_json:
        print_json({"model": model, "stopped": stopped})
        return
    out.print(f"stopped {model} (instance {', '.join(stopped)})", **_VERBATIM)


def ps(
    as_json: bool = JSON_OPTION,
    reset: Annotated[str | None, typer.Option(
        "--reset", metavar="MODEL", help="Close MODEL's circuit (opened after repeated crashes) so loads are "
        "allowed again, instead of listing.")] = None,
) -> None:
    """List loaded model instances: state, process, memory, idleness, when keep-alive unloads them."""
    info = find_daemon(paths_from_env())
    if reset is not None:
        _reset(reset, info, as_json=as_json)
        return
    if info is not None:
        with AdminClient(info) as client:
            answer = client.ps()
        rows, circuits, now = answer["instances"], answer.get("circuits", {}), time.time()
    else:
        async def go() -> tuple[list[dict], dict[str, float], float]:
            async with opened() as app:
                now = app.clock.now()
                return [r.to_json() for r in ps_rows(app, now=now)], open_circuits(app, now=now), now

        rows, circuits, now = run(go())
    if as_json:
        print_json({"daemon": None if info is None else {"pid": info.pid, "url": info.url},
                    "instances": rows, "circuits": circuits})
        return
    if not rows:
        out.print("nothing is loaded" if info is not None else "nothing is loaded: the daemon is not running")
    else:
        if info is None:
            err.print("the daemon is not running: these instances are what the log last recorded; the daemon "
                      "reconciles them with the real processes when it starts (blazar serve, or blazar load)")
        out.print(_table(rows, now))
    for model, until in sorted(circuits.items()):
        out.print(f"{model}: loads refused after repeated crashes until {fmt_ts(until)} "
                  f"(blazar ps --reset {model} allows them now)", **_VERBATIM)


def _reset(model: str, info: DaemonInfo | None, *, as_json: bool) -> None:
    if info is not None:
        with AdminClient(info) as client:
            was_open = client.reset(model)
    else:
        async def go() -> bool:
            from blazar.instances.supervisor import reset_circuit

            async with opened() as app:
                entry = stored_model(app, model)
                return await reset_circuit(app, entry.name if entry else model)

        was_open = run(go())
    if as_json:
        print_json({"model": model, "reset": was_open})
    elif was_open:
        out.print(f"{model}: circuit closed; loads are allowed again", **_VERBATIM)
    else:
        out.print(f"{model}: the circuit was not open; nothing to reset", **_VERBATIM)


def _bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _idle(row: dict) -> str:
    if row["in_flight"]:
        return f"busy ({row['in_flight']})"
    return "-" if row["idle_s"] is None else format_duration(row["idle_s"])


def _expires(row: dict, now: float) -> str:
    if row["state"] != "ready":
        return "-"
    if row["pinned"]:
        return "pinned"
    if row["keep_alive_s"] is None:
        return "never"
    if row["expires_at"] is None:
        return "after use"  # busy: the countdown starts when the last request ends
    return f"in {format_duration(max(0.0, row['expires_at'] - now))}"


def _table(rows: list[dict], now: float) -> Table:
    clustered = any(r.get("node") for r in rows)  # gateways sharing a log: say whose each instance is
    table = Table(*(("NODE",) if clustered else ()), "MODEL", "KIND", "STATE", "PID", "PORT", "CTX", "SLOTS",
                  "PLANNED", "MEASURED", "IDLE", "EXPIRES", "POSTURE", box=None, header_style="bold")
    for r in rows:
        kind = r.get("kind") or "llama-server"
        ctx = str(r["ctx_tokens"]) if kind == "llama-server" else "-"  # a speech child has no context
        table.add_row(*((Text(r.get("node") or "-"),) if clustered else ()), Text(r["model"]), kind, r["state"],
                      str(r["pid"]), str(r["port"] or "-"), ctx, str(r["slots"]), _bytes(r["planned_bytes"]),
                      _bytes(r["measured_bytes"]), _idle(r), _expires(r, now), Text(_posture(r)))
    return table


def _posture(row: dict) -> str:
    """The tuned posture it runs and the profile.adopted that chose it; "defaults (stale profile N)" when a profile
    measured on another engine build was passed by."""
    label = row.get("posture") or "defaults"
    if row.get("profile_seq") is not None:
        return f"{label} (profile {row['profile_seq']})"
    if row.get("profile_stale_seq") is not None:
        return f"{label} (stale profile {row['profile_stale_seq']})"
    return label
