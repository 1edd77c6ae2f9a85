"""Who is calling: the principal the auth middleware (blazar/api/auth.py) found for a request, and the model scope
check the gateway makes with it once the model is resolved. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from blazar.handlers.limits import KeyLimits


@dataclass(frozen=True, slots=True)
class Principal:
    """A key (`key` is its row in the keys projection, read live) or the CLI's admin token (`key` is None)."""

    actor: str  # "key:<name>" or "cli:<os user>"
    admin: bool
    key: dict[str, Any] | None = None

    @property
    def key_name(self) -> str | None:
        return None if self.key is None else str(self.key["name"])

    def limits(self) -> KeyLimits | None:
        return None if self.key is None else KeyLimits.of(self.key)

    def allows(self, *names: str | None) -> bool:
        """A model is in scope when one of its names (as the client wrote it, the store's) matches a pattern; a key
        with no patterns may use every model."""
        patterns = self.key.get("models") if self.key is not None else None
        if not patterns:
            return True
        return any(fnmatchcase(n, p) for p in patterns for n in names if n)


def is_admin(principal: Principal | None) -> bool:
    """With auth off there is no principal, and every caller may do everything (as before keys existed)."""
    return principal is None or principal.admin


def scope_refusal(principal: Principal, asked: str, name: str) -> str:
    key = principal.key or {}
    shown = asked if asked == name else f"{asked} (the model {name})"
    return (f"key {key.get('name')!r} may not use {shown}: its scope is --models "
            + " ".join(repr(p) for p in key.get("models") or [])
            + f"; a key whose --models matches {name!r} would allow it (`blazar keys limits {key.get('name')} "
            f"--models {name}`)")
