"""`blazar launch`'s decisions, apart from the terminal: which model the launched command is pointed at, the
short-lived key it gets when keys are on (minted and revoked through the key handlers, so both are key.* events),
the environment that points the OpenAI, Anthropic and Ollama SDKs at this gateway, and the exit code passed on."""

from __future__ import annotations

import os
import re
import secrets
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from blazar.context import Blazar
from blazar.errors import ModelNotFound
from blazar.events.base import Recorded
from blazar.operations import keys
from blazar.projections.catalog import CatalogState, models, stored
from blazar.projections.keys import auth_on

KEY_NAME_PREFIX = "launch-"
DEFAULT_EXPIRES = "12h"
# What the SDKs get for a key while keys are off: they refuse an empty one, and the gateway reads none then.
PLACEHOLDER_KEY = "blazar-no-key"
MODEL_VARS = ("OPENAI_MODEL", "ANTHROPIC_MODEL")
# A credential for the real Anthropic API would be sent here before ANTHROPIC_API_KEY (Authorization comes first).
DROPPED_VARS = ("ANTHROPIC_AUTH_TOKEN",)
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
# The shell's convention for a command that could not be run.
NOT_FOUND_EXIT = 127
NOT_EXECUTABLE_EXIT = 126
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Target:
    """The model the command is pointed at: as the user wrote it (what OPENAI_MODEL says) and as the store names
    it (what a scoped key's --models holds). None when it was not given and the store has not exactly one."""

    asked: str
    name: str


@dataclass(frozen=True)
class LaunchKey:
    name: str
    secret: str
    created: Recorded


def pick_model(catalog: CatalogState, asked: str | None) -> Target | None:
    """`--model` when given (it must be in the store); else the store's only model; else none (the command chooses)."""
    if asked is not None:
        entry = stored(catalog, asked)
        if entry is None:
            raise ModelNotFound(f"no model named {asked!r} in the store (see `blazar list`)")
        return Target(asked=asked, name=entry.name)
    names = [m.name for m in models(catalog)]
    return Target(asked=names[0], name=names[0]) if len(names) == 1 else None


def key_name(command: str, *, now: float) -> str:
    """`launch-<command>-<UTC time>-<random>`: `blazar keys list` (and the actor of its requests) says what it is."""
    base = _UNSAFE.sub("-", os.path.basename(command)).strip("-._")[:20] or "cmd"
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%S")
    return f"{KEY_NAME_PREFIX}{base}-{stamp}-{secrets.token_hex(3)}"


async def mint(app: Blazar, command: str, target: Target | None, *, expires: str) -> LaunchKey | None:
    """A key for the launched command when keys are on (none when off: minting one would turn auth on for every
    client). Never admin; scoped to the model when one was asked for; expiring, so a launch killed before it could
    revoke leaves a key that stops working on its own."""
    keys.expiry_ts(expires, now=app.clock.now())  # a bad --expires is refused before anything is recorded
    if not auth_on(app.runner.state("keys")):
        return None
    name = key_name(command, now=app.clock.now())
    scope = [target.name] if target is not None else None
    rec, secret = await keys.create(app, name, models=scope, admin=False, expires=expires)
    return LaunchKey(name=name, secret=secret, created=rec)


async def revoke(app: Blazar, name: str) -> Recorded:
    return await keys.revoke(app, name)


def gateway_env(base: Mapping[str, str], *, url: str, secret: str | None, model: str | None,
                ca_bundle: Path | None = None, ca_file: str | None = None) -> dict[str, str]:
    """`base` with every variable that points the OpenAI, Anthropic and Ollama SDKs (and tools built on them) at
    the gateway at `url`. With https (`ca_bundle`: the usual roots plus the daemon's certificate) the SDKs trust it."""
    env = {k: v for k, v in base.items() if k not in DROPPED_VARS and k not in MODEL_VARS}
    key = secret or PLACEHOLDER_KEY
    env.update(OPENAI_BASE_URL=f"{url}/v1", OPENAI_API_KEY=key, ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY=key,
               OLLAMA_HOST=url, OLLAMA_API_KEY=key)
    if model is not None:
        env.update(dict.fromkeys(MODEL_VARS, model))
    if ca_bundle is not None:
        env["SSL_CERT_FILE"] = env["REQUESTS_CA_BUNDLE"] = str(ca_bundle)
    if ca_file is not None:
        env["NODE_EXTRA_CA_CERTS"] = ca_file  # Node adds it to its roots (Node ignores SSL_CERT_FILE)
    if any(v in base for v in PROXY_VARS):
        host = url.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
        for var in ("NO_PROXY", "no_proxy"):
            env[var] = ",".join(p for p in (base.get(var), host) if p)
    return env


def write_ca_bundle(target: Path, ca_file: str, base: Mapping[str, str]) -> Path:
    """The roots the command trusted before (SSL_CERT_FILE, else the system's) plus the daemon's certificate (often
    self-signed): SSL_CERT_FILE replaces the roots, so it must keep them for the command's other https."""
    roots = base.get("SSL_CERT_FILE") or ssl.get_default_verify_paths().cafile
    parts = []
    if roots and Path(roots).is_file():
        parts.append(Path(roots).read_bytes().rstrip(b"\n") + b"\n")
    parts.append(Path(ca_file).read_bytes())
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(b"".join(parts))
    os.replace(tmp, target)
    return target


def exit_code_of(returncode: int) -> int:
    """A command that died of signal N exits 128+N, as a shell reports it."""
    return 128 - returncode if returncode < 0 else returncode
