"""Shared pieces of the CLI: running a command against a bootstrapped Blazar, and printing."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Coroutine
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
import typer
from rich.console import Console

from blazar.cli.timeparse import parse_time

if TYPE_CHECKING:
    from blazar.context import Blazar

T = TypeVar("T")

# Piped output is not cut at 80 columns: a wide table beats a wrapped one for grep and for people.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False)

JSON_OPTION = typer.Option(False, "--json", help="Print JSON instead of a table.")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def run_stoppable(coro: Coroutine[Any, Any, T], interrupted: str) -> T:
    """`run` for a command that starts engine children of its own (bench, tune, the engine gate): Ctrl-C or SIGTERM
    cancels it, so the children (each in a session of its own, which neither signal reaches) are stopped on the way
    out instead of left running; then `interrupted` is said and the exit code is 130."""

    async def guarded() -> T:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        return await coro

    try:
        return asyncio.run(guarded())
    except asyncio.CancelledError:
        err.print(f"interrupted: {interrupted}", markup=False, highlight=False)
        raise typer.Exit(130) from None


@contextlib.asynccontextmanager
async def opened(*, reconcile_config: bool = True) -> AsyncIterator[Blazar]:
    from blazar.bootstrap import bootstrap  # the log and projections: not for `--help` or `--version`

    app = await bootstrap(reconcile_config=reconcile_config)
    try:
        yield app
    finally:
        await app.close()


def print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode() + "\n")
    sys.stdout.flush()


def print_json_line(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode() + "\n")
    sys.stdout.flush()


def fmt_ts(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def time_option(value: str | None, *, now: float) -> float | None:
    if value is None:
        return None
    try:
        return parse_time(value, now=now)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
