"""The engine lanes with the daemon observed as a user would watch it: OTLP export on, to a collector on loopback
(bench/otlp_sink.py, its own process), and the web console open (what its page fetches, done by a client here:
the live event follow, the dashboard poll every 2 s, and the refresh after each request event). Throughput is
judged against llama-server direct, as in the engine lanes (`bench/overhead.py --only observed`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import overhead as ov

HERE = Path(__file__).resolve().parent
POLL_S = 2.0  # the page's POLL_MS (blazar/api/console_static/console.js)
REFRESH_DELAY_S = 0.5  # the page's refreshSoon(500) after a request event
TARGET_OBSERVED_RATIO = 0.98
SINK_START_TIMEOUT_S = 30.0


class Sink:
    """bench/otlp_sink.py as a child: its URL, and its counts once stopped."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(HERE / "otlp_sink.py")], stdout=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.isdigit():
            self.proc.kill()
            raise RuntimeError(f"bench/otlp_sink.py did not start (said {line!r})")
        self.url = f"http://127.0.0.1:{line}"

    def stop(self) -> dict[str, Any]:
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=SINK_START_TIMEOUT_S)
        last = out.strip().splitlines()[-1] if out.strip() else "{}"
        counts: dict[str, Any] = json.loads(last)
        return counts


class Console:
    """What the console page asks of the daemon while it is open (its refresh logic, not its rendering)."""

    def __init__(self, client: httpx2.AsyncClient, url: str) -> None:
        self.client, self.url = client, url
        self.counts = {"follow_events": 0, "polls": 0, "refreshes": 0, "watch_refreshes": 0, "errors": 0}
        self._refresh_due: str | bool = False

    async def get(self, path: str) -> None:
        try:
            r = await self.client.get(self.url + path)
            if r.status_code != 200:
                self.counts["errors"] += 1
        except httpx2.TransportError:
            self.counts["errors"] += 1

    async def refresh_all(self) -> None:
        self.counts["refreshes"] += 1
        await asyncio.gather(self.get("/api/blazar/dashboard"), self.get("/api/blazar/models"),
                             self.get("/api/blazar/engines"))

    async def poll(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            self.counts["polls"] += 1
            await self.get("/api/blazar/dashboard")

    async def refresher(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_DELAY_S)
            if self._refresh_due:
                due, self._refresh_due = self._refresh_due, False
                if due == "all":
                    await self.refresh_all()
                else:  # a request event: the page redraws only what `watch` shows
                    self.counts["watch_refreshes"] += 1
                    await self.get("/api/blazar/dashboard")

    async def follow(self) -> None:
        """The live log: every event, as the page follows it with no filter."""
        last = 0
        r = await self.client.get(self.url + "/api/blazar/events?limit=200")
        last = r.json().get("last_seq", 0)
        while True:
            try:
                async with self.client.stream("GET", f"{self.url}/api/blazar/events/follow?after={last}",
                                              timeout=httpx2.Timeout(10.0, read=None)) as resp:
                    kind = ""
                    async for line in resp.aiter_lines():
                        if line.startswith("event:"):
                            kind = line[6:].strip()
                        elif line.startswith("data:") and kind == "event":
                            ev = json.loads(line[5:])
                            last = max(last, int(ev.get("seq", last)))
                            self.counts["follow_events"] += 1
                            kind_ = str(ev.get("type", ""))
                            if kind_.startswith("request."):
                                self._refresh_due = self._refresh_due or "watch"
                            elif kind_.startswith(("instance.", "model.", "engine.")):
                                self._refresh_due = "all"
            except httpx2.TransportError:
                self.counts["errors"] += 1
                await asyncio.sleep(1.0)


@contextlib.asynccontextmanager
async def observed(home: ov.Home) -> AsyncIterator[dict[str, Any]]:
    """Beside the lanes: the console open on `home`'s daemon (the collector was set up by `prepare`)."""
    info: dict[str, Any] = {"otlp_endpoint": home.env.get("BENCH_OTLP_URL")}
    started = time.monotonic()
    async with httpx2.AsyncClient(timeout=30.0, trust_env=False) as client:
        console = Console(client, home.url)
        await console.refresh_all()
        tasks = [asyncio.create_task(t) for t in (console.follow(), console.poll(), console.refresher())]
        try:
            yield info
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            info["console"] = {**console.counts, "open_s": round(time.monotonic() - started, 1)}
            with contextlib.suppress(httpx2.HTTPError):
                metrics = (await client.get(home.url + "/metrics")).text
                info["otlp_metrics"] = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
                                        if line.startswith("blazar_otlp_") and not line.startswith("#")}


async def observed_phase(client: httpx2.AsyncClient, root: Path, server: Path, model: Path, *, rounds: int,
                         max_tokens: int, per_worker: int, threads: int, say: Any) -> dict[str, Any]:
    sink = Sink()
    say(f"observed lanes: OTLP to {sink.url} (bench/otlp_sink.py), the console open")

    def prepare(home: ov.Home) -> None:
        home.cli("config", "set", "telemetry.otlp_endpoint", sink.url)
        home.env["BENCH_OTLP_URL"] = sink.url

    try:
        res = await ov.engine_phase(client, root, server, model, rounds=rounds, max_tokens=max_tokens,
                                    concurrency=[1, 4], per_worker=per_worker, threads=threads, engine_cpus=None,
                                    litellm=None, say=say, prepare=prepare, companion=observed)
    finally:
        counts = sink.stop()
    res["companion"]["collector"] = counts
    return res


def observed_verdicts(res: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    out = []
    for key, cell in res["summary"].items():
        ratio = cell["ratio_system_tps_paired_median"]
        out.append((f"system t/s gateway (OTLP on, console open)/direct at C={key[1:]} (median of paired rounds)",
                    f"{ratio:.3f}x", f">= {TARGET_OBSERVED_RATIO}x", ratio >= TARGET_OBSERVED_RATIO))
    comp = res["companion"]
    spans = comp.get("collector", {}).get("spans", 0)
    out.append(("spans the collector received", f"{spans}", "> 0", spans > 0))
    return out


def print_observed(res: dict[str, Any]) -> None:
    comp = res["companion"]
    print(f"\nobserved: OTLP to a loopback collector, the console open: {json.dumps(comp)}")
