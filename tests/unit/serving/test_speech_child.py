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
