"""What a key may do with files and batches, end to end: the real `blazar serve`, the official `openai` SDK's files and
batches API, and bench/fake_engine.py as the engine (the limits and the storage are the gateway's; the engine only
answers the lines). An upload and a batch creation are requests of the key's: they count against its rpm and hold
its concurrency lease (429, Retry-After); a key's files and its batches' output fit its storage quota (413 with the
numbers; a batch whose next answer does not fit fails, its files complete); a key has at most so many open batches
(429 with the number). Each refusal is recorded as a request's (`request.rejected`)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.blazar_home import read_events
from tests.support.daemon import wait_for
from tests.support.fake_serving import FakeDaemon, serving_fake
from tests.support.serving import blazar_cli

MODEL = "tiny"
TERMINAL = {"completed", "failed", "cancelled", "expired"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, FakeDaemon]]:
    home, files = tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("files")
    settings = {"slots": 2}
    with serving_fake(home, files, MODEL, settings=settings) as d:
        yield home, d


def key(home: Path, name: str, *args: str) -> str:
    return str(json.loads(blazar_cli(home, "keys", "create", name, *args, "--json").stdout)["secret"])


def client(d: FakeDaemon, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{d.base}/v1", api_key=secret, max_retries=0, timeout=60,
                         http_client=openai.DefaultHttpxClient(trust_env=False))


def chat_line(custom_id: str, max_tokens: int = 4, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens,
                     **body}}


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def upload(c: openai.OpenAI, data: bytes) -> str:
    return c.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch").id


def create(c: openai.OpenAI, file_id: str) -> Any:
    return c.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")


def wait_batch(c: openai.OpenAI, batch_id: str) -> Any:
    return wait_for(lambda: (b := c.batches.retrieve(batch_id)).status in TERMINAL and b, f"batch {batch_id} ended",
                    timeout=120)


def rejected(home: Path, trace_id: str) -> dict[str, Any]:
    """Request events are group-committed: the refusal's `request.rejected`, once it is in the log."""
    return wait_for(lambda: next((e for e in read_events(home, "request.rejected") if e["trace_id"] == trace_id),
                                 None), f"the refusal of {trace_id}", timeout=30)


def storage_used(home: Path, name: str) -> int:
    return int(json.loads(blazar_cli(home, "keys", "show", name, "--json").stdout)["storage_used_bytes"])


def test_uploads_and_batch_creations_count_against_the_keys_rpm(served: tuple[Path, FakeDaemon]) -> None:
    home, d = served
    c = client(d, key(home, "two-a-minute", "--rpm", "2"))
    file_id = upload(c, jsonl([chat_line("a")]))
    create(c, file_id)
    for call in (lambda: upload(c, jsonl([chat_line("b")])), lambda: create(c, file_id),
                 lambda: c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}])):
        with pytest.raises(openai.RateLimitError) as e:
            call()
        assert "rpm limit is 2" in e.value.message and int(e.value.response.headers["retry-after"]) >= 1
        assert e.value.body["code"] == "rate_limit_exceeded"  # type: ignore[index]
    assert len(c.files.list().data) == 1 and len(c.batches.list().data) == 1  # the refused ones made nothing
    ev = rejected(home, e.value.response.headers["x-blazar-trace-id"])
    assert ev["actor"] == "key:two-a-minute" and ev["data"]["status"] == 429
    assert ev["data"]["observations"]["limit"] == "rpm"


def test_uploads_and_batch_creations_wait_for_the_keys_concurrency_lease(served: tuple[Path, FakeDaemon],
                                                                         tmp_path: Path) -> None:
    home, d = served
    c = client(d, key(home, "one-at-a-time", "--max-concurrent", "1"))
    file_id = upload(c, jsonl([chat_line("a")]))
    release = tmp_path / "release"
    stream = c.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, stream=True,
        extra_body={"fake_hold_until": str(release)})
    chunks = iter(stream.parse())
    next(chunks)  # the stream holds the key's one lease until `release` exists
    for call in (lambda: upload(c, jsonl([chat_line("b")])), lambda: create(c, file_id)):
        with pytest.raises(openai.RateLimitError) as e:
            call()
        assert "max_concurrent is 1" in e.value.message and e.value.response.headers["retry-after"]
    release.touch()
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert create(c, upload(c, jsonl([chat_line("c")]))).status == "validating"  # the lease was given back


def test_a_keys_files_fit_its_storage_quota_and_deleting_makes_room(served: tuple[Path, FakeDaemon]) -> None:
    home, d = served
    c = client(d, key(home, "small", "--max-storage", "64KiB"))
    first = upload(c, jsonl([chat_line("a")]) + b" " * (40 << 10))
    with pytest.raises(openai.APIStatusError) as e:
        upload(c, b"y" * (40 << 10))
    assert e.value.status_code == 413
    err = e.value.response.json()["error"]
    assert err["code"] == "storage_quota_exceeded" and err["type"] == "invalid_request_error"
    used = c.files.retrieve(first).bytes
    assert f"holds {used} of the {64 << 10} bytes" in err["message"]
    ev = rejected(home, e.value.response.headers["x-blazar-trace-id"])
    assert ev["data"]["observations"]["used_bytes"] == used and ev["data"]["status"] == 413
    assert [f.id for f in c.files.list().data] == [first] and storage_used(home, "small") == used
    # Full to the byte: nothing more is read or made (and the SDK does not retry a 413).
    upload(c, b"z" * ((64 << 10) - used))
    for call in (lambda: upload(c, b"!"), lambda: create(c, first)):
        with pytest.raises(openai.APIStatusError) as full:
            call()
        assert full.value.status_code == 413 and "storage_quota_exceeded" in full.value.response.text
    c.files.delete(first)
    assert upload(c, b"y" * (40 << 10))
    # Another key's storage is its own.
    assert upload(client(d, key(home, "other", "--max-storage", "64KiB")), b"z" * (40 << 10))


def test_a_batch_whose_output_passes_the_quota_fails_with_its_files_whole(served: tuple[Path, FakeDaemon]) -> None:
    home, d = served
    c = client(d, key(home, "writer"))
    lines = [chat_line(f"line-{i}", max_tokens=100) for i in range(60)]  # each result about 1 KB
    file_id = upload(c, jsonl(lines))
    limit = c.files.retrieve(file_id).bytes + (8 << 10)  # room for a few of the 60 results, not all of them
    blazar_cli(home, "keys", "limits", "writer", "--max-storage", str(limit))
    done = wait_batch(c, create(c, file_id).id)
    assert done.status == "failed", done
    assert done.errors is not None and [e.code for e in done.errors.data] == ["storage_quota_exceeded"]
    assert f"of the {limit} bytes" in (done.errors.data[0].message or "")
    kept = done.request_counts.completed
    assert 0 < kept < 60 and done.request_counts.failed == 0
    out = [json.loads(x) for x in c.files.content(done.output_file_id).text.splitlines()]
    assert [x["custom_id"] for x in out] == [f"line-{i}" for i in range(kept)]  # whole lines, in order, none lost
    assert all(x["response"]["status_code"] == 200 for x in out)
    assert storage_used(home, "writer") <= limit
    assert not (home / "batches" / done.id).exists()  # its working files are gone


def test_a_key_has_at_most_its_open_batches(served: tuple[Path, FakeDaemon], tmp_path: Path) -> None:
    home, d = served
    c = client(d, key(home, "one-batch", "--max-open-batches", "1"))
    release = tmp_path / "release"
    held = create(c, upload(c, jsonl([chat_line("held", fake_hold_until=str(release))])))
    other = upload(c, jsonl([chat_line("next")]))
    with pytest.raises(openai.RateLimitError) as e:
        create(c, other)
    assert "has 1 open batches, its max_open_batches is 1" in e.value.message
    assert e.value.response.headers["retry-after"]
    assert rejected(home, e.value.response.headers["x-blazar-trace-id"])["data"]["observations"]["open"] == 1
    release.touch()
    assert wait_batch(c, held.id).status == "completed"
    assert wait_batch(c, create(c, other).id).status == "completed"
