"""`blazar session list|show|save|restore|rm`: the sessions clients named (X-Blazar-Session) and the KV bank that
keeps their slots across evictions. list and show read the log; save and restore speak to the running daemon
(restore starts one, and loads the session's model, when needed); rm goes through the daemon when one runs."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer
from rich.table import Table

from blazar.bootstrap import paths_from_env
from blazar.cli.common import JSON_OPTION, err, fmt_ts, opened, out, print_json, run
from blazar.cli.daemon_client import AdminClient, daemon_log, find_daemon, start_daemon
from blazar.errors import SessionUnavailable
from blazar.queries.sessions import session_detail, session_list
from blazar.serving.session_commands import remove_session
from blazar.serving.tenancy import qualify, tenant_named

app = typer.Typer(help="Sessions: conversations clients name (X-Blazar-Session) whose turns keep their prefix in "
                  "an engine slot, saved to the KV bank when the instance goes and restored on the next turn.",
                  no_args_is_help=True)

_VERBATIM: dict[str, Any] = {"markup": False, "emoji": False}
_NAME = typer.Argument(help="The session's name, as clients send it in X-Blazar-Session.")
# Sessions live in their key's namespace (or its cache group's); without either option, the machine owner's (keys
# off, or requests made with the CLI's own credential).
_KEY = typer.Option("--key", help="The session of this API key (sessions live in each key's namespace).")
_GROUP = typer.Option("--group", help="The session of this cache group (keys made with --cache-group).")


def _owner(key: str | None, group: str | None) -> tuple[str | None, dict[str, str] | None]:
    """The tenant named by --key / --group, and the same as the daemon's query parameters."""
    try:
        tenant = tenant_named(key=key, group=group)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--key/--group") from None
    params = {"key": key} if key is not None else {"group": group} if group is not None else None
    return tenant, params


def _full(name: str, key: str | None, group: str | None) -> str:
    full = qualify(_owner(key, group)[0], name)
    assert full is not None
    return full


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def list_(as_json: bool = JSON_OPTION) -> None:
    """Every session: its model, where its last turn ran, warm/restored/cold turns, and what the bank holds."""

    async def go() -> dict[str, Any]:
        async with opened() as app_:
            return session_list(app_)

    answer = run(go())
    if as_json:
        print_json(answer)
        return
    rows = answer["sessions"]
    if not rows:
        out.print("no sessions yet: a request names one with the X-Blazar-Session header")
        return
    table = Table("SESSION", "OWNER", "MODEL", "LAST TURN", "SLOT", "TURNS", "WARM", "RESTORED", "COLD", "BANK",
                  "LAST", box=None, header_style="bold")
    for r in rows:
        where = (f"{r['instance_id']}/{r['slot_id']}" + ("" if r["live"] else " (gone)")) if r["instance_id"] else "-"
        bank = f"{_mib(r['bank_bytes'])}, {r['bank_tokens']} tok" if r["bank_bytes"] else "-"
        table.add_row(r["name"], r["tenant"] or "-", r["model"] or "-", fmt_ts(r["last_ts"]), where, str(r["turns"]),
                      str(r["warm"]), str(r["restored"]), str(r["cold"]), bank, r["last_kv"] or "-")
    out.print(table)
    out.print(f"bank: {_mib(answer['bank_bytes'])} of {_mib(answer['bank_limit_bytes'])} (sessions.session_bank_mib)",
              **_VERBATIM)


def show(name: Annotated[str, _NAME], key: Annotated[str | None, _KEY] = None,
         group: Annotated[str | None, _GROUP] = None, as_json: bool = JSON_OPTION) -> None:
    """One session: its turns, the last placement and why, and each save in the bank with its identity."""
    full = _full(name, key, group)

    async def go() -> dict[str, Any]:
        async with opened() as app_:
            return session_detail(app_, full)

    row = run(go())
    if as_json:
        print_json(row)
        return
    for field in ("name", "tenant", "model", "instance_id", "slot_id", "live", "turns", "warm", "restored", "cold",
                  "restored_tokens", "last_kv", "last_reason", "first_ts", "last_ts"):
        if field in row:
            value = fmt_ts(row[field]) if field.endswith("_ts") else row[field]
            out.print(f"{field:16} {'-' if value is None else value}", **_VERBATIM)
    for e in row["bank"]:
        ident = e["identity"]
        out.print(f"saved            {e['model']}: {e['tokens']} tokens, {_mib(e['bytes'])}, {fmt_ts(e['saved_ts'])} "
                  f"({e['reason']}, instance {e['instance_id']} slot {e['slot_id']}); engine {ident['engine']}, "
                  f"ctx {ident['ctx_tokens']}, cache {ident['cache_type_k']}/{ident['cache_type_v']}, "
                  f"{'full' if ident['swa_full'] else 'sliding'} window; {e['file']}", **_VERBATIM)


def save(name: Annotated[str, _NAME], key: Annotated[str | None, _KEY] = None,
         group: Annotated[str | None, _GROUP] = None, as_json: bool = JSON_OPTION) -> None:
    """Save the session's live slot to the KV bank now (the daemon does it anyway before evicting its instance)."""
    owner = _owner(key, group)[1]
    info = find_daemon(paths_from_env())
    if info is None:
        raise SessionUnavailable(f"session {name} holds no live slot: no daemon is running")
    with AdminClient(info) as client:
        answer = client.session_save(name, owner)
    if as_json:
        print_json(answer)
        return
    for ev in answer["events"]:
        data = ev["data"]
        if ev["type"] == "session.saved":
            out.print(f"saved session {name}: {data['tokens']} tokens, {_mib(data['bytes'])} in "
                      f"{data['duration_ms']:.0f} ms ({data['file']})", **_VERBATIM)
        elif ev["type"] == "session.save_failed":
            out.print(f"session {name} was not saved: {data['reason']}: {data['detail']}", **_VERBATIM)
        else:
            out.print(f"dropped {data['session']} ({data['model']}) from the bank: {data['reason']}", **_VERBATIM)


def restore(
    name: Annotated[str, _NAME],
    model: Annotated[str | None, typer.Option("--model", help="Restore the save of this model (default: the newest "
                                              "save).")] = None,
    key: Annotated[str | None, _KEY] = None,
    group: Annotated[str | None, _GROUP] = None,
    as_json: bool = JSON_OPTION,
) -> None:
    """Restore the session's newest save into a free slot now (loading its model, and starting the daemon, if
    need be), so its next turn starts warm."""
    owner = _owner(key, group)[1]
    paths = paths_from_env()
    info = find_daemon(paths)
    if info is None:
        err.print(f"no daemon is running: starting one in the background (its log: {daemon_log(paths)})",
                  **_VERBATIM)
        info = start_daemon(paths, os.environ)
    with AdminClient(info) as client:
        answer = client.session_restore(name, model, owner)
    if as_json:
        print_json(answer)
        return
    if answer["kv"] == "warm":
        out.print(f"session {name} is live already: {answer['reason']}", **_VERBATIM)
        return
    out.print(f"restored session {name}: {answer['tokens']} tokens into slot {answer['slot_id']} of {answer['model']} "
              f"(instance {answer['instance_id']})", **_VERBATIM)


def rm(name: Annotated[str, _NAME], key: Annotated[str | None, _KEY] = None,
       group: Annotated[str | None, _GROUP] = None, as_json: bool = JSON_OPTION) -> None:
    """Forget the session and delete its saves from the bank."""
    full, owner = _full(name, key, group), _owner(key, group)[1]
    info = find_daemon(paths_from_env())
    if info is not None:
        with AdminClient(info) as client:
            answer = client.session_rm(name, owner)
    else:
        async def go() -> dict[str, Any]:
            async with opened() as app_:
                rec = await remove_session(app_, full)
                return {**rec.event.model_dump(mode="json"), "removed": name, "session": name}

        answer = run(go())
    if as_json:
        print_json(answer)
        return
    out.print(f"removed session {name} ({len(answer['files'])} save(s), {_mib(answer['bytes'])} freed)", **_VERBATIM)


app.command("list")(list_)
app.command("show")(show)
app.command("save")(save)
app.command("restore")(restore)
app.command("rm")(rm)
