"""bench/realtime_latency.py's realtime lane against a scripted realtime server on loopback (the real one is measured
end to end in tests/integration/test_realtime_voice.py): the microphone streams the question then silence, the turn's
times come from the server's GA events in their order, the turn's items are deleted after it, and a refusal is
reported with the server's code. Plus the lane's arithmetic: where speech ends, the p95."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.server import ServerConnection, serve

from tests.support.bounds import HANG_S

REPO = Path(__file__).resolve().parents[2]
RATE = 24_000


def _load(name: str) -> ModuleType:
    """A bench script as a module (bench/ is not a package); sys.path as it was after."""
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    path = list(sys.path)
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = path
    return mod


lanes = _load("realtime_latency_lanes")
bench = _load("realtime_latency")


def tone(ms: int, amplitude: float = 0.3) -> bytes:
    t = np.arange(RATE * ms // 1000) / RATE
    return (np.sin(2 * np.pi * 220 * t) * amplitude * 32767).astype("<i2").tobytes()


def silence(ms: int) -> bytes:
    return bytes(RATE * 2 * ms // 1000)


def test_speech_ends_after_the_last_loud_10_ms_frame_and_p95_is_the_nearest_rank() -> None:
    pcm = silence(100) + tone(250) + tone(30, amplitude=0.001) + silence(200)  # -70 dBFS is not speech
    assert lanes.speech_end(pcm) == RATE * 2 * 350 // 1000
    with pytest.raises(RuntimeError, match="no frame louder"):
        lanes.speech_end(silence(500))
    assert bench.p95([float(x) for x in range(1, 21)]) == 19.0 and bench.p95([3.0]) == 3.0


class ScriptedServer:
    """What a realtime session with server VAD answers, scripted: speech_stopped once 100 ms of silence follow
    loud audio, then the transcription, a response with a transcript delta and an audio delta, response.done."""

    def __init__(self, refuse: str | None = None) -> None:
        self.refuse = refuse
        self.deleted: list[str] = []
        self.appended = 0  # bytes
        self.session: dict[str, Any] = {}

    async def handle(self, ws: ServerConnection) -> None:
        async def send(kind: str, **fields: Any) -> None:
            await ws.send(json.dumps({"type": kind, **fields}))

        await send("session.created", session={})
        heard, quiet, turn = False, 0, 0
        async for message in ws:
            e = json.loads(message)
            if e["type"] == "session.update":
                if self.refuse:
                    await send("error", error={"code": self.refuse, "message": "audio is not served here"})
                else:
                    self.session = e["session"]
                    await send("session.updated", session=e["session"])
            elif e["type"] == "conversation.item.delete":
                self.deleted.append(e["item_id"])
                await send("conversation.item.deleted", item_id=e["item_id"])
            elif e["type"] == "input_audio_buffer.append":
                pcm = base64.b64decode(e["audio"])
                self.appended += len(pcm)
                loud = np.abs(np.frombuffer(pcm, dtype="<i2")).max(initial=0) > 1000
                heard, quiet = heard or loud, 0 if loud else quiet + len(pcm) // 48
                if heard and quiet >= 100:
                    heard, turn = False, turn + 1
                    await self.answer(send, turn)

    async def answer(self, send: Any, turn: int) -> None:
        await send("input_audio_buffer.speech_stopped", audio_end_ms=self.appended // 48, item_id=f"user{turn}")
        await send("conversation.item.added", item={"id": f"user{turn}", "role": "user"})
        await send("conversation.item.input_audio_transcription.completed", item_id=f"user{turn}",
                   transcript="what is it")
        await send("response.created", response={})
        await send("response.output_item.added", item={"id": f"answer{turn}"})
        await send("conversation.item.added", item={"id": f"answer{turn}", "role": "assistant"})
        await send("response.output_audio_transcript.delta", delta="It")
        await send("response.output_audio.delta", delta=base64.b64encode(silence(20)).decode())
        await send("response.done", response={"status": "completed"})


@asynccontextmanager
async def scripted(server: ScriptedServer) -> AsyncIterator[str]:
    async with serve(server.handle, "127.0.0.1", 0) as ws_server:
        port = next(iter(ws_server.sockets)).getsockname()[1]
        yield f"http://127.0.0.1:{port}"


async def test_the_realtime_lane_times_each_turn_from_the_end_of_speech_and_deletes_its_items() -> None:
    server = ScriptedServer()
    q = lanes.Question("what is it", tone(200) + silence(40), RATE * 2 * 200 // 1000)
    async with asyncio.timeout(HANG_S), scripted(server) as url:
        lane = lanes.RealtimeLane(url, "", "desk", "Answer.", 16, "whisper-base", None)
        async with lane:
            rows = [await lane.turn(q), await lane.turn(q)]
    for row in rows:
        assert row["transcript"] == "what is it"
        # The server decides after 100 ms of audio silence, paced at real time by the microphone.
        assert 0 < row["decided"] <= row["transcribed"] <= row["first_token"] <= row["first_audio"]
        assert row["vad_hangover_audio_ms"] == pytest.approx(100, abs=20)
    assert server.deleted == ["user1", "answer1", "user2", "answer2"]
    assert server.session["output_modalities"] == ["audio"] and server.session["max_output_tokens"] == 16
    assert server.session["audio"] == {"input": {"transcription": {"model": "whisper-base"}}}


async def test_the_realtime_lane_reports_the_servers_refusal_by_its_code() -> None:
    async with asyncio.timeout(HANG_S), scripted(ScriptedServer(refuse="audio_not_supported")) as url:
        lane = lanes.RealtimeLane(url, "", "desk", "Answer.", 16, "whisper-base", None)
        got = await bench.run_lane("realtime", lane, [], 1, 0)
    assert got == {"error": {"code": "audio_not_supported", "message": "audio is not served here"}}


async def test_the_realtime_lane_reports_a_url_that_is_no_websocket() -> None:
    async with asyncio.timeout(HANG_S), scripted(ScriptedServer()) as url:
        port = url.rsplit(":", 1)[1]
    lane = lanes.RealtimeLane(f"http://127.0.0.1:{port}", "", "desk", "Answer.", 16, "whisper-base", None)
    got = await bench.run_lane("realtime", lane, [], 1, 0)  # the server is gone: nothing listens there
    assert got["error"]["code"] == "connect_failed" and f"127.0.0.1:{port}/v1/realtime?model=desk" in \
        got["error"]["message"]
