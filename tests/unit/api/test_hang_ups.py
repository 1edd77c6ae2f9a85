"""A client's hang-up ends quietly at the ASGI edge (blazar/api/disconnect.py's QuietHangUps): one info line, the
task no longer cancelling; any other cancellation goes on."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from blazar.api import disconnect
from tests.support.bounds import HANG_S

SCOPE = {"type": "http", "method": "POST", "path": "/v1/chat/completions"}


def raising(exc: BaseException) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(0)
        raise exc

    return app


async def test_a_hang_up_is_one_info_line_and_the_task_ends_normally(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="blazar.api")
    quiet = disconnect.QuietHangUps(raising(asyncio.CancelledError(disconnect.HANG_UP)))
    task = asyncio.create_task(quiet(SCOPE, None, None))
    await task
    assert not task.cancelled() and task.cancelling() == 0
    (record,) = [r for r in caplog.records if "hung up" in r.getMessage()]
    assert record.levelno == logging.INFO and "POST /v1/chat/completions" in record.getMessage()
    assert record.exc_info is None


async def test_a_hang_up_the_watcher_saw_is_known_without_its_message() -> None:
    """The watcher cancels the request's task; the CancelledError that comes out may have lost the message."""
    gate = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        try:
            await gate.wait()
        except asyncio.CancelledError:
            raise asyncio.CancelledError from None  # re-raised bare, as some libraries do

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def request() -> None:
        watcher = disconnect.watch(type("Req", (), {"_receive": staticmethod(receive)})())  # type: ignore[arg-type]
        try:
            await disconnect.QuietHangUps(app)(SCOPE, None, None)
        finally:
            disconnect.stop(watcher)

    task = asyncio.create_task(request())
    await asyncio.wait_for(task, HANG_S)
    assert not task.cancelled()


async def test_any_other_cancellation_goes_on() -> None:
    quiet = disconnect.QuietHangUps(raising(asyncio.CancelledError("server stopping")))
    task = asyncio.create_task(quiet(SCOPE, None, None))
    with pytest.raises(asyncio.CancelledError):
        await task
