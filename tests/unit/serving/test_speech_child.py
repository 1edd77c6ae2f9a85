"""What the gateway sends the piper child and what it tells a caller of its failures (blazar/serving/speech.py): the
text, the length scale and a multi-speaker voice's speaker, never a `voice` (piper loads any path it is sent there: the
child speaks the store's voice only); piper's own error page is the owner's, a key is told what failed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from blazar.errors import Refused
from blazar.redact import public_message
from blazar.serving import speech
from tests.support.audio_files import tone_wav


class _Answer:
    def __init__(self, status: int, body: bytes) -> None:
        self.status_code, self._body = status, body

    async def aread(self) -> bytes:
        return self._body

    async def aclose(self) -> None:
        return None


class _Child:
    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.body = status, body
        self.sent: list[dict[str, Any]] = []

    async def open(self, base_url: str, path: str, body: bytes, *, api_key: str | None = None) -> _Answer:
        self.sent.append({"base_url": base_url, "path": path, **orjson.loads(body)})
        return _Answer(self.status, self.body)


def _call() -> SimpleNamespace:
    return SimpleNamespace(model="joe", instance=SimpleNamespace(base_url="http+unix:///home/r/run/a.sock",
                                                                 api_key=None))


async def test_the_child_is_never_sent_a_voice_whatever_the_client_named() -> None:
    child = _Child(200, tone_wav(0.1, 22050))
    spoken = await speech._synthesize(SimpleNamespace(client=child), _call(), "Hello.", 1.0, "/home/r/other.onnx")
    assert spoken.seconds == pytest.approx(0.1)
    (sent,) = child.sent
    assert sent["path"] == "/synthesize" and "voice" not in sent
    assert set(sent) - {"base_url", "path"} <= {"text", "length_scale", "speaker"}


async def test_pipers_error_page_is_the_owners_and_a_key_is_told_what_failed() -> None:
    page = b"<!doctype html><title>500 Internal Server Error</title>"
    with pytest.raises(Refused) as e:
        await speech._synthesize(SimpleNamespace(client=_Child(500, page)), _call(), "Hello.", 1.0, None)
    assert e.value.http_status == 502 and "refused the text (500)" in e.value.message
    assert public_message(e.value).startswith("joe's voice could not speak this text")
    assert "Internal Server Error" not in public_message(e.value)


class _LiveCall(SimpleNamespace):
    """A call that records how it ended (the first end only, as Call.finish)."""

    def __init__(self) -> None:
        super().__init__(model="joe", instance=_call().instance, outcome=None, measured=None, first=False)

    def first_token(self) -> None:
        self.first = True

    def audio_measured(self, seconds: float) -> None:
        self.measured = seconds

    def finish(self, outcome: Any) -> None:
        self.outcome = self.outcome or outcome


async def _sentences(*texts: str) -> Any:
    for text in texts:
        yield text


async def test_a_live_answer_speaks_each_sentence_as_it_comes_one_raw_chunk_each() -> None:
    child, call = _Child(200, tone_wav(0.1, 22050)), _LiveCall()
    produce = speech.live_producer(SimpleNamespace(client=child), " One. ", _sentences("Two. ", "Three."), 1.0, None)
    answer = await produce(call)  # type: ignore[arg-type]
    assert call.first and answer.headers[speech.SAMPLE_RATE_HEADER] == "22050"
    assert answer.stream is not None
    chunks = [c async for c in answer.stream]
    assert [len(c) for c in chunks] == [4410] * 3  # 0.1 s of 16-bit samples at 22.05 kHz, a sentence each
    assert [s["text"] for s in child.sent] == ["One.", "Two.", "Three."]
    assert call.outcome.status == 200 and call.measured == pytest.approx(0.3)


async def test_a_live_answer_ended_early_is_failed_with_the_audio_it_made() -> None:
    child, call = _Child(200, tone_wav(0.1, 22050)), _LiveCall()
    produce = speech.live_producer(SimpleNamespace(client=child), "One.", _sentences("Two.", "Three."), 1.0, None)
    answer = await produce(call)  # type: ignore[arg-type]
    assert answer.stream is not None
    stream: Any = answer.stream
    assert len(await anext(stream)) == 4410
    await stream.aclose()  # the response cancelled after its first sentence
    assert call.outcome.status == 499 and call.outcome.relayed_audio_s == pytest.approx(0.1)
    assert len(child.sent) == 1  # nothing more was asked of the child
