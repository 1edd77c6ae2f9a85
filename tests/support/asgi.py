"""Falcon's ASGIConductor as a local client would use it: Host `localhost` (falcon's default, falconframework.org,
is refused by the gateway's Host guard, as any name a loopback bind does not answer to)."""

from __future__ import annotations

from typing import Any

from falcon.testing import ASGIConductor


class LocalConductor(ASGIConductor):
    async def simulate_request(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("host", "localhost")
        return await super().simulate_request(*args, **kwargs)
