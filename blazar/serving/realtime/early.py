"""A turn heard early: when the user's speech pauses (`GUESS_PAUSE_MS` in blazar/serving/realtime/hearing.py),
what was said so far goes to whisper at once, before the turn is known to end. When VAD then ends the turn without
another word, that transcript is the turn's (the silence after it has no words) and the wait for the end of the
turn overlapped the transcription; speech that resumes drops the guess (its request cancelled). At most one guess
at a time."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from blazar.errors import RealtimeHearRefused
from blazar.serving.realtime.port import Heard


class Guesses:
    def __init__(self) -> None:
        self._guess: tuple[str, asyncio.Task[Heard]] | None = None  # the speech's item, and its transcription

    def start(self, item_id: str, transcription: Coroutine[Any, Any, Heard]) -> None:
        self.drop()
        task = asyncio.create_task(transcription)
        task.add_done_callback(_retrieved)
        self._guess = (item_id, task)

    def take(self, item_id: str) -> asyncio.Task[Heard] | None:
        """The guess for the turn of `item_id` that just ended (any other is dropped)."""
        guess = self._guess
        if guess is not None and guess[0] == item_id:
            self._guess = None
            return guess[1]
        self.drop()
        return None

    def drop(self) -> None:
        if self._guess is not None:
            self._guess[1].cancel()  # its request with it
            self._guess = None


async def heard_early(guess: asyncio.Task[Heard] | None) -> Heard | None:
    """The transcript heard at the turn's last pause; None when there was none or it failed (heard again, whole)."""
    if guess is None:
        return None
    try:
        return await guess
    except RealtimeHearRefused:
        return None


def _retrieved(task: asyncio.Task[Heard]) -> None:
    """A guess dropped or failed is not an error to log: its failure is read here (a turn's own is told)."""
    if not task.cancelled():
        task.exception()
