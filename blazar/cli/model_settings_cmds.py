"""`blazar model set`: a model's chat template, system prompt and default parameters, each change a
`model.configured` event (blazar/store/model_settings.py). A running daemon is told to fold it at once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from blazar.cli.common import JSON_OPTION, opened, out, print_json, run
from blazar.cli.daemon_client import tell_daemon
from blazar.errors import InvalidModelSettings
from blazar.events.model_settings import ModelSettings
from blazar.queries.catalog import model as stored_model
from blazar.store.chat_templates import served_template
from blazar.store.model_settings import PARAMETERS, SettingsChange, configure_model, parse_parameters

app = typer.Typer(help="A model's serving settings: chat template, system prompt, default parameters (recorded as "
                  "model.configured events; `blazar show NAME` shows them).", no_args_is_help=True)

_VERBATIM: dict[str, Any] = {"markup": False, "emoji": False}


def _template_text(value: str) -> str:
    """--template: a file's text (a Jinja template) when `value` names a file, else `value` (a built-in name, or a
    Jinja text given inline)."""
    path = Path(value).expanduser()
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidModelSettings(f"--template {value}: cannot read it as UTF-8 text ({e})") from None
    if "{{" not in value and "{%" not in value and ("/" in value or value.endswith((".jinja", ".j2", ".txt"))):
        raise InvalidModelSettings(f"--template {value}: no such file (a built-in name is one word, like gemma)")
    return value


def _pairs(values: list[str]) -> list[tuple[str, str]]:
    pairs = []
    for v in values:
        key, sep, value = v.partition("=")
        if not sep or not key.strip():
            raise InvalidModelSettings(f"--param {v!r}: expected key=value (e.g. temperature=0.7)")
        pairs.append((key.strip(), value))
    return pairs


def describe(settings: ModelSettings | None) -> list[tuple[str, str]]:
    """Rows for `blazar show` and `model set`: what a model carries, or that it carries nothing."""
    if settings is None or settings.is_empty():
        return [("template", "the GGUF's own"), ("system prompt", "-"), ("default parameters", "-")]
    template = "the GGUF's own" if settings.template is None else (
        f"built-in {settings.template}" if settings.template_kind == "builtin"
        else f"Jinja, {len(settings.template)} characters")
    params = ", ".join(f"{k}={v}" for k, v in sorted(settings.parameters.items())) or "-"
    rows = [("template", template), ("system prompt", settings.system if settings.system is not None else "-"),
            ("default parameters", params)]
    if settings.reasoning_budget is not None or settings.reasoning_effort is not None:
        budget = "unbounded" if settings.reasoning_budget is None else f"{settings.reasoning_budget} tokens at most"
        rows.append(("reasoning", f"{budget}, effort {settings.reasoning_effort or 'as asked'}"))
    if settings.rerank:
        rows.append(("rerank", "forced (served in rerank mode for /v1/rerank, with or without a rerank head)"))
    if settings.cache is not None:
        rows.append(("response cache", settings.cache))
    return rows


@app.command("set")
def set_(
    name: Annotated[str, typer.Argument(help="A model (or variant, or alias) from `blazar list`.")],
    template: Annotated[str | None, typer.Option(
        "--template", help="A Jinja chat template FILE, one Blazar ships (blazar:gemma, blazar:chatml, "
        "blazar:transcript: they carry tools), or a llama.cpp built-in template NAME (gemma, chatml, llama3, ...). "
        "Go templates (Ollama's {{ .Prompt }}) are refused. Overrides the template probe's choice. A loaded instance "
        "with the old template is replaced on the next request.")] = None,
    system: Annotated[str | None, typer.Option(
        "--system", help="A system prompt, sent as the first message of any chat that has none.")] = None,
    param: Annotated[list[str] | None, typer.Option(
        "--param", help=f"A default parameter key=value, used when a request does not set it; repeat for more "
        f"(stop may repeat). Keys: {', '.join(PARAMETERS)} (also ctx, max_tokens).")] = None,
    clear_template: Annotated[bool, typer.Option("--clear-template", help="Back to the GGUF's own template.")] = False,
    clear_system: Annotated[bool, typer.Option("--clear-system", help="Remove the system prompt.")] = False,
    clear_param: Annotated[list[str] | None, typer.Option(
        "--clear-param", help="Remove a default parameter (KEY, or 'all'); repeat for more.")] = None,
    rerank: Annotated[bool | None, typer.Option(
        "--rerank/--no-rerank", help="Serve rerank requests (/v1/rerank) in rerank mode even without a rerank head "
        "in the GGUF (its scores then mean nothing); --no-rerank: only with one.")] = None,
    cache: Annotated[str | None, typer.Option(
        "--cache", help="The response cache for its deterministic requests (temperature 0 or a fixed seed): exact "
        "(a repeated request of the same key is answered from the cache), semantic (also a similar prompt's answer: "
        "routing.semantic_cache_model), off, or none (no say: a key's --cache or "
        "the request's X-Blazar-Cache header decides).")] = None,
    mmproj: Annotated[Path | None, typer.Option(
        "--mmproj", help="Serve it with this multimodal projector (a vision or audio mmproj-*.gguf, verified and "
        "stored by sha256); it replaces any it had. A loaded instance without it is replaced on the next request "
        "that needs it.")] = None,
    no_mmproj: Annotated[bool, typer.Option("--no-mmproj", help="Serve it without its projector (text only).")] = False,
    reasoning_budget: Annotated[int | None, typer.Option(
        "--reasoning-budget", metavar="TOKENS", help="Thinking tokens a request gets where it asks for no budget, "
        "and the most it gets where it asks for more (0: the thinking ends at once); also the engine's load "
        "flag.")] = None,
    reasoning_effort: Annotated[str | None, typer.Option(
        "--reasoning-effort", metavar="LEVEL", help="The effort where a request asks for none: none, minimal, low, "
        "medium, high, xhigh or max (a budget of 0, 256, 1024, 4096, 16384, 32768 or unbounded thinking tokens).")
    ] = None,
    clear_reasoning: Annotated[bool, typer.Option(
        "--clear-reasoning", help="Remove the reasoning budget and effort.")] = False,
    as_json: bool = JSON_OPTION,
) -> None:
    """Set a model's chat template, system prompt, default parameters (a request's own values always win) or
    reasoning budget, or its projector."""
    settings_given = any((template, system is not None, param, clear_template, clear_system, clear_param,
                          rerank is not None, reasoning_budget is not None, reasoning_effort is not None,
                          clear_reasoning, cache is not None))
    if mmproj is not None and no_mmproj:
        raise typer.BadParameter("--mmproj and --no-mmproj together: give one")
    if mmproj is not None or no_mmproj:
        if settings_given:
            raise typer.BadParameter("set the projector on its own (--mmproj or --no-mmproj alone)")
        _set_projector(name, mmproj, as_json)
        return
    if not settings_given:
        raise typer.BadParameter("nothing to set: give --template, --system, --param, --rerank, --cache, --mmproj, "
                                 "--reasoning-budget, --reasoning-effort or a --clear-* option")
    change = SettingsChange(template=_template_text(template) if template is not None else None, system=system,
                            parameters=parse_parameters(_pairs(param or [])), clear_template=clear_template,
                            clear_system=clear_system, clear_parameters=tuple(clear_param or ()), rerank=rerank,
                            reasoning_budget=reasoning_budget, reasoning_effort=reasoning_effort,
                            clear_reasoning=clear_reasoning, cache=cache)

    async def go() -> Any:
        async with opened() as app_:
            rec = await configure_model(app_, name, change)
            entry = stored_model(app_, name)
            probe = entry.template_probe if entry is not None else None
            return (rec, app_.paths, entry.metadata if entry is not None else None,
                    probe.chosen if probe is not None else None)

    rec, paths, metadata, probed = run(go())
    tell_daemon(paths)
    ev = rec.event
    if as_json:
        print_json(rec.to_json())
        return
    out.print(f"{ev.name}: " + ("; ".join(ev.changed) + " changed" if ev.changed else "nothing changed"),
              **_VERBATIM)
    for key, value in describe(ev.settings):
        if key == "template" and metadata is not None:  # what the engine gets, and why (blazar show says the same)
            value = served_template(metadata, ev.settings, probed).describe()
        out.print(f"  {key}: {value}", **_VERBATIM)


def _set_projector(name: str, mmproj: Path | None, as_json: bool) -> None:
    from blazar.store.projectors import remove_projector, set_projector

    src = mmproj.absolute() if mmproj is not None else None

    async def go() -> Any:
        async with opened() as app_:
            if src is None:
                return await remove_projector(app_, name), app_.paths
            return await set_projector(app_, name, src), app_.paths

    rec, paths = run(go())
    tell_daemon(paths)
    ev = rec.event
    if as_json:
        print_json(rec.to_json())
    elif mmproj is None:
        out.print(f"{ev.name}: projector removed (text only)" + ("; its file deleted" if ev.file_deleted else ""),
                  **_VERBATIM)
    else:
        meta = ev.metadata
        out.print(f"{ev.name}: projector set: {meta.projector_type or '?'} ({', '.join(meta.modalities)}), "
                  f"sha256 {ev.sha256[:16]}…", **_VERBATIM)
