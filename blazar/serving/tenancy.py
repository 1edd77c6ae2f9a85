"""Keys are tenants: whose prompts, sessions, prompt-cache reuse and shared generations a request belongs to, and
whether its caller may go ahead of others in the queue. Pure.

A tenant is a key (`key:<name>`), or the cache group an admin put it in (`group:<name>`): keys of one group share
on purpose. The machine's owner (no keys at all, or the CLI's admin token) is the tenant None, as before keys
existed. A request forwarded by another node runs as the tenant that node found (`x-blazar-tenant`, believed only
with the cluster key).

Session names live in their tenant's namespace: the name a client gives is stored as `<tenant>/<name>` (a client's
name never holds a "/"), so two keys' sessions named "chat-1" are two sessions.
"""

from __future__ import annotations

import re

from blazar.events.sessions import qualify, split_session
from blazar.serving.principal import Principal

__all__ = ["IGNORED_HEADER", "TENANT_HEADER", "may_prioritize", "qualify", "split_session", "tenant_named",
           "tenant_of"]

TENANT_HEADER = "x-blazar-tenant"  # on a hop between nodes: the tenant the first node found
IGNORED_HEADER = "x-blazar-ignored"  # what the caller asked that its key has no right to
_TENANT = re.compile(r"(?:key|group):[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def tenant_of(principal: Principal | None, forwarded: str | None = None) -> str | None:
    """The tenant a request runs as; None for the machine's owner (keys off, or the CLI's admin token)."""
    if principal is None:
        return None
    if principal.cluster:
        return forwarded if forwarded is not None and _TENANT.fullmatch(forwarded) else None
    key = principal.key
    if key is None:
        return None
    return f"group:{key.cache_group}" if key.cache_group else f"key:{key.name}"


def may_prioritize(principal: Principal | None) -> bool:
    """X-Blazar-Priority and deadlines are a right: the owner's, an admin's, and a key's made `--may-prioritize`.
    A hop from another node keeps what that node allowed (it forwards neither)."""
    if principal is None or principal.admin or principal.cluster or principal.key is None:
        return True
    return principal.key.may_prioritize


def tenant_named(key: str | None = None, group: str | None = None) -> str | None:
    """The tenant an admin names (`--key NAME`, `--group NAME`, `?key=`, `?group=`); None: the owner's."""
    if key is not None and group is not None:
        raise ValueError("name a key or a group, not both")
    tenant = f"key:{key}" if key is not None else f"group:{group}" if group is not None else None
    if tenant is not None and not _TENANT.fullmatch(tenant):
        raise ValueError(f"not a key or group name: {(key or group or '')[:64]!r}")
    return tenant
