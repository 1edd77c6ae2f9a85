"""The engine client and the readiness poll against a child on a Unix socket (how the piper child listens: no TCP
port, blazar/adapters/engines/kinds.py): reached by its `http+unix://` base URL, with its own pool, dropped once its
socket is gone; a socket nobody listens on is unreachable at once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from blazar.adapters.engines.client import EngineClient, unix_base
from blazar.adapters.engines.process import spawn, stop_process, wait_healthy
from blazar.errors import EngineUnreachable
from tests.support.bounds import HANG_S


@contextlib.asynccontextmanager
async def on_socket(path: Path, seen: list[bytes]) -> AsyncIterator[None]:
    """A child answering every request with 200 `{"ok":true}` on the Unix socket `path`; `seen` gets each request's
    head."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                seen.append(head)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n"
                             b'{"ok":true}')
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_unix_server(handle, path=str(path))
    try:
        yield
    finally:
        server.close()
        await server.wait_closed()


async def test_a_child_on_a_unix_socket_is_reached_by_its_base_url_with_its_key(tmp_path: Path) -> None:
    seen: list[bytes] = []
    client = EngineClient()
    try:
        async with on_socket(tmp_path / "c.sock", seen), asyncio.timeout(HANG_S):
            r = await client.open(unix_base(tmp_path / "c.sock"), "/synthesize", b'{"text":"hi"}', api_key="k1")
            assert r.status_code == 200 and await r.aread() == b'{"ok":true}'
            await r.aclose()
            assert await client.post_json(unix_base(tmp_path / "c.sock"), "/x", {}) == (200, {"ok": True})
        assert seen[0].startswith(b"POST /synthesize HTTP/1.1") and b"authorization: Bearer k1" in seen[0]
    finally:
        await client.aclose()


async def test_a_socket_nobody_listens_on_is_unreachable_at_once(tmp_path: Path) -> None:
    client = EngineClient()
    try:
        async with asyncio.timeout(HANG_S):
            with pytest.raises(EngineUnreachable, match="did not answer /synthesize"):
                await client.open(unix_base(tmp_path / "none.sock"), "/synthesize", b"{}")
    finally:
        await client.aclose()


async def test_the_pool_of_a_socket_whose_child_is_gone_is_dropped(tmp_path: Path) -> None:
    client = EngineClient()
    try:
        async with asyncio.timeout(HANG_S):
            async with on_socket(tmp_path / "a.sock", []):
                await (await client.open(unix_base(tmp_path / "a.sock"), "/a", b"{}")).aread()
            (tmp_path / "a.sock").unlink(missing_ok=True)
            async with on_socket(tmp_path / "b.sock", []):
                await (await client.open(unix_base(tmp_path / "b.sock"), "/b", b"{}")).aread()
            assert list(client._unix) == [str(tmp_path / "b.sock")]
    finally:
        await client.aclose()


UNIX_STANDIN = textwrap.dedent('''
    import http.server, socketserver, sys

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"voice":{}}')

        def log_message(self, *args):
            pass

        def address_string(self):
            return "local"

    socketserver.UnixStreamServer(sys.argv[1], H).serve_forever()
''')


async def test_the_readiness_poll_reaches_a_child_on_its_socket(tmp_path: Path) -> None:
    script = tmp_path / "standin.py"
    script.write_text(UNIX_STANDIN)
    proc = await spawn([sys.executable, str(script), str(tmp_path / "s.sock")], log_path=tmp_path / "s.log",
                       env=os.environ)
    try:
        waited = await wait_healthy(proc, 0, timeout_s=HANG_S, path="/info", socket=tmp_path / "s.sock")
        assert 0 <= waited < HANG_S and proc.returncode is None
    finally:
        await stop_process(proc, grace_s=HANG_S)
