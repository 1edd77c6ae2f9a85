"""HTTP to engine children: one keep-alive connection pool on loopback for every instance, raw bytes in and out.

The gateway never re-encodes what the engine streams; this module only opens the exchange and hands back the
response whose body the caller relays. Token counting (`count_tokens`) uses the engine's own tokenizer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2
import orjson

from blazar.errors import EngineUnreachable

# No read deadline on a generation: a long answer streams for minutes. Connecting to a loopback child is instant or
# the child is gone; a pool wait means every connection is busy, which admission already bounds.
TIMEOUT = httpx2.Timeout(connect=5.0, read=None, write=30.0, pool=None)
COUNT_TIMEOUT_S = 30.0
# llama-server (cpp-httplib) closes a keep-alive connection idle for 5 s; drop ours before that.
KEEPALIVE_EXPIRY_S = 3.0
# Waits before each retry of a request the engine dropped unanswered (the last entry is never slept).
RETRY_BACKOFF_S = (0.0, 0.05, 0.25, 0.0)


def engine_headers(api_key: str | None) -> dict[str, str]:
    """The headers of a request to a child: JSON, and the child's own key when it has one."""
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    return headers




class EngineClient:
    def __init__(self, *, max_connections: int = 512, transport: httpx2.AsyncBaseTransport | None = None) -> None:
        """`transport` replaces the network (tests: a mock engine that sees exactly what a child would)."""
        self._http = httpx2.AsyncClient(
            timeout=TIMEOUT, trust_env=False, transport=transport,
            limits=httpx2.Limits(max_connections=max_connections, max_keepalive_connections=max_connections,
                                 keepalive_expiry=KEEPALIVE_EXPIRY_S),
        )

    async def open(self, base_url: str, path: str, body: bytes, *, api_key: str | None = None) -> httpx2.Response:
        """POST `body` (JSON) and return the response with its body unread: stream it with `aiter_raw()`, then
        `aclose()` it. Closing early drops the connection, which makes llama-server cancel the generation. `api_key`
        is the child's own secret (never a client's Authorization: only these headers are sent)."""
        for attempt, backoff_s in enumerate(RETRY_BACKOFF_S, 1):
            req = self._http.build_request("POST", base_url + path, content=body, headers=engine_headers(api_key))
            try:
                return await self._http.send(req, stream=True)
            except (httpx2.RemoteProtocolError, httpx2.ReadError) as e:
                # The engine closed the connection without answering: a pooled one it had just closed (its
                # keep-alive limit), or a new one its HTTP threads had no room for (other clients of the same
                # child hold them). Nothing was processed, so a retry on a fresh connection is safe; after the
                # last one the failure is the engine's.
                if attempt == len(RETRY_BACKOFF_S):
                    raise EngineUnreachable(f"the engine at {base_url} did not answer {path}: {e}") from e
                await asyncio.sleep(backoff_s)
            except httpx2.TransportError as e:
                raise EngineUnreachable(f"the engine at {base_url} did not answer {path}: {e}") from e
        raise AssertionError("unreachable")

    async def post_json(self, base_url: str, path: str, payload: dict[str, Any], *, api_key: str | None = None
                        ) -> tuple[int, Any]:
        try:
            r = await self._http.post(base_url + path, content=orjson.dumps(payload), headers=engine_headers(api_key),
                                      timeout=COUNT_TIMEOUT_S)
        except httpx2.TransportError as e:
            raise EngineUnreachable(f"the engine at {base_url} did not answer {path}: {e}") from e
        try:
            return r.status_code, orjson.loads(r.content)
        except orjson.JSONDecodeError:
            return r.status_code, None

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

    async def aclose(self) -> None:
        await self._http.aclose()
