"""`blazar keys create|list|show|rotate|revoke|limits`: API keys, each change an event (blazar/operations/keys.py). A
secret is printed once, on stdout alone; a running daemon is told to fold the change at once."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from blazar.cli.common import JSON_OPTION, err, fmt_ts, opened, out, print_json, run
from blazar.cli.daemon_client import tell_daemon
from blazar.context import Blazar
from blazar.operations import keys as handlers
from blazar.paths import Paths
from blazar.queries.batches import storage_of
from blazar.queries.keys import ApiKey, all_keys, key, usage

app = typer.Typer(help="API keys: once one exists, every route but /health needs one (Authorization: Bearer, or "
                  "x-api-key). Each change is a key.* event; only a salted hash of a secret is stored.",
                  no_args_is_help=True)

_VERBATIM: dict[str, Any] = {"markup": False, "emoji": False}
_NAME = typer.Argument(help="The key's name (letters, digits, . _ -); it is the actor of the key's requests.")
_MODELS_HELP = "A model name or fnmatch glob (gemma*, qwen3:*) the key may use; repeat for more. Default: every model."
_GROUP_HELP = ("Put the key in this cache group: keys of one group share sessions, prompt-cache reuse and shared "
               "generations (by default a key shares them with no other key).")
_STORAGE_HELP = ("Bytes of /v1/files storage the key may hold: its uploads and its batches' output and error files "
                 "(1GiB, 500MiB, or bytes). Default: the key_storage_max_mib setting (1 GiB).")
_OPEN_BATCHES_HELP = "Batches the key may have open at once. Default: the key_open_batches_max setting (16)."
_WEIGHT_HELP = ("The key's share of a model's slots against other keys waiting at the same priority, charged in tokens "
                "(prompt + generated): a key of weight 3 is served three times the tokens of one of weight 1. "
                "Default 1; the keyless caller counts as one key of weight 1.")
_CACHE_HELP = ("The response cache for the key's deterministic requests (temperature 0 or a fixed seed): exact (a "
               "repeated request is answered from the cache, never another key's), semantic (also a request whose "
               "prompt's embedding is similar enough: routing.semantic_cache_model), off, or none (no say: the "
               "model's --cache decides). A request's X-Blazar-Cache header decides for itself.")
_PRIORITIZE_HELP = ("Let the key use X-Blazar-Priority and deadlines (X-Blazar-Deadline-Ms) to go ahead in the queue; "
                    "without it they are ignored and the answer says so (x-blazar-ignored).")


def _row(app_: Blazar, k: ApiKey) -> dict[str, Any]:
    """The key as `blazar keys --json` prints it: its public fields, its state now and today's usage (UTC)."""
    now = app_.clock.now()
    used = usage(app_, k.name)
    today = used if used is not None and used.day == int(now // 86400) else None
    state = "revoked" if k.revoked else "expired" if k.expires_ts and k.expires_ts <= now else "live"
    return {**k.public(), "state": state, "requests_today": today.requests_today if today else 0,
            "tokens_today": today.tokens_today if today else 0,
            "audio_seconds_today": round(today.audio_seconds_today, 3) if today else 0.0,
            "storage_used_bytes": storage_of(app_, f"key:{k.name}")}


def _existing(app_: Blazar, name: str) -> ApiKey:
    """Key `name`, which the command just created or changed."""
    found = key(app_, name)
    if found is None:
        raise handlers.KeyCommandError(f"no key named {name!r} (see `blazar keys list`)")
    return found


def _limits_text(k: dict[str, Any]) -> str:
    parts = [f"{f}={k[f]}" for f in handlers.LIMITS if k.get(f) is not None]
    if k.get("cache_group"):
        parts.append(f"cache_group={k['cache_group']}")
    if k.get("may_prioritize"):
        parts.append("may_prioritize")
    if k.get("weight", 1) != 1:
        parts.append(f"weight={k['weight']}")
    if k.get("cache"):
        parts.append(f"cache={k['cache']}")
    return ", ".join(parts) or "-"


def _size(text: str | None) -> int | None:
    try:
        return handlers.parse_size(text)
    except handlers.KeyCommandError as e:
        raise typer.BadParameter(e.message, param_hint="--max-storage") from None


def _print_secret(name: str, secret: str, prefix: str, *, verb: str) -> None:
    err.print(f"{verb} key {name} (prefix {prefix}); its secret, shown this once (store it now: Blazar keeps only a "
              "salted hash):", **_VERBATIM)
    out.print(secret, **_VERBATIM)


def create(
    name: Annotated[str, _NAME],
    models: Annotated[list[str] | None, typer.Option("--models", help=_MODELS_HELP)] = None,
    rpm: Annotated[int | None, typer.Option("--rpm", min=1, help="Requests per minute (sliding 60 s).")] = None,
    tpm: Annotated[int | None, typer.Option("--tpm", min=1, help="Tokens (prompt + completion) per minute.")] = None,
    daily_tokens: Annotated[int | None, typer.Option("--daily-tokens", min=1, help="Tokens per UTC day.")] = None,
    daily_audio_s: Annotated[int | None, typer.Option("--daily-audio-s", min=1, help="Seconds of audio per UTC day "
                                                      "(transcribed or spoken: /v1/audio/*).")] = None,
    max_concurrent: Annotated[int | None, typer.Option(
        "--max-concurrent", min=1, help="Requests running at once (an open stream counts until it ends).")] = None,
    admin: Annotated[bool, typer.Option("--admin", help="May use the admin routes too (/api/blazar/*, pull, delete, "
                                        "copy, /metrics, /ready).")] = False,
    expires: Annotated[str | None, typer.Option("--expires", help="Stop working after this long: 30d, 12h, 90m, "
                                                "3600 (seconds).")] = None,
    cache_group: Annotated[str | None, typer.Option("--cache-group", help=_GROUP_HELP)] = None,
    may_prioritize: Annotated[bool, typer.Option("--may-prioritize", help=_PRIORITIZE_HELP)] = False,
    cache: Annotated[str | None, typer.Option("--cache", help=_CACHE_HELP)] = None,
    max_storage: Annotated[str | None, typer.Option("--max-storage", metavar="SIZE", help=_STORAGE_HELP)] = None,
    max_open_batches: Annotated[int | None, typer.Option("--max-open-batches", min=1,
                                                         help=_OPEN_BATCHES_HELP)] = None,
    weight: Annotated[int, typer.Option("--weight", min=1, max=handlers.WEIGHT_MAX, help=_WEIGHT_HELP)] = 1,
    as_json: bool = JSON_OPTION,
) -> None:
    """Create a key and print its secret, once."""
    max_storage_bytes = _size(max_storage)

    async def go() -> tuple[dict[str, Any], str, Paths]:
        async with opened() as app_:
            rec, secret = await handlers.create(app_, name, models=models, rpm=rpm, tpm=tpm,
                                                daily_tokens=daily_tokens, max_concurrent=max_concurrent,
                                                admin=admin, expires=expires, cache_group=cache_group,
                                                may_prioritize=may_prioritize, daily_audio_s=daily_audio_s,
                                                max_storage_bytes=max_storage_bytes,
                                                max_open_batches=max_open_batches, weight=weight, cache=cache)
            return {**_row(app_, _existing(app_, name)), "seq": rec.seq}, secret, app_.paths

    row, secret, paths = run(go())
    tell_daemon(paths)
    if as_json:
        print_json({"name": name, "secret": secret, **row})
        return
    _print_secret(name, secret, row["prefix"], verb="created")


def list_(as_json: bool = JSON_OPTION) -> None:
    """Every key: scope, limits, state, and today's usage (requests, tokens; UTC)."""

    async def go() -> list[dict[str, Any]]:
        async with opened() as app_:
            return [_row(app_, k) for k in all_keys(app_)]

    rows = run(go())
    if as_json:
        print_json(rows)
        return
    if not rows:
        out.print("no keys: every route is open to whoever reaches the daemon (`blazar keys create NAME`)")
        return
    table = Table("NAME", "PREFIX", "STATE", "ADMIN", "MODELS", "LIMITS", "EXPIRES", "REQUESTS TODAY",
                  "TOKENS TODAY", box=None, header_style="bold")
    for r in rows:
        table.add_row(r["name"], r["prefix"], r["state"], "yes" if r["admin"] else "no",
                      " ".join(r["models"]) or "*", _limits_text(r), fmt_ts(r["expires_ts"]),
                      str(r["requests_today"]), str(r["tokens_today"]))
    out.print(table)


def show(name: Annotated[str, _NAME], as_json: bool = JSON_OPTION) -> None:
    """One key (never its secret, which Blazar does not have)."""

    async def go() -> dict[str, Any]:
        async with opened() as app_:
            return _row(app_, _existing(app_, name))

    row = run(go())
    if as_json:
        print_json(row)
        return
    for field in ("name", "prefix", "state", "admin", "models", "rpm", "tpm", "daily_tokens", "daily_audio_s",
                  "max_concurrent", "max_storage_bytes", "max_open_batches", "cache_group", "may_prioritize", "cache",
                  "weight", "expires_ts", "created_ts", "rotated_ts",
                  "revoked_ts", "actor",
                  "requests_today", "tokens_today", "audio_seconds_today", "storage_used_bytes"):
        value = row.get(field)
        if field.endswith("_ts"):
            value = fmt_ts(value)
        elif field == "models":
            value = " ".join(row["models"]) or "* (every model)"
        out.print(f"{field:19} {'-' if value is None else value}", **_VERBATIM)


def rotate(name: Annotated[str, _NAME], as_json: bool = JSON_OPTION) -> None:
    """Give the key a new secret (printed once); the old one stops working at once."""

    async def go() -> tuple[int, str, str, Paths]:
        async with opened() as app_:
            rec, secret = await handlers.rotate(app_, name)
            return rec.seq, secret, _existing(app_, name).prefix, app_.paths

    seq, secret, prefix, paths = run(go())
    tell_daemon(paths)
    if as_json:
        print_json({"name": name, "secret": secret, "prefix": prefix, "seq": seq})
        return
    _print_secret(name, secret, prefix, verb="rotated")


def revoke(name: Annotated[str, _NAME], as_json: bool = JSON_OPTION) -> None:
    """Revoke the key for good (its name is not reused)."""

    async def go() -> tuple[int, Paths]:
        async with opened() as app_:
            rec = await handlers.revoke(app_, name)
            return rec.seq, app_.paths

    seq, paths = run(go())
    tell_daemon(paths)
    if as_json:
        print_json({"name": name, "revoked": True, "seq": seq})
        return
    out.print(f"revoked key {name}", **_VERBATIM)


def limits(
    name: Annotated[str, _NAME],
    models: Annotated[list[str] | None, typer.Option("--models", help=_MODELS_HELP + " Replaces the scope.")] = None,
    all_models: Annotated[bool, typer.Option("--all-models", help="Let the key use every model.")] = False,
    rpm: Annotated[int | None, typer.Option("--rpm", min=0, help="Requests per minute; 0: no limit.")] = None,
    tpm: Annotated[int | None, typer.Option("--tpm", min=0, help="Tokens per minute; 0: no limit.")] = None,
    daily_tokens: Annotated[int | None, typer.Option("--daily-tokens", min=0, help="Tokens per UTC day; 0: no "
                                                     "limit.")] = None,
    daily_audio_s: Annotated[int | None, typer.Option("--daily-audio-s", min=0, help="Seconds of audio per UTC day; "
                                                      "0: no limit.")] = None,
    max_concurrent: Annotated[int | None, typer.Option("--max-concurrent", min=0, help="Requests at once; 0: no "
                                                       "limit.")] = None,
    cache_group: Annotated[str | None, typer.Option("--cache-group", help=_GROUP_HELP + " \"\": no group.")] = None,
    may_prioritize: Annotated[bool | None, typer.Option("--may-prioritize/--may-not-prioritize",
                                                        help=_PRIORITIZE_HELP)] = None,
    cache: Annotated[str | None, typer.Option("--cache", help=_CACHE_HELP)] = None,
    max_storage: Annotated[str | None, typer.Option("--max-storage", metavar="SIZE",
                                                    help=_STORAGE_HELP + " 0: the default again.")] = None,
    max_open_batches: Annotated[int | None, typer.Option("--max-open-batches", min=0,
                                                         help=_OPEN_BATCHES_HELP + " 0: the default again.")] = None,
    weight: Annotated[int | None, typer.Option("--weight", min=1, max=handlers.WEIGHT_MAX, help=_WEIGHT_HELP)] = None,
    as_json: bool = JSON_OPTION,
) -> None:
    """Change a key's scope, limits or tenancy (only the options given)."""
    if models and all_models:
        raise typer.BadParameter("--models and --all-models exclude each other", param_hint="--all-models")
    max_storage_bytes = _size(max_storage)
    changed: dict[str, Any] = {f: v for f, v in (("rpm", rpm), ("tpm", tpm), ("daily_tokens", daily_tokens),
                                                 ("daily_audio_s", daily_audio_s), ("max_concurrent", max_concurrent),
                                                 ("cache_group", cache_group), ("may_prioritize", may_prioritize),
                                                 ("cache", cache),
                                                 ("max_storage_bytes", max_storage_bytes),
                                                 ("max_open_batches", max_open_batches), ("weight", weight))
                               if v is not None}
    if models or all_models:
        changed["models"] = [] if all_models else models

    async def go() -> tuple[dict[str, Any], bool, Paths]:
        async with opened() as app_:
            rec = await handlers.change_limits(app_, name, changed)
            return _row(app_, _existing(app_, name)), rec is not None, app_.paths

    row, did, paths = run(go())
    if did:
        tell_daemon(paths)
    if as_json:
        print_json({**row, "changed": did})
        return
    out.print(f"key {name}: models {' '.join(row['models']) or '*'}; limits {_limits_text(row)}"
              + ("" if did else " (unchanged)"), **_VERBATIM)


app.command("create")(create)
app.command("list")(list_)
app.command("show")(show)
app.command("rotate")(rotate)
app.command("revoke")(revoke)
app.command("limits")(limits)
