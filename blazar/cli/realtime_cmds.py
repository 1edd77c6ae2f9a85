"""`blazar realtime set|list|show|rm`: realtime profiles, the three models (whisper, chat, piper) a `/v1/realtime`
session asking for a profile's name runs on (blazar/store/realtime.py records them; blazar/queries/realtime.py says
what a session gets). A running daemon is told to fold a change at once."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from blazar.cli.common import JSON_OPTION, fmt_ts, opened, out, print_json, run
from blazar.cli.daemon_client import tell_daemon

app = typer.Typer(help="Realtime profiles: which models hear, answer and speak in a /v1/realtime session.",
                  no_args_is_help=True)
_VERBATIM: dict[str, Any] = {"markup": False, "emoji": False}


def set_(
    name: Annotated[str, typer.Argument(help="The profile's name, what a session's `model` asks for (a model name "
                                        "the store does not use).")],
    stt: Annotated[str, typer.Option("--stt", help="The whisper model that hears (transcribes) the user.")],
    llm: Annotated[str, typer.Option("--llm", help="The chat model (a GGUF) that answers.")],
    tts: Annotated[str, typer.Option("--tts", help="The piper voice that speaks the answer.")],
    voice: Annotated[str | None, typer.Option("--voice", help="The speaker of a multi-speaker piper voice "
                                              "(GET /v1/audio/voices lists them); default: the voice's own.")] = None,
    as_json: bool = JSON_OPTION,
) -> None:
    """Set (or replace) a realtime profile: each model must be in the store and of its kind."""
    from blazar.store.realtime import set_profile

    async def go() -> Any:
        async with opened() as app_:
            return await set_profile(app_, name, stt=stt, llm=llm, tts=tts, speaker=voice), app_.paths

    rec, paths = run(go())
    tell_daemon(paths)
    if as_json:
        print_json(rec.to_json())
        return
    ev = rec.event
    out.print(f"realtime profile {ev.name}: hears with {ev.stt}, answers with {ev.llm}, speaks with {ev.tts}"
              + (f" as {ev.speaker}" if ev.speaker else ""), **_VERBATIM)


def _row(p: Any) -> dict[str, Any]:
    return {"name": p.name, "stt": p.stt, "llm": p.llm, "tts": p.tts, "voice": p.speaker, "seq": p.seq,
            "set_ts": p.ts}


def list_(as_json: bool = JSON_OPTION) -> None:
    """Every realtime profile and its models."""
    from blazar.queries.realtime import profiles

    async def go() -> list[dict[str, Any]]:
        async with opened() as app_:
            return [_row(p) for p in profiles(app_)]

    rows = run(go())
    if as_json:
        print_json(rows)
        return
    if not rows:
        out.print("no realtime profiles (blazar realtime set NAME --stt M --llm M --tts M)")
        return
    table = Table("NAME", "STT", "LLM", "TTS", "VOICE", "SET", box=None, header_style="bold")
    for r in rows:
        table.add_row(r["name"], r["stt"], r["llm"], r["tts"], r["voice"] or "-", fmt_ts(r["set_ts"]))
    out.print(table)


def show(
    name: Annotated[str, typer.Argument(help="A profile's name, or a chat model's (its session's defaults).")],
    as_json: bool = JSON_OPTION,
) -> None:
    """The models a realtime session asking for NAME runs on: a profile's, or a chat model's with the default
    speech models. Refused, as the session would be, when one is missing."""
    from blazar.queries.realtime import session_models

    async def go() -> dict[str, Any]:
        async with opened() as app_:
            m = session_models(app_, name)
            return {"name": name, "profile": m.profile, "stt": m.stt, "llm": m.llm, "tts": m.tts, "voice": m.speaker}

    got = run(go())
    if as_json:
        print_json(got)
        return
    source = f"realtime profile {name}" if got["profile"] else f"{name} (no profile: the default speech models)"
    out.print(f"{source}\n  stt  {got['stt']}\n  llm  {got['llm']}\n  tts  {got['tts']}"
              + (f" as {got['voice']}" if got["voice"] else ""), **_VERBATIM)


def rm(name: Annotated[str, typer.Argument(help="A profile's name.")]) -> None:
    """Forget a realtime profile: a session asking for it is refused."""
    from blazar.store.realtime import remove_profile

    async def go() -> Any:
        async with opened() as app_:
            await remove_profile(app_, name)
            return app_.paths

    tell_daemon(run(go()))
    out.print(f"removed realtime profile {name}", **_VERBATIM)


app.command("set")(set_)
app.command("list")(list_)
app.command("show")(show)
app.command("rm")(rm)
