"""`blazar remote add|list|rm`: OpenAI-compatible servers (vLLM, SGLang, another Blazar, a vendor) registered as
engines for the model names they serve. Requests for those names get Blazar's admission, traces, metrics, `why`,
dialect translation and audit; the remote's key is read from an environment variable of the daemon, never stored."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from blazar.bootstrap import paths_from_env
from blazar.cli.common import JSON_OPTION, fmt_ts, opened, out, print_json, run
from blazar.cli.daemon_client import tell_daemon
from blazar.cluster.remotes import add_remote, remove_remote
from blazar.projections.remotes import remotes

app = typer.Typer(help="Remote engines: OpenAI-compatible servers Blazar routes some model names to.",
                  no_args_is_help=True)
_VERBATIM: dict[str, Any] = {"markup": False, "emoji": False}


def add(
    name: Annotated[str, typer.Argument(help="The remote's name (letters, digits, . _ -).")],
    url: Annotated[str, typer.Argument(help="Its OpenAI API root: http(s)://HOST[:PORT][/PATH] (a trailing /v1 "
                                       "is fine).")],
    models: Annotated[list[str], typer.Option("--models", "-m", help="A model name it serves (repeat for more); "
                                              "requests for it go there.")],
    api_key_env: Annotated[str | None, typer.Option(
        "--api-key-env", help="The environment variable (of the daemon) holding its API key, sent as a Bearer "
        "token; the key itself is never recorded.")] = None,
    max_concurrent: Annotated[int, typer.Option("--max-concurrent", min=1, max=10_000,
                                                help="Requests in flight to it at once; more wait in its queue.")] = 4,
    as_json: bool = JSON_OPTION,
) -> None:
    """Register (or replace) a remote engine for some model names."""

    async def go() -> dict[str, Any]:
        async with opened() as app_:
            rec = await add_remote(app_, name, url, models, api_key_env=api_key_env, max_concurrent=max_concurrent)
            return {"seq": rec.seq, **rec.event.model_dump(mode="json")}

    done = run(go())
    tell_daemon(paths_from_env())
    if as_json:
        print_json(done)
        return
    out.print(f"remote {name}: {', '.join(done['models'])} -> {done['url']} (at most {max_concurrent} at once"
              + (f", key from ${api_key_env}" if api_key_env else "") + ")", **_VERBATIM)


def list_(as_json: bool = JSON_OPTION) -> None:
    """Every remote engine, its models, and whether its circuit is open."""

    async def go() -> list[dict[str, Any]]:
        async with opened() as app_:
            now = app_.clock.now()
            return [{"name": r.name, "url": r.url, "models": list(r.models), "api_key_env": r.api_key_env,
                     "max_concurrent": r.max_concurrent, "added_ts": r.added_ts, "circuit_open": r.open_at(now),
                     "circuit_open_until": r.circuit_open_until, "circuit_reason": r.circuit_reason}
                    for r in remotes(app_.runner.state("remotes"))]

    rows = run(go())
    if as_json:
        print_json(rows)
        return
    if not rows:
        out.print("no remote engines (blazar remote add NAME URL --models M)")
        return
    table = Table("NAME", "URL", "MODELS", "KEY FROM", "AT ONCE", "CIRCUIT", "ADDED", box=None, header_style="bold")
    for r in rows:
        circuit = (f"open until {fmt_ts(r['circuit_open_until'])}: {r['circuit_reason']}" if r["circuit_open"]
                   else "closed")
        table.add_row(r["name"], r["url"], " ".join(r["models"]), f"${r['api_key_env']}" if r["api_key_env"] else "-",
                      str(r["max_concurrent"]), circuit, fmt_ts(r["added_ts"]))
    out.print(table)


def rm(name: Annotated[str, typer.Argument(help="A remote's name.")]) -> None:
    """Forget a remote engine: its model names are no longer served."""

    async def go() -> None:
        async with opened() as app_:
            await remove_remote(app_, name)

    run(go())
    tell_daemon(paths_from_env())
    out.print(f"removed remote {name}", **_VERBATIM)


app.command("add")(add)
app.command("list")(list_)
app.command("rm")(rm)

