"""`blazar config defaults|list|get|set|unset`: every change goes to config.toml and into the log. Keys are
section.key (`server.port`); an old flat name (`port`) is still taken, with a deprecation line."""

from __future__ import annotations

import tomli_w
import typer
from rich.table import Table

from blazar import config as settings
from blazar.bootstrap import paths_from_env
from blazar.cli.common import JSON_OPTION, opened, out, print_json, run
from blazar.cli.daemon_client import tell_daemon
from blazar.events.base import Recorded
from blazar.events.system import ConfigChanged
from blazar.operations.config import set_value, unset_value

app = typer.Typer(help="Read and change configuration (config.toml; each change is a config.changed event).",
                  no_args_is_help=True)


@app.command()
def defaults(as_json: bool = JSON_OPTION) -> None:
    """Print every key with its built-in default, as TOML: a table per section (or JSON: {"section.key": v})."""
    values = settings.defaults()
    if as_json:
        print_json(values)
        return
    for section, model in settings.SECTIONS.items():
        # NOTE: markup off: a [section] header is what rich would take for a style tag.
        out.print(f"\n# {(model.__doc__ or '').partition('] ')[2]}\n[{section}]", markup=False)
        for name in model.model_fields:
            key = f"{section}.{name}"
            out.print(f"# {settings.FIELDS[key].description} ({settings.describe(key)})", markup=False)
            out.print(_toml_line(name, values[key]), markup=False)


def _toml_line(name: str, value: object) -> str:
    """`name = value` on one line; a mapping as an inline table, so that it stays inside its section's table."""
    if isinstance(value, dict):
        pairs = ", ".join(tomli_w.dumps({k: v}).strip() for k, v in value.items())
        return f"{name} = {{{pairs}}}"
    return tomli_w.dumps({name: value}).strip()


@app.command("list")
def list_(as_json: bool = JSON_OPTION) -> None:
    """List the effective configuration (section.key) and where each value comes from."""

    async def go() -> list[dict]:
        async with opened() as app_:
            overrides = app_.overrides()
        eff = settings.effective({k: v for k, v in overrides.items() if k in settings.FIELDS})
        return [
            {"key": k, "value": v, "source": "config.toml" if k in overrides else "default",
             "accepts": settings.describe(k)}
            for k, v in eff.items()
        ]

    rows = run(go())
    if as_json:
        print_json(rows)
        return
    table = Table("key", "value", "source", "accepts", box=None, header_style="bold")
    for r in rows:
        table.add_row(r["key"], str(r["value"]), r["source"], r["accepts"])
    out.print(table)


@app.command()
def get(key: str = typer.Argument(..., help="A config key, section.key (see `blazar config defaults`)."),
        as_json: bool = JSON_OPTION) -> None:
    """Print the effective value of KEY."""
    key = settings.resolve(key, where="config get")  # refuses unknown keys with the valid ones

    async def go() -> object:
        async with opened() as app_:
            return settings.as_flat(app_.settings())[key]

    value = run(go())
    if as_json:
        print_json({"key": key, "value": value})
    else:
        out.print(str(value).lower() if isinstance(value, bool) else str(value))


# NOTE: a negative VALUE (keep_alive -1, cascade_min_logprob -2.5) is a value, not an unknown option.
@app.command("set", context_settings={"ignore_unknown_options": True})
def set_(key: str = typer.Argument(..., help="A config key, section.key (an old flat name is taken: it is written "
                                               "as its section.key)."),
         value: str = typer.Argument(..., help="The new value, as text (true/false, numbers, choices).")) -> None:
    """Set KEY to VALUE: validated, written to config.toml atomically, recorded as config.changed."""

    async def go() -> Recorded | None:
        async with opened() as app_:
            return await set_value(app_, key, value)

    rec = run(go())
    if rec is not None:
        tell_daemon(paths_from_env())  # a running daemon uses it from its very next request
    if rec is None:
        out.print(f"{settings.current_key(key)} is already {value}")
    else:
        change = rec.event
        assert isinstance(change, ConfigChanged)  # set_value records nothing else
        out.print(f"{change.key} = {change.new}  (was {change.old if change.old is not None else 'default'}; "
                  f"seq {rec.seq})")


@app.command()
def unset(key: str = typer.Argument(..., help="A config key, section.key.")) -> None:
    """Return KEY to its default (also removes an unknown key from a hand-edited config.toml)."""

    async def go() -> Recorded | None:
        async with opened(reconcile_config=False) as app_:
            return await unset_value(app_, key)

    rec = run(go())
    key = settings.current_key(key)
    if rec is not None:
        tell_daemon(paths_from_env())
    if rec is None:
        out.print(f"{key}: nothing to unset" if key in settings.FIELDS else f"removed unknown key {key!r}")
    else:
        out.print(f"{key} back to its default ({settings.defaults()[key]}); seq {rec.seq}")
