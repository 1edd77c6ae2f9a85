"""The response cache's decisions (blazar/serving/response_cache.py) and its taped and stored answers
(blazar/serving/cache_step.py): who uses it, what its key covers, the LRU bound, and that only a whole answer is
kept."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import pytest

from blazar.serving.cache_step import Stored, Tape
from blazar.serving.relay import Rename
from blazar.serving.response_cache import AnswerStore, Entry, Identity, cache_key, cache_use, deterministic

ID = Identity(model_sha256="a" * 64, engine="b8000@3", posture="", template="jinja:0123")
BODY = {"model": "gemma", "messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 8}


# -- who uses it --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("header", "key", "model", "use"), [
    (None, None, None, None),  # nobody asked
    (None, None, "exact", "use"),  # the model's setting
    (None, "exact", None, "use"),  # the key's
    (None, "off", "exact", None),  # the key's says no over the model's
    (None, "exact", "off", "use"),  # ... and yes
    ("use", None, None, "use"),  # asking is opting in
    ("refresh", None, "exact", "refresh"),
    ("off", "exact", "exact", None),  # the header decides for its request
])
def test_the_header_then_the_key_then_the_model_decide(header: str | None, key: str | None, model: str | None,
                                                       use: str | None) -> None:
    assert cache_use(header, key, model) == use


@pytest.mark.parametrize(("body", "ok"), [
    ({"temperature": 0}, True), ({"temperature": 0.0}, True), ({"seed": 7, "temperature": 0.8}, True),
    ({}, False), ({"temperature": 0.7}, False), ({"seed": -1}, False), ({"seed": True}, False),
    ({"temperature": 0, "n": 2}, False), ({"temperature": False}, False),
])
def test_only_deterministic_single_answers_are_cacheable(body: dict, ok: bool) -> None:
    assert deterministic(body) is ok


# -- what the key covers ------------------------------------------------------------------------------------------

def test_the_key_is_the_tenants_and_moves_with_every_input() -> None:
    base = cache_key("key:a", ID, "/v1/chat/completions", BODY, stream=False)
    assert base is not None and len(base) == 64
    assert cache_key("key:a", ID, "/v1/chat/completions", dict(BODY), stream=False) == base
    others = [
        cache_key("key:b", ID, "/v1/chat/completions", BODY, stream=False),  # another tenant
        cache_key(None, ID, "/v1/chat/completions", BODY, stream=False),  # the owner
        cache_key("key:a", Identity("c" * 64, ID.engine, ID.posture, ID.template), "/v1/chat/completions", BODY,
                  stream=False),
        cache_key("key:a", Identity(ID.model_sha256, "b8001@4", ID.posture, ID.template), "/v1/chat/completions",
                  BODY, stream=False),
        cache_key("key:a", Identity(ID.model_sha256, ID.engine, "profile@9", ID.template), "/v1/chat/completions",
                  BODY, stream=False),
        cache_key("key:a", Identity(ID.model_sha256, ID.engine, ID.posture, "builtin:chatml"),
                  "/v1/chat/completions", BODY, stream=False),
        cache_key("key:a", ID, "/v1/completions", BODY, stream=False),
        cache_key("key:a", ID, "/v1/chat/completions", {**BODY, "max_tokens": 9}, stream=False),
        cache_key("key:a", ID, "/v1/chat/completions", {**BODY, "stream": True}, stream=False),
        cache_key("key:a", ID, "/v1/chat/completions", BODY, stream=True),  # relayed as a stream
    ]
    assert base not in others and len(set(others)) == len(others)


def test_the_slots_placement_is_not_part_of_the_key() -> None:
    placed = {**BODY, "id_slot": 1, "cache_prompt": True}
    assert cache_key("key:a", ID, "/v1/chat/completions", placed, stream=False) == cache_key(
        "key:a", ID, "/v1/chat/completions", BODY, stream=False)


# -- the store ----------------------------------------------------------------------------------------------------

def _entry(size: int, model: str = "gemma") -> Entry:
    return Entry(model=model, status=200, content_type="application/json", stream=False, blocks=(b"x" * size,),
                 served_as=None, stored_at=0.0)


def test_the_least_recently_used_go_first_once_the_bytes_are_over_the_bound() -> None:
    one = _entry(1000).size
    store = AnswerStore(max_bytes=3 * one)
    for k in "abc":
        assert store.put(k, _entry(1000))
    assert store.get("a") is not None  # a is the newest use now
    store.put("d", _entry(1000))
    assert store.get("b") is None and store.get("a") is not None and store.get("d") is not None
    assert store.bytes == 3 * one and len(store) == 3


def test_an_answer_larger_than_the_bound_is_not_kept_and_a_new_bound_drops_the_oldest() -> None:
    store = AnswerStore(max_bytes=4096)
    assert not store.put("big", _entry(5000))
    assert len(store) == 0 and store.bytes == 0
    store.put("a", _entry(1000))
    store.put("b", _entry(1000))
    store.bound(_entry(1000).size)
    assert store.get("a") is None and store.get("b") is not None


def test_a_models_entries_go_with_it() -> None:
    store = AnswerStore(max_bytes=1 << 20)
    store.put("a", _entry(10, "gemma"))
    store.put("b", _entry(10, "small"))
    assert store.drop_model("gemma") == 1
    assert store.get("a") is None and store.get("b") is not None and store.bytes == _entry(10).size


# -- taped and played back ----------------------------------------------------------------------------------------

class _Engine:
    """An engine's answer: these blocks, then the end."""

    def __init__(self, blocks: list[bytes], *, breaks: bool = False) -> None:
        self.blocks, self.breaks, self.closed = blocks, breaks, False

    @property
    def status_code(self) -> int:
        return 200

    @property
    def headers(self) -> Mapping[str, str]:
        return {"content-type": "text/event-stream"}

    @property
    def is_closed(self) -> bool:
        return self.closed

    async def aiter_raw(self, heartbeat_s: float | None = None) -> AsyncIterator[bytes]:
        for b in self.blocks:
            yield b
        if self.breaks:
            raise ConnectionError("gone")

    async def aread(self) -> bytes:
        return b"".join(self.blocks)

    async def aclose(self) -> None:
        self.closed = True


STREAM = [b'data: {"model":"gemma-3.gguf","choices":[{"delta":{"content":"Hi"}}]}\n\n',
          b'data: {"model":"gemma-3.gguf","choices":[],"usage":{"completion_tokens":1}}\n\ndata: [DONE]\n\n']


def _relay(upstream: Tape | Stored, *, stop_after: int | None = None) -> list[bytes]:
    async def go() -> list[bytes]:
        got: list[bytes] = []
        try:
            async for b in upstream.aiter_raw(None):
                got.append(b)
                if stop_after is not None and len(got) >= stop_after:
                    break
        except ConnectionError:
            pass
        finally:
            await upstream.aclose()
        return got
    return asyncio.run(go())


def test_a_whole_stream_is_kept_as_sent_and_played_back_under_the_clients_name() -> None:
    kept: list[tuple[bytes, ...]] = []
    assert _relay(Tape(_Engine(STREAM), kept.append, stream=True, max_bytes=1 << 20)) == STREAM
    assert kept == [tuple(STREAM)]
    entry = Entry(model="gemma", status=200, content_type="text/event-stream", stream=True, blocks=kept[0],
                  served_as="gemma-3.gguf", stored_at=0.0)
    played = b"".join(_relay(Stored(entry, Rename("gemma-3.gguf", "gemma"))))
    assert played == b"".join(STREAM).replace(b'"model":"gemma-3.gguf"', b'"model":"gemma"')


@pytest.mark.parametrize("how", ["broken", "cut", "error_event", "too_big"])
def test_an_answer_that_did_not_end_whole_is_never_kept(how: str) -> None:
    kept: list[tuple[bytes, ...]] = []
    blocks = STREAM[:1] if how in ("broken", "cut") else STREAM
    if how == "error_event":
        blocks = [STREAM[0], b'data: {"error":{"message":"out of context"}}\n\ndata: [DONE]\n\n']
    tape = Tape(_Engine(blocks, breaks=how == "broken"), kept.append, stream=True,
                max_bytes=10 if how == "too_big" else 1 << 20)
    _relay(tape, stop_after=1 if how == "cut" else None)
    assert kept == []


def test_a_whole_body_is_kept_once_read_to_its_end() -> None:
    kept: list[tuple[bytes, ...]] = []
    tape = Tape(_Engine([b'{"choices":[]}']), kept.append, stream=False, max_bytes=1 << 20)

    async def go() -> bytes:
        data = await tape.aread()
        await tape.aclose()
        return data
    assert asyncio.run(go()) == b'{"choices":[]}'
    assert kept == [(b'{"choices":[]}',)]
