"""HTTP to engine children: one keep-alive connection pool on loopback for every instance, raw bytes in and out.

The gateway never re-encodes what the engine streams; this module only opens the exchange and hands back the
response whose body the caller relays. Token counting (`count_tokens`) uses the engine's own tokenizer.

A child on a Unix socket (piper: blazar/adapters/engines/kinds.py) has a base URL of `http+unix://` and the socket's
path (`unix_base`): it gets a pool of its own, dropped once its socket is gone.

NOTE: aiohttp, not httpx2, on this hop: every SSE event the engine writes wakes the relay on its own, and reading
one costs httpx2 (httpcore2, h11, an anyio cancel scope per read) about twice what aiohttp's C parser does
(`bench/client_cost.py`). On two cores that CPU comes out of the engine's decode.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

import aiohttp
import orjson

from blazar.errors import EngineStreamBroken, EngineUnreachable

# No read deadline on a generation: a long answer streams for minutes. Connecting to a loopback child is instant or
# the child is gone; a pool wait means every connection is busy, which admission already bounds.
TIMEOUT = aiohttp.ClientTimeout(total=None, connect=5.0, sock_connect=5.0, sock_read=None)
COUNT_TIMEOUT_S = 30.0
# llama-server (cpp-httplib) closes a keep-alive connection idle for 5 s; drop ours before that.
KEEPALIVE_EXPIRY_S = 3.0
# Waits before each retry of a request the engine dropped unanswered (the last entry is never slept).
RETRY_BACKOFF_S = (0.0, 0.05, 0.25, 0.0)
# Broken mid-answer: the connection dropped, or the body ended short of what it announced.
_BROKEN = (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, asyncio.IncompleteReadError)
# A child's base URL when it listens on a Unix socket: this, then the socket's absolute path.
UNIX = "http+unix://"


def unix_base(socket: str | os.PathLike[str]) -> str:
    """The base URL of a child listening on the Unix socket at `socket`."""
    return UNIX + os.fspath(socket)


def engine_headers(api_key: str | None) -> dict[str, str]:
    """The headers of a request to a child: JSON, and the child's own key when it has one."""
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    return headers


def _keepalive(block: bytes) -> bool:
    """SSE comment lines only: an engine's keep-alive, no event."""
    return all(not line or line.startswith(b":") for line in block.split(b"\n"))


class Upstream(Protocol):
    """What a relay reads an engine's answer from: an EngineResponse, or the response cache's stored answer
    (blazar/serving/response_cache.py) played back as the engine sent it."""

    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def is_closed(self) -> bool: ...
    def aiter_raw(self, heartbeat_s: float | None = None) -> AsyncIterator[bytes]: ...
    async def aread(self) -> bytes: ...
    async def aclose(self) -> None: ...


class EngineResponse:
    """An engine's answer with its body unread: its status and headers, its raw bytes as they come (`aiter_raw`) or
    whole (`aread`), and `aclose` (which, before the end, drops the connection: llama-server then stops generating).
    A body that breaks raises EngineStreamBroken."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp

    @property
    def status_code(self) -> int:
        return self._resp.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._resp.headers

    @property
    def is_closed(self) -> bool:
        return self._resp.closed

    async def aiter_raw(self, heartbeat_s: float | None = None) -> AsyncIterator[bytes]:
        """The body's bytes as they come. With `heartbeat_s`, until the engine's first event: b"" for each
        `heartbeat_s` it stays silent (reading a long prompt) and for each keep-alive it sends meanwhile
        (llama-server's `:` comment, every --sse-ping-interval: no token, and no event a client of another dialect
        could read), so the relay can keep its client waiting in the client's own dialect. From the first event on,
        the bytes alone. A read with data waiting returns at once: no task, no extra turn of the loop."""
        content = self._resp.content
        try:
            while heartbeat_s is not None:
                try:
                    async with asyncio.timeout(heartbeat_s):
                        data = await content.readany()  # cancelled by the timeout, it loses nothing
                except TimeoutError:
                    yield b""
                    continue
                if not data:
                    return
                if _keepalive(data):
                    yield b""
                    continue
                yield data
                break
            async for data in content.iter_any():
                yield data
        except _BROKEN as e:
            raise EngineStreamBroken(f"{type(e).__name__}: {e}") from e

    async def aread(self) -> bytes:
        try:
            return await self._resp.read()
        except _BROKEN as e:
            raise EngineStreamBroken(f"{type(e).__name__}: {e}") from e

    async def aclose(self) -> None:
        if self._resp.content.at_eof():
            self._resp.release()  # read to the end: the connection goes back to the pool
        else:
            self._resp.close()


class EngineClient:
    def __init__(self, *, max_connections: int = 512) -> None:
        self._max_connections = max_connections
        self._http: aiohttp.ClientSession | None = None
        self._unix: dict[str, aiohttp.ClientSession] = {}  # a pool per Unix socket, by its path

    def _session(self) -> aiohttp.ClientSession:
        """The pool, made in the running loop on first use."""
        if self._http is None or self._http.closed:
            connector = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0,
                                             keepalive_timeout=KEEPALIVE_EXPIRY_S, use_dns_cache=False)
            self._http = _pool(connector)
        return self._http

    async def _target(self, base_url: str, path: str) -> tuple[aiohttp.ClientSession, str]:
        """The pool and the URL that reach `path` of the child at `base_url`."""
        if not base_url.startswith(UNIX):
            return self._session(), base_url + path
        socket = base_url[len(UNIX):]
        pool = self._unix.get(socket)
        if pool is None or pool.closed:
            others = [s for s in self._unix if s != socket]
            gone = await asyncio.to_thread(lambda: [s for s in others if not os.path.exists(s)])  # children exited
            for dead in gone:
                if (old := self._unix.pop(dead, None)) is not None:
                    await old.close()
            pool = self._unix[socket] = _pool(aiohttp.UnixConnector(
                path=socket, limit=self._max_connections, keepalive_timeout=KEEPALIVE_EXPIRY_S))
        return pool, "http://localhost" + path

    async def open(self, base_url: str, path: str, body: bytes, *, api_key: str | None = None,
                   headers: dict[str, str] | None = None) -> EngineResponse:
        """POST `body` (JSON) and return the response with its body unread: stream it with `aiter_raw()`, then
        `aclose()` it. Closing early drops the connection, which makes llama-server cancel the generation. `api_key`
        is the child's own secret (never a client's Authorization: only these headers are sent)."""
        session, url = await self._target(base_url, path)
        for attempt, backoff_s in enumerate(RETRY_BACKOFF_S, 1):
            try:
                sent = engine_headers(api_key) if not headers else engine_headers(api_key) | headers
                resp = await session.post(url, data=body, headers=sent)
                return EngineResponse(resp)
            except aiohttp.ClientConnectorError as e:  # nothing listens there: the child is gone
                raise EngineUnreachable(f"the engine at {base_url} did not answer {path}: {e}") from e
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
                # The engine closed the connection without answering: a pooled one it had just closed (its
                # keep-alive limit), or a new one its HTTP threads had no room for (other clients of the same
                # child hold them). Nothing was processed, so a retry on a fresh connection is safe; after the
                # last one the failure is the engine's.
                if attempt == len(RETRY_BACKOFF_S):
                    raise EngineUnreachable(f"the engine at {base_url} did not answer {path}: {e}") from e
                await asyncio.sleep(backoff_s)
            except aiohttp.ClientError as e:
                raise EngineUnreachable(f"the engine at {base_url} did not answer {path}: {e}") from e
        raise AssertionError("unreachable")

    async def post_json(self, base_url: str, path: str, payload: dict[str, Any], *, api_key: str | None = None,
                        timeout_s: float = COUNT_TIMEOUT_S) -> tuple[int, Any]:
        """A small JSON exchange (a token count, a slot action): the status and the parsed answer (None when it is
        not JSON). EngineUnreachable when the engine does not answer within `timeout_s`. A connection the engine
        closed without answering (a pooled one past its keep-alive) is retried on a fresh one, as `open` does."""
        session, url = await self._target(base_url, path)
        for attempt, backoff_s in enumerate(RETRY_BACKOFF_S, 1):
            try:
                async with session.post(url, data=orjson.dumps(payload), headers=engine_headers(api_key),
                                        timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                    status, content = r.status, await r.read()
                break
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
                if attempt == len(RETRY_BACKOFF_S):
                    raise EngineUnreachable(f"the engine at {base_url} did not answer {path}: {e}") from e
                await asyncio.sleep(backoff_s)
            except (aiohttp.ClientError, TimeoutError) as e:
                raise EngineUnreachable(f"the engine at {base_url} did not answer {path}: {e}") from e
        try:
            return status, orjson.loads(content)
        except orjson.JSONDecodeError:
            return status, None

    async def count_tokens(self, base_url: str, route: str, body: dict[str, Any], *, api_key: str | None = None
                           ) -> int | None:
        """Prompt tokens of a request as the engine will see them (chat template applied), or None when this engine
        cannot say. Chat and responses have llama-server's `<route>/input_tokens`; completions use /tokenize."""
        if route in ("/v1/chat/completions", "/v1/responses"):
            status, data = await self.post_json(base_url, f"{route}/input_tokens", body, api_key=api_key)
            if status == 200 and isinstance(data, dict) and isinstance(data.get("input_tokens"), int):
                return int(data["input_tokens"])
            return None
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return None
        status, data = await self.post_json(base_url, "/tokenize", {"content": prompt, "add_special": True},
                                            api_key=api_key)
        if status == 200 and isinstance(data, dict) and isinstance(data.get("tokens"), list):
            return len(data["tokens"])
        return None

    async def slot_action(self, base_url: str, slot_id: int, action: str, filename: str, *,
                          api_key: str | None = None, timeout_s: float = COUNT_TIMEOUT_S) -> tuple[int, Any]:
        """llama-server's `POST /slots/{id}?action=save|restore` of `filename` (in the child's --slot-save-path)."""
        return await self.post_json(base_url, f"/slots/{slot_id}?action={action}", {"filename": filename},
                                    api_key=api_key, timeout_s=timeout_s)

    async def metrics(self, base_url: str, *, api_key: str | None = None,
                      timeout_s: float = COUNT_TIMEOUT_S) -> dict[str, float]:
        """llama-server's `GET /metrics` (started with --metrics), its unlabelled samples by name without the
        `llamacpp:` prefix. EngineUnreachable when it does not answer 200 within `timeout_s`."""
        session, url = await self._target(base_url, "/metrics")
        try:
            async with session.get(url, headers=engine_headers(api_key),
                                   timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                status, content = r.status, await r.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise EngineUnreachable(f"the engine at {base_url} did not answer /metrics: {e}") from e
        if status != 200:
            raise EngineUnreachable(f"the engine at {base_url} answered /metrics with {status}")
        return parse_metrics(content.decode("utf-8", "replace"))

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
        for pool in self._unix.values():
            await pool.close()
        self._unix.clear()


def _pool(connector: aiohttp.BaseConnector) -> aiohttp.ClientSession:
    # No cookie jar: an engine sets none, and the jar's filtering is work on every request.
    return aiohttp.ClientSession(connector=connector, timeout=TIMEOUT, auto_decompress=False, trust_env=False,
                                 cookie_jar=aiohttp.DummyCookieJar(),
                                 skip_auto_headers=("User-Agent", "Accept-Encoding"))


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text → {name: value} for the unlabelled samples ("llamacpp:" dropped; comments and labelled series,
    such as the per-position acceptance, skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or "{" in line:
            continue
        name, _, value = line.partition(" ")
        try:
            out[name.removeprefix("llamacpp:")] = float(value.split()[0])
        except (ValueError, IndexError):
            continue
    return out
