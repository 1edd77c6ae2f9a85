"""Remote engines: registering them (`blazar remote add|rm`), the request's way to one (a stand-in `Instance` whose
base URL is the remote's), and its circuit breaker fed by health checks and by the requests themselves.

    add / remove       validated, recorded (remote.added / remote.removed); the key stays in the environment
    RemoteBreaker      per remote: `remote_circuit_failures` failures in a row open it for `remote_circuit_s`
                       (recorded); requests meanwhile are refused at once with 503 remote_unavailable; one success
                       closes it (recorded)
    health loop        the daemon asks each remote's GET /v1/models every `remote_health_s`
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from blazar.context import Blazar
from blazar.errors import RemoteCommandError
from blazar.events.base import Recorded
from blazar.events.bounds import REMOTE_MODELS_MAX
from blazar.events.models import ModelMetadata
from blazar.events.remotes import CircuitSource, RemoteAdded, RemoteCircuitClosed, RemoteCircuitOpened, RemoteRemoved
from blazar.instances.supervisor import Instance, ResolvedModel
from blazar.projections.catalog import stored
from blazar.projections.remotes import Remote, remote, remotes, serving

log = logging.getLogger("blazar.remotes")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_MODEL = re.compile(r"[^\x00-\x20\x7f]{1,256}")
REMOTE_CTX = 1 << 30  # a remote's context is its own business: the gateway's cheap bound never refuses for it
HEALTH_TIMEOUT_S = 10.0


def normalize_url(url: str) -> str:
    """The remote's API root as the engine paths (/v1/...) are joined to it: no trailing /v1 or slash."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteCommandError(f"invalid remote URL {url!r}: expected http(s)://HOST[:PORT][/PATH]")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise RemoteCommandError("a remote URL takes no query, fragment or credentials (the key comes from "
                                 "--api-key-env)")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return f"{parts.scheme}://{parts.netloc}{path}"


async def add_remote(app: Blazar, name: str, url: str, models: list[str], *, api_key_env: str | None = None,
                     max_concurrent: int = 4) -> Recorded:
    await app.runner.catch_up()
    if not _NAME.fullmatch(name):
        raise RemoteCommandError(f"invalid remote name {name[:64]!r}: 1-64 letters, digits, '.', '_' and '-'")
    if not models:
        raise RemoteCommandError("name the model(s) it serves: --models M [--models M2 ...]")
    if len(set(models)) > REMOTE_MODELS_MAX:
        raise RemoteCommandError(f"{len(set(models))} models; a remote serves at most {REMOTE_MODELS_MAX} by name")
    catalog = app.runner.state("catalog")
    for m in models:
        if not _MODEL.fullmatch(m):
            raise RemoteCommandError(f"invalid model name {m[:64]!r}")
        if stored(catalog, m) is not None:
            raise RemoteCommandError(f"{m} is a model in the store: a remote serves names the store does not have "
                                     "(blazar rm it, or name the remote's model differently)")
        other = serving(app.runner.state("remotes"), m)
        if other is not None and other.name != name:
            raise RemoteCommandError(f"{m} is already served by the remote {other.name}")
    if api_key_env is not None and not _ENV.fullmatch(api_key_env):
        raise RemoteCommandError(f"invalid environment variable name {api_key_env[:64]!r}")
    if not 1 <= max_concurrent <= 10_000:
        raise RemoteCommandError("--max-concurrent must be from 1 to 10000")
    (rec,) = await app.record(RemoteAdded(name=name, url=normalize_url(url), models=sorted(set(models)),
                                          api_key_env=api_key_env, max_concurrent=max_concurrent))
    return rec


async def remove_remote(app: Blazar, name: str) -> Recorded:
    await app.runner.catch_up()
    if remote(app.runner.state("remotes"), name) is None:
        raise RemoteCommandError(f"no remote named {name!r} (blazar remote list shows them)")
    (rec,) = await app.record(RemoteRemoved(name=name))
    return rec


def resolved_remote(model: str) -> ResolvedModel:
    """A remote's model as the pipeline resolves it: a name, no file, no GGUF to read."""
    return ResolvedModel(name=model, path=Path("/dev/null"), metadata=ModelMetadata(architecture="remote", name=model))


def remote_instance(r: Remote, model: str, api_key: str | None) -> Instance:
    """The stand-in instance a request to a remote runs on: its URL, its concurrency as slots, the key read from the
    environment just now."""
    return Instance(instance_id=f"remote:{r.name}", model=model, port=0, slots=r.max_concurrent,
                    ctx_tokens=REMOTE_CTX, engine_tag=f"remote:{r.name}", api_key=api_key, served_as=model,
                    url=r.url)


@dataclass
class _Counts:
    failures: int = 0
    last_reason: str = ""
    closed_logged: bool = True


@dataclass
class RemoteBreaker:
    """Consecutive failures per remote, and the circuit events they cause."""

    app: Blazar
    _counts: dict[str, _Counts] = field(default_factory=dict)

    def open_now(self, name: str) -> Remote | None:
        """The remote when its circuit is open now (requests are refused), else None."""
        r = remote(self.app.runner.state("remotes"), name)
        return r if r is not None and r.open_at(self.app.clock.now()) else None

    async def failed(self, name: str, reason: str, *, source: CircuitSource) -> None:
        settings = self.app.settings()
        c = self._counts.setdefault(name, _Counts())
        c.failures += 1
        c.last_reason = reason
        if c.failures >= settings.routing.remote_circuit_failures and self.open_now(name) is None \
                and remote(self.app.runner.state("remotes"), name) is not None:
            c.closed_logged = False
            await self.app.record(RemoteCircuitOpened(
                name=name, failures=c.failures, reason=reason[:300], source=source,
                open_until=self.app.clock.now() + settings.routing.remote_circuit_s))

    async def succeeded(self, name: str, latency_ms: float | None = None) -> None:
        c = self._counts.setdefault(name, _Counts())
        c.failures = 0
        r = remote(self.app.runner.state("remotes"), name)
        if r is not None and r.circuit_open_until is not None:
            await self.app.record(RemoteCircuitClosed(name=name, latency_ms=latency_ms))


async def check_health(app: Blazar, breaker: RemoteBreaker, session: aiohttp.ClientSession) -> None:
    """Ask every remote's GET /v1/models once; feed the breaker."""
    for r in remotes(app.runner.state("remotes")):
        key = app.env.get(r.api_key_env) if r.api_key_env else None
        headers = {"authorization": f"Bearer {key}"} if key else {}
        started = time.perf_counter()
        try:
            async with session.get(r.url + "/v1/models", headers=headers,
                                   timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)) as resp:
                ok = resp.status < 500
                why = f"GET /v1/models answered {resp.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            ok, why = False, f"GET /v1/models failed: {type(e).__name__}: {e}"
        if ok:
            await breaker.succeeded(r.name, round((time.perf_counter() - started) * 1000, 3))
        else:
            await breaker.failed(r.name, why, source="health_check")


async def health_loop(app: Blazar, breaker: RemoteBreaker) -> None:
    """The daemon's health checks of its remotes, every `remote_health_s` (a failed round never ends the loop; a
    changed interval counts within a second)."""
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as session:
        while True:
            checked = loop.time()
            try:
                if remotes(app.runner.state("remotes")):
                    await check_health(app, breaker, session)
            except Exception:
                log.exception("remote health check")
            await _until_due(loop, checked, app)


async def _until_due(loop: asyncio.AbstractEventLoop, checked: float, app: Blazar) -> None:
    """Sleep until `routing.remote_health_s` after `checked`, reading the setting again every second (a change
    counts)."""
    for _ in range(int(app.settings().routing.remote_health_s) + 2):  # bounded: the interval, a second at a time
        left = app.settings().routing.remote_health_s - (loop.time() - checked)
        if left <= 0:
            return
        await asyncio.sleep(min(1.0, left))
