"""Who is calling: the principal the auth middleware (blazar/api/auth.py) found for a request, and the model scope
check the gateway makes with it once the model is resolved. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from blazar.projections.keys import ApiKey
from blazar.serving.limits import KeyLimits


@dataclass(frozen=True, slots=True)
class Principal:
    """A key (`key` is the keys projection's record of it when the request came in) or the CLI's admin token
    (`key` is None)."""

    actor: str  # "key:<name>", "cli:<os user>", or "cluster:node" (another node, with the cluster key)
    admin: bool
    key: ApiKey | None = None
    cluster: bool = False  # another gateway of the cluster: it may forward requests and ask for a pull

    @property
    def key_name(self) -> str | None:
        return None if self.key is None else self.key.name

    @property
    def models(self) -> tuple[str, ...]:
        """The key's model patterns; () for the admin token or a key with no scope (every model)."""
        return () if self.key is None else self.key.models

    def limits(self) -> KeyLimits | None:
        return None if self.key is None else KeyLimits.of(self.key)

    def allows(self, *names: str | None) -> bool:
        """A model is in scope when one of its names (as the client wrote it, the store's) matches a pattern; a key
        with no patterns may use every model."""
        patterns = self.models
        if not patterns:
            return True
        return any(fnmatchcase(n, p) for p in patterns for n in names if n)


def is_admin(principal: Principal | None) -> bool:
    """With auth off there is no principal, and every caller may do everything (as before keys existed)."""
    return principal is None or principal.admin


def scope_refusal(principal: Principal, asked: str, name: str) -> str:
    key_name = principal.key_name
    shown = asked if asked == name else f"{asked} (the model {name})"
    return (f"key {key_name!r} may not use {shown}: its scope is --models "
            + " ".join(repr(p) for p in principal.models)
            + f"; a key whose --models matches {name!r} would allow it (`blazar keys limits {key_name} "
            f"--models {name}`)")
