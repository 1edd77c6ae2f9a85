"""API keys as the api and `blazar keys` read them: whether auth is on, each key typed (never its secret, which
Blazar does not have) and its usage today. The auth middleware (blazar/api/auth.py) reads the live state it is handed
on every request, through the keys projection's readers re-exported here (no wrapper on that path)."""

from __future__ import annotations

from blazar.context import Blazar
from blazar.projections import keys, metrics
from blazar.projections.keys import ApiKey, KeysState, auth_on, live_by_prefix
from blazar.projections.metrics import KeyUsage

__all__ = ["ApiKey", "KeyUsage", "KeysState", "all_keys", "auth_on", "key", "keys_on", "live_by_prefix", "usage"]


def keys_on(app: Blazar) -> bool:
    """Auth is on: at least one key is not revoked."""
    return auth_on(app.runner.state("keys"))


def key(app: Blazar, name: str) -> ApiKey | None:
    """The key named `name` (revoked ones too), or None."""
    return keys.key(app.runner.state("keys"), name)


def all_keys(app: Blazar) -> list[ApiKey]:
    """Every key (revoked ones too), by name."""
    return keys.keys(app.runner.state("keys"))


def usage(app: Blazar, name: str) -> KeyUsage | None:
    """Key `name`'s requests and tokens on the UTC day of its latest ended request, or None before its first."""
    return metrics.key_usage(app.runner.state("metrics"), name)
