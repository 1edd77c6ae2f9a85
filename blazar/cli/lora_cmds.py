"""`blazar lora add|list|rm`: a model's LoRA adapters in the store, each change a `lora.added` / `lora.removed` event
(blazar/store/lora.py). A running daemon is told to fold it at once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from blazar.cli.common import JSON_OPTION, opened, out, print_json, run
from blazar.cli.daemon_client import tell_daemon
from blazar.errors import ModelNotFound
from blazar.queries.catalog import StoredModel, models
from blazar.queries.catalog import model as stored_model

app = typer.Typer(help="A model's LoRA adapters: loaded with it, applied per request (`lora: [{name, scale}]`) or "
                  "by an Ollama Modelfile's ADAPTER.", no_args_is_help=True)

_VERBATIM: dict[str, Any] = {"markup": False, "emoji": False}


@app.command("add")
def add(
    model: Annotated[str, typer.Argument(help="The model it adapts (its architecture must be the adapter's).")],
    file: Annotated[Path, typer.Argument(help="The adapter: a LoRA GGUF (llama.cpp's convert_lora_to_gguf.py).")],
    name: Annotated[str, typer.Option("--name", help="What requests call it: lora: [{\"name\": NAME, ...}].")],
    sha256: Annotated[str | None, typer.Option("--sha256", help="Refuse the file unless its sha256 is this.")] = None,
    as_json: bool = JSON_OPTION,
) -> None:
    """Add a LoRA adapter to MODEL: verified, stored content-addressed (lora/<sha256>.gguf), loaded with the model
    from its next load (unapplied until a request names it)."""
    from blazar.store.lora import add_lora

    src = file.absolute()

    async def go() -> Any:
        async with opened() as app_:
            return await add_lora(app_, model, src, name, expected_sha256=sha256), app_.paths

    rec, paths = run(go())
    tell_daemon(paths)
    ev = rec.event
    if as_json:
        print_json(rec.to_json())
        return
    meta = ev.metadata
    out.print(f"{ev.model}: adapter {ev.name} added: {meta.architecture}, rank {meta.rank or '?'}, alpha "
              f"{meta.alpha if meta.alpha is not None else '?'}, {ev.bytes / 2**20:.1f} MiB, sha256 {ev.sha256[:16]}…",
              **_VERBATIM)


@app.command("list")
def list_(
    model: Annotated[str | None, typer.Argument(help="Only this model's adapters.")] = None,
    as_json: bool = JSON_OPTION,
) -> None:
    """List the adapters in the store, by model, in load order (a request's {"id": i} is the i-th)."""

    async def go() -> list[StoredModel]:
        async with opened() as app_:
            if model is None:
                return [m for m in models(app_) if m.loras]
            got = stored_model(app_, model)
            if got is None:
                raise ModelNotFound(f"no model named {model!r} in the store (see: blazar list)")
            return [got]

    rows = run(go())
    if as_json:
        print_json([{"model": m.name, "id": i, **a.to_json()} for m in rows for i, a in enumerate(m.loras)])
        return
    if not any(m.loras for m in rows):
        out.print("no adapters" + (f" for {model}" if model else "") + ": blazar lora add MODEL FILE --name NAME",
                  **_VERBATIM)
        return
    table = Table("model", "id", "name", "arch", "rank", "alpha", "size", "sha256", box=None, header_style="bold")
    for m in rows:
        for i, a in enumerate(m.loras):
            md = a.metadata
            table.add_row(m.name, str(i), a.name, md.architecture, str(md.rank or "?"),
                          "?" if md.alpha is None else f"{md.alpha:g}", f"{a.bytes / 2**20:.1f} MiB", a.sha256[:16])
    out.print(table)


@app.command("rm")
def rm(
    model: Annotated[str, typer.Argument(help="The model.")],
    name: Annotated[str, typer.Argument(help="The adapter's name.")],
) -> None:
    """Remove adapter NAME from MODEL (its file goes unless another model still names it)."""
    from blazar.store.lora import remove_lora

    async def go() -> Any:
        async with opened() as app_:
            return await remove_lora(app_, model, name), app_.paths

    rec, paths = run(go())
    tell_daemon(paths)
    ev = rec.event
    out.print(f"{ev.model}: adapter {ev.name} removed" + ("; its file deleted" if ev.file_deleted else ""),
              **_VERBATIM)
