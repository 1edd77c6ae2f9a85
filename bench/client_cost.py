"""What the upstream client costs per relayed chunk, on its own: the client side of reading a paced SSE stream (one
chunk per millisecond, each its own write) from bench/fake_engine.py, with httpx2 (the engine client Blazar uses) and,
when it is installed, aiohttp (the candidate). Process CPU (getrusage) over the chunks read; alternated twice.

Run: `.venv/bin/python bench/client_cost.py` (aiohttp: `.venv/bin/pip install aiohttp` first; it is not a
dependency of Blazar). About 15 seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx2

HERE = Path(__file__).resolve().parent
STREAMS = 5
CHUNKS = 400
BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":400}'
START_S = 1.5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def with_httpx2(url: str) -> tuple[float, int]:
    async with httpx2.AsyncClient(trust_env=False, timeout=None) as client:
        n, start = 0, _cpu_s()
        for _ in range(STREAMS):
            r = await client.send(client.build_request("POST", url, content=BODY), stream=True)
            async for block in r.aiter_raw():
                n += block.count(b"data: ")
            await r.aclose()
        return (_cpu_s() - start) / n * 1e6, n


async def with_aiohttp(url: str) -> tuple[float, int]:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        n, start = 0, _cpu_s()
        for _ in range(STREAMS):
            async with session.post(url, data=BODY) as r:
                async for block in r.content.iter_any():
                    n += block.count(b"data: ")
        return (_cpu_s() - start) / n * 1e6, n


def main() -> int:
    port = _free_port()
    engine = subprocess.Popen([sys.executable, str(HERE / "fake_engine.py"), "--port", str(port), "--fake-chunks",
                               str(CHUNKS), "--fake-delay-ms", "1"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    lanes: list[tuple[str, Callable[[str], Coroutine[Any, Any, tuple[float, int]]]]] = [("httpx2", with_httpx2)]
    try:
        import aiohttp  # noqa: F401

        lanes.append(("aiohttp", with_aiohttp))
    except ImportError:
        print("aiohttp is not installed: httpx2 alone (.venv/bin/pip install aiohttp for the comparison)")
    try:
        time.sleep(START_S)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        print("| client | CPU per chunk (µs) | chunks |\n|---|---:|---:|")
        for _ in range(2):
            for name, lane in lanes:
                us, n = asyncio.run(lane(url))
                print(f"| {name} | {us:.1f} | {n} |")
    finally:
        engine.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            engine.wait(timeout=10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
