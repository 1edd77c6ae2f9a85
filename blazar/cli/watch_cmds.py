"""`blazar watch`: the live dashboard in a terminal (rich Live), from the log's follow() and the daemon's /metrics,
folded by blazar/queries/dashboard.py. Not a terminal: one plain line per event of interest instead."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import sys
import termios
import tty
from collections.abc import Iterator

import httpx2
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from blazar.cli.common import fmt_ts, opened, run
from blazar.cli.daemon_client import HEALTH_TIMEOUT_S, auth_headers, find_daemon, verify_of
from blazar.context import Blazar
from blazar.events.base import Recorded
from blazar.queries.dashboard import (
    Activity,
    DaemonStatus,
    Dashboard,
    MetricsSample,
    fold,
    parse_metrics,
    read_recent,
    snapshot,
)
from blazar.queries.metrics import queue_depth
from blazar.queries.ps import ps_rows
from blazar.queries.why import fmt_bytes, fmt_ms

# At most this many redraws a second; between them updates coalesce.
FRAME_S = 0.25
METRICS_EVERY_S = 1.0
TITLE = "blazar watch"
_ENDS = frozenset({"request.completed", "request.failed", "request.rejected"})


class _Watch:
    """What the tasks share: the fold, the last /metrics sample and whether the daemon answers."""

    def __init__(self, app: Blazar) -> None:
        self.app = app
        self.activity = Activity()
        self.sample: MetricsSample | None = None
        self.daemon = DaemonStatus(up=False)
        self.quit = asyncio.Event()

    def dashboard(self) -> Dashboard:
        now = self.app.clock.now()
        rows = [r.to_json() for r in ps_rows(self.app, now=now)]
        if self.sample is not None and self.daemon.up:
            queues, busy = self.sample.queue_depth, self.sample.slots_busy
        else:  # no daemon: the log's queue gauge, and nobody is being served
            queues, busy = queue_depth(self.app), None
        return snapshot(self.activity, rows=rows, now=now, daemon=self.daemon, queues=queues, slots_busy=busy)

    async def follow(self, emit: bool) -> None:
        async for rec in self.app.log.follow(after=self.activity.seq):
            self.app.runner.apply(rec)
            fold(self.activity, rec)
            if emit:
                _plain_event(rec, self.activity)

    async def poll_metrics(self, emit: bool) -> None:
        first = True
        while True:
            info = await asyncio.to_thread(find_daemon, self.app.paths)
            sample = None
            if info is not None:
                sample = await asyncio.to_thread(_metrics, info.url, verify_of(info), auth_headers(self.app.paths))
            status = DaemonStatus(up=sample is not None, url=info.url if info is not None else None)
            if emit and (first or status.up != self.daemon.up):
                _line(f"daemon up at {status.url}" if status.up else "daemon down: showing what the log says")
            self.daemon, self.sample, first = status, sample, False
            await asyncio.sleep(METRICS_EVERY_S)


def _metrics(url: str, verify: ssl.SSLContext | bool, headers: dict[str, str]) -> MetricsSample | None:
    try:
        r = httpx2.get(f"{url}/metrics", timeout=HEALTH_TIMEOUT_S, trust_env=False, verify=verify,
                       headers=headers)
    except httpx2.TransportError:
        return None
    return parse_metrics(r.text) if r.status_code == 200 else None


# -- plain lines (stdout is not a terminal) ---------------------------------------------------------------------------

def _line(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _plain_event(rec: Recorded, activity: Activity) -> None:
    if rec.type in _ENDS and activity.requests:
        r = activity.requests[0]
        _line(f"request {r.trace_id[:12]} {r.model or '-'} {r.outcome} {r.status} ttft {fmt_ms(r.ttft_ms)} "
              f"tokens {r.completion_tokens if r.completion_tokens is not None else '-'}")
        if r.outcome != "completed" and activity.failures:
            _line(f"failure {r.trace_id[:12]} {activity.failures[0].verdict}")
    elif rec.type.startswith("instance.") and rec.type != "instance.memory_measured":
        ev = rec.event
        _line(f"{rec.type} {getattr(ev, 'model', '-')} {getattr(ev, 'instance_id', '-')}")


# -- the terminal view ------------------------------------------------------------------------------------------------

def render(d: Dashboard) -> Group:
    head = Text(f"{TITLE}  ", style="bold")
    head.append(f"daemon up at {d.daemon.url}" if d.daemon.up else "daemon down: showing what the log says",
                style="green" if d.daemon.up else "yellow")
    head.append(f"   seq {d.seq}   q quits")
    inst = Table("model", "instance", "state", "planned", "measured", "slots busy", "keep-alive left",
                 title="instances", title_justify="left", box=None, header_style="bold")
    for i in d.instances:
        busy = "?" if i.slots_busy is None else str(i.slots_busy)
        left = "pinned" if i.pinned else "-" if i.keep_alive_left_s is None else f"{i.keep_alive_left_s:.0f} s"
        inst.add_row(i.model, i.instance_id, i.state, fmt_bytes(i.planned_bytes),
                     "-" if i.measured_bytes is None else fmt_bytes(i.measured_bytes), f"{busy}/{i.slots}", left)
    models = sorted(set(d.queues) | set(d.tokens_per_s))
    load = Table("model", "queued", f"tokens/s ({d.window_s:.0f} s)", title="load", title_justify="left", box=None,
                 header_style="bold")
    for m in models:
        load.add_row(m, str(d.queues.get(m, 0)), f"{d.tokens_per_s.get(m, 0.0):.1f}")
    reqs = Table("time (UTC)", "trace", "model", "outcome", "status", "ttft", "tokens", title="last requests",
                 title_justify="left", box=None, header_style="bold")
    for r in d.requests:
        reqs.add_row(fmt_ts(r.ts)[11:], r.trace_id[:12], r.model or "-", r.outcome, str(r.status), fmt_ms(r.ttft_ms),
                     "-" if r.completion_tokens is None else str(r.completion_tokens))
    fails = Table("time (UTC)", "trace", "why", title="last failures", title_justify="left", box=None,
                  header_style="bold")
    for f in d.failures:
        fails.add_row(fmt_ts(f.ts)[11:], f.trace_id[:12], f.verdict)
    empty = Text("  none")
    return Group(head, Text(""), inst if d.instances else Group(Text("instances", style="italic"), empty),
                 Text(""), load if models else Group(Text("load", style="italic"), empty), Text(""),
                 reqs if d.requests else Group(Text("last requests", style="italic"), empty), Text(""),
                 fails if d.failures else Group(Text("last failures", style="italic"), empty))


@contextlib.contextmanager
def _cbreak(fd: int) -> Iterator[None]:
    """Keys arrive one at a time, unechoed; the terminal's settings are put back however the watch ends."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield
    finally:
        with contextlib.suppress(termios.error, OSError):  # a terminal that hung up has no settings to restore
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


async def _draw(w: _Watch) -> None:
    loop = asyncio.get_running_loop()
    fd = sys.stdin.fileno()

    def on_key() -> None:
        try:
            keys = os.read(fd, 64)
        except OSError:  # EIO: the terminal hung up
            keys = b""
        if not keys:  # the terminal is gone (its SIGHUP may be ignored, as under nohup): stop, never spin on it
            loop.remove_reader(fd)
            w.quit.set()
        elif b"q" in keys.lower():
            w.quit.set()

    console = Console(highlight=False)
    with _cbreak(fd), Live(console=console, auto_refresh=False, screen=True) as live:
        loop.add_reader(fd, on_key)
        try:
            shown: Dashboard | None = None
            while not w.quit.is_set():
                d = w.dashboard()
                if not d.same_picture(shown):
                    live.update(render(d), refresh=True)
                    shown = d
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(w.quit.wait(), timeout=FRAME_S)
        finally:
            loop.remove_reader(fd)


async def _watch() -> None:
    async with opened() as app:
        w = _Watch(app)
        await read_recent(app.log, w.activity, upto=app.runner.seq)
        interactive = sys.stdout.isatty() and sys.stdin.isatty()
        tasks = [asyncio.create_task(w.follow(emit=not interactive)),
                 asyncio.create_task(w.poll_metrics(emit=not interactive))]
        try:
            if interactive:
                await _draw(w)
            else:
                _line(f"{TITLE}: following {app.paths.data_dir} from seq {w.activity.seq}")
                await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def watch() -> None:
    """A live dashboard: instances (state, memory planned and measured, busy slots, keep-alive left), queue depth
    and tokens/s (last 10 s) per model, the last requests (status, TTFT) and the last failures with their `why`
    verdict. Redraws at most 4 times a second; q quits. Works with no daemon (from the log alone). When stdout is
    not a terminal it prints one plain line per finished request, failure, instance change and daemon up/down."""
    with contextlib.suppress(KeyboardInterrupt):
        run(_watch())
