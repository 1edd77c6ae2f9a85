"""`blazar worker [--host H] [--port P] [--mem MiB] [--allow-network]`: llama.cpp's rpc-server, run in the foreground
and supervised, offering this host's devices to another host's llama-server (a model split across hosts);
`blazar worker list` shows the workers the log knows of. Ctrl-C or SIGTERM stops it."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from dataclasses import asdict
from typing import Annotated, Any

import typer
from rich.table import Table

from blazar.addresses import is_loopback
from blazar.cli.common import JSON_OPTION, err, fmt_ts, opened, out, print_json, run
from blazar.instances.worker import run_worker
from blazar.projections.workers import workers

app = typer.Typer(help="RPC workers: llama.cpp's rpc-server on this host, for a model split across hosts. Without "
                  "a subcommand, runs one here (Ctrl-C stops it).", invoke_without_command=True)
_VERBATIM: dict[str, Any] = {"markup": False, "emoji": False}


def _host_available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


@app.callback()
def worker(
    ctx: typer.Context,
    host: Annotated[str, typer.Option("--host", help="Address to listen on (loopback unless --allow-network).")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to listen on.")] = 50052,
    mem: Annotated[int | None, typer.Option("--mem", min=1, help="MiB this worker offers the planner (default: the "
                                            "memory available now).")] = None,
    threads: Annotated[int | None, typer.Option("--threads", min=1, help="CPU threads rpc-server computes with.")]
    = None,
    name: Annotated[str | None, typer.Option("--name", help="The worker's name in the log (default: "
                                             "HOSTNAME:PORT).")] = None,
    allow_network: Annotated[bool, typer.Option(
        "--allow-network", help="Listen beyond loopback. rpc-server has NO authentication: anyone who reaches the "
        "port can run work on this host's devices. Only on a network you trust.")] = False,
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    if allow_network and not is_loopback(host):
        err.print(f"WARNING: rpc-server will listen on {host}:{port} with no authentication: anyone who reaches it "
                  "can run work on this host's devices and read what they hold. Keep it behind a firewall.",
                  **_VERBATIM)
    mem_bytes = (mem << 20) if mem else _host_available_bytes()
    who = name or f"{socket.gethostname()}:{port}"

    async def go() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            async with opened() as app_:
                return await run_worker(app_, host=host, port=port, mem_bytes=mem_bytes, name=who, stop=stop,
                                        threads=threads, allow_network=allow_network,
                                        say=lambda line: err.print(line, **_VERBATIM))
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    code = run(go())
    err.print(f"worker {who} stopped (pid {os.getpid()})", **_VERBATIM)
    if code:
        raise typer.Exit(code)


@app.command("list")
def list_(as_json: bool = JSON_OPTION) -> None:
    """The workers the log knows of: address, the memory each offers, up or not."""

    async def go() -> list[dict[str, Any]]:
        async with opened() as app_:
            return [asdict(w) | {"address": w.address} for w in workers(app_.runner.state("workers"))]

    rows = run(go())
    if as_json:
        print_json(rows)
        return
    if not rows:
        out.print("no workers (blazar worker, on the host that offers its devices)")
        return
    table = Table("NAME", "ADDRESS", "MEMORY", "STATE", "SINCE", "CRASHES", box=None, header_style="bold")
    for r in rows:
        table.add_row(r["name"], r["address"] + (" (network!)" if r["network"] else ""),
                      f"{r['mem_bytes'] >> 20} MiB", "up" if r["up"] else f"down ({r['stop_reason']})",
                      fmt_ts(r["started_ts"] if r["up"] else r["stopped_ts"]), str(r["crashes"]))
    out.print(table)
