"""Files and batches end to end: the official `openai` SDK's files and batches API against `blazar serve` with the real
llama-server and the real Gemma 3 270M (a base model: these tests assert shapes, counts, statuses and the log, never
the words). Each line runs through the gateway's pipeline as its key, below every interactive request, and a daemon
stopped mid-batch resumes it without running a finished line twice."""

from __future__ import annotations

import io
import json
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support import cli_zygote
from tests.support.blazar_home import read_events
from tests.support.daemon import free_port, healthy, start_serve, wait_for
from tests.support.serving import blazar_cli, serving_gemma, stop_daemon

MODEL = "gemma"
FILES_MAX = 64 << 10
TERMINAL = {"completed", "failed", "cancelled", "expired"}


class Served:
    def __init__(self, home: Path, port: int) -> None:
        self.home, self.port = home, port
        self.base = f"http://127.0.0.1:{port}"
        self.secrets: dict[str, str] = {}

    def key(self, name: str) -> None:
        out = blazar_cli(self.home, "keys", "create", name, "--json").stdout
        self.secrets[name] = json.loads(out)["secret"]

    def client(self, name: str = "alice") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key=self.secrets.get(name, "unused"), max_retries=0,
                             timeout=120)

    def events(self, *types: str) -> list[dict[str, Any]]:
        return read_events(self.home, *types)


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def chat_line(custom_id: str, content: str = "Once upon a time", **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4,
                     "temperature": 0, **body}}


def slow_line(custom_id: str, tokens: int) -> dict[str, Any]:
    """A completion that generates exactly `tokens` tokens (the end of text ignored): a line that takes a while."""
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
            "body": {"model": MODEL, "prompt": f"Story {custom_id}: once upon a time", "max_tokens": tokens,
                     "ignore_eos": True, "temperature": 0}}


def upload(client: openai.OpenAI, data: bytes, name: str = "input.jsonl") -> str:
    return client.files.create(file=(name, io.BytesIO(data)), purpose="batch").id


def wait_batch(client: openai.OpenAI, batch_id: str, until: set[str] = TERMINAL, timeout: float = 180) -> Any:
    return wait_for(lambda: (b := client.batches.retrieve(batch_id)).status in until and b, f"batch in {until}",
                    timeout=timeout)


def output_lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path) -> Iterator[Served]:
    home = tmp_path_factory.mktemp("batches-home")
    settings = {"ctx": 1024, "slots": 1, "files_max_bytes": FILES_MAX, "keep_alive": "10m"}
    with serving_gemma(home, engine_binary, gemma_path, MODEL, settings) as (port, _):
        s = Served(home, port)
        s.key("alice")
        s.key("bob")
        yield s


def test_a_batch_runs_every_line_and_its_files_hold_the_answers(served: Served) -> None:
    client = served.client()
    lines = [chat_line("a"), chat_line("b", "The sky is"), chat_line("c", max_tokens=2),
             chat_line("missing", model="no-such-model")]
    file_id = upload(client, jsonl(lines))
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"run": "first"})
    assert batch.status == "validating" and batch.input_file_id == file_id and batch.metadata == {"run": "first"}
    done = wait_batch(client, batch.id)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (4, 3, 1)
    assert done.completed_at and done.in_progress_at and done.output_file_id and done.error_file_id
    out = output_lines(client, done.output_file_id)
    assert [line["custom_id"] for line in out] == ["a", "b", "c"]
    for line in out:
        assert line["id"].startswith("batch_req_") and line["error"] is None
        assert line["response"]["status_code"] == 200
        assert line["response"]["body"]["object"] == "chat.completion"
        assert 0 < line["response"]["body"]["usage"]["completion_tokens"] <= 4
    errors = output_lines(client, done.error_file_id)
    assert [(e["custom_id"], e["response"]["status_code"]) for e in errors] == [("missing", 404)]
    assert "no-such-model" in errors[0]["response"]["body"]["error"]["message"]
    # The output file is the key's own file, with purpose batch_output.
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"
    # The log: each line done once, as alice, its request a trace of the pipeline; no answer text in the log.
    line_events = [e for e in served.events("batch.line_done") if e["data"]["batch_id"] == batch.id]
    assert sorted(e["data"]["index"] for e in line_events) == [0, 1, 2, 3]
    assert {e["actor"] for e in line_events} == {"key:alice"}
    traces = {e["data"]["trace_id"] for e in line_events}
    assert traces == {line["response"]["request_id"] for line in out + errors}
    received = [e for e in served.events("request.received") if e["trace_id"] in traces]
    assert len(received) == 4 and {e["data"]["priority"] for e in received} == {-1000}
    assert {e["actor"] for e in received} == {"key:alice"}
    answer_text = out[0]["response"]["body"]["choices"][0]["message"]["content"]
    if len(answer_text) > 8:
        assert not any(answer_text in json.dumps(e["data"]) for e in served.events())
    types = [e["type"] for e in served.events() if e["stream"] == f"batch:{batch.id}"]
    assert types[:2] == ["batch.created", "batch.validated"] and types[-1] == "batch.completed"


BODIES = {"/v1/completions": ({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 3}, "text_completion"),
          "/v1/embeddings": ({"model": MODEL, "input": ["hello world"]}, "list"),
          "/v1/responses": ({"model": MODEL, "input": "Once upon a time", "max_output_tokens": 3}, "response")}


@pytest.mark.parametrize("endpoint", list(BODIES))
def test_completions_embeddings_and_responses_batches(served: Served, endpoint: str) -> None:
    client = served.client()
    body, kind = BODIES[endpoint]
    file_id = upload(client, jsonl([{"custom_id": "x", "method": "POST", "url": endpoint, "body": body}]))
    done = wait_batch(client, client.batches.create(input_file_id=file_id, endpoint=endpoint,  # type: ignore[arg-type]
                                                    completion_window="24h").id)
    assert done.status == "completed", done
    (line,) = output_lines(client, done.output_file_id)
    assert line["response"]["status_code"] == 200
    assert line["response"]["body"]["object"] == kind


def test_a_bad_line_fails_the_whole_batch_before_any_runs(served: Served) -> None:
    client = served.client()
    data = jsonl([chat_line("ok")]) + b"{not json\n" + jsonl([
        {**chat_line("wrong-url"), "url": "/v1/completions"},
        {"custom_id": "no-messages", "method": "POST", "url": "/v1/chat/completions", "body": {"model": MODEL}},
        chat_line("ok"),  # a custom_id used twice
    ])
    batch = client.batches.create(input_file_id=upload(client, data), endpoint="/v1/chat/completions",
                                  completion_window="24h")
    done = wait_batch(client, batch.id)
    assert done.status == "failed" and done.failed_at
    assert done.errors is not None and done.errors.data is not None
    got = [(e.line, e.code) for e in done.errors.data]
    assert got == [(2, "invalid_json_line"), (3, "mismatched_endpoint"), (4, "invalid_request"),
                   (5, "duplicate_custom_id")]
    assert "messages" in (done.errors.data[2].message or "")
    assert not [e for e in served.events("batch.line_done") if e["data"]["batch_id"] == batch.id]


def test_bad_requests_are_refused_in_openai_shape(served: Served) -> None:
    client = served.client()
    with pytest.raises(openai.APIStatusError) as too_large:
        upload(client, b"x" * (FILES_MAX + 1))
    assert too_large.value.status_code == 413
    assert "files_max_bytes" in too_large.value.response.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.files.create(file=("t.jsonl", io.BytesIO(b"{}\n")), purpose="fine-tune")
    file_id = upload(client, jsonl([chat_line("a")]))
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        client.batches.create(input_file_id=file_id, endpoint="/v1/moderations", completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                              completion_window="tomorrow")  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-000000000000000000000000", endpoint="/v1/chat/completions",
                              completion_window="24h")


def test_files_upload_list_content_delete(served: Served) -> None:
    client = served.client()
    data = jsonl([chat_line("a")])
    f = client.files.create(file=("mine.jsonl", io.BytesIO(data)), purpose="batch")
    assert (f.object, f.bytes, f.filename, f.purpose) == ("file", len(data), "mine.jsonl", "batch")
    assert client.files.retrieve(f.id).bytes == len(data)
    assert client.files.content(f.id).content == data
    assert f.id in [x.id for x in client.files.list()]
    uploaded = next(e for e in served.events("file.uploaded") if e["data"]["file_id"] == f.id)
    assert uploaded["data"]["bytes"] == len(data) and len(uploaded["data"]["sha256"]) == 64
    assert uploaded["actor"] == "key:alice" and "Once upon" not in json.dumps(uploaded)
    deleted = client.files.delete(f.id)
    assert deleted.deleted and deleted.id == f.id
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(f.id)
    assert not (served.home / "files" / f.id).exists()


def test_another_keys_files_and_batches_are_404(served: Served) -> None:
    alice, bob = served.client("alice"), served.client("bob")
    file_id = upload(alice, jsonl([chat_line("a")]))
    batch = alice.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    for call in (lambda: bob.files.retrieve(file_id), lambda: bob.files.content(file_id),
                 lambda: bob.files.delete(file_id), lambda: bob.batches.retrieve(batch.id),
                 lambda: bob.batches.cancel(batch.id),
                 lambda: bob.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                            completion_window="24h")):
        with pytest.raises(openai.NotFoundError):
            call()
    assert file_id not in [f.id for f in bob.files.list()]
    assert batch.id not in [b.id for b in bob.batches.list()]
    assert batch.id in [b.id for b in alice.batches.list(limit=5)]
    assert wait_batch(alice, batch.id).status == "completed"
    # Newest first, a page at a time.
    every = [b.id for b in alice.batches.list(limit=100).data]
    first = alice.batches.list(limit=1)
    assert [b.id for b in first.data] == [batch.id] == every[:1] and first.has_more == (len(every) > 1)
    assert [b.id for b in alice.batches.list(limit=100, after=batch.id).data] == every[1:]
    assert all(f.purpose == "batch" for f in alice.files.list(purpose="batch"))


def test_cancel_stops_a_batch_and_keeps_what_ran(served: Served) -> None:
    client = served.client()
    lines = [slow_line(f"s{i}", 12) for i in range(24)]
    batch = client.batches.create(input_file_id=upload(client, jsonl(lines)), endpoint="/v1/completions",
                                  completion_window="24h")
    wait_for(lambda: any(e["data"]["batch_id"] == batch.id for e in served.events("batch.line_done")),
             "a first line done", timeout=120)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    done = wait_batch(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    assert done.request_counts is not None and 1 <= done.request_counts.completed < 24
    out = output_lines(client, done.output_file_id)
    assert len(out) == done.request_counts.completed and all(line["response"]["status_code"] == 200 for line in out)
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_an_interactive_request_is_admitted_ahead_of_queued_batch_lines(served: Served) -> None:
    client = served.client()
    total = 24
    batch = client.batches.create(input_file_id=upload(client, jsonl([slow_line(f"p{i}", 12) for i in range(total)])),
                                  endpoint="/v1/completions", completion_window="24h")
    wait_for(lambda: any(e["data"]["batch_id"] == batch.id for e in served.events("batch.line_done")),
             "a first line done", timeout=120)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=2)
    trace = raw.headers["x-blazar-trace-id"]
    client.batches.cancel(batch.id)  # what it shows is shown: the rest need not run
    assert wait_batch(client, batch.id).status == "cancelled"
    done_events = [e for e in served.events("batch.line_done") if e["data"]["batch_id"] == batch.id]
    line_traces = {e["data"]["trace_id"] for e in done_events}
    evs = served.events("request.received", "request.admitted")
    line_traces |= {e["trace_id"] for e in evs if e["type"] == "request.received" and e["data"]["priority"] == -1000}
    arrived = next(e["seq"] for e in evs if e["trace_id"] == trace and e["type"] == "request.received")
    admitted = next(e["seq"] for e in evs if e["trace_id"] == trace and e["type"] == "request.admitted")
    assert len([e for e in done_events if e["seq"] < arrived]) < total, "it came while the batch ran"
    # The line that held the one slot when it came finishes; no other line is admitted before it.
    assert not [e for e in evs if e["type"] == "request.admitted" and e["trace_id"] in line_traces
                and arrived < e["seq"] < admitted]


def test_a_window_that_passes_expires_the_unfinished_lines(served: Served) -> None:
    client = served.client()
    lines = [slow_line(f"e{i}", 12) for i in range(24)]
    batch = client.batches.create(input_file_id=upload(client, jsonl(lines)), endpoint="/v1/completions",
                                  completion_window="2s")  # type: ignore[arg-type]
    done = wait_batch(client, batch.id, timeout=120)
    assert done.status == "expired" and done.expired_at
    assert done.request_counts is not None and done.request_counts.completed < 24
    errors = output_lines(client, done.error_file_id)
    expired = [e for e in errors if e["error"] and e["error"]["code"] == "batch_expired"]
    assert len(expired) == 24 - done.request_counts.completed and all(e["response"] is None for e in expired)
    ran = {line["custom_id"] for line in output_lines(client, done.output_file_id)}
    assert ran.isdisjoint({e["custom_id"] for e in expired})


# -- a restart mid-batch ----------------------------------------------------------------------------------------------

def _serve(home: Path, port: int) -> subprocess.Popen[bytes] | cli_zygote.Process:
    """`blazar serve` again on `home` (a restart), up once /health answers; its stderr in a file beside the home."""
    log = home.parent / f"{home.name}-restart-daemon.log"
    proc = start_serve(home, "--port", str(port), log=log)
    try:
        wait_for(lambda: healthy(port), "/health", proc=proc)
    except AssertionError as e:
        stop_daemon(proc)
        raise AssertionError(f"{e}\n{log.read_text(errors='replace')[-8000:]}") from None
    return proc


def test_a_restart_mid_batch_resumes_it_without_running_a_finished_line_twice(
        tmp_path: Path, engine_binary: Path, gemma_path: Path) -> None:
    home = tmp_path / "home"
    total = 8
    with serving_gemma(home, engine_binary, gemma_path, MODEL, {"ctx": 1024, "slots": 1}) as (port, proc):
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)
        batch = client.batches.create(
            input_file_id=upload(client, jsonl([slow_line(f"r{i}", 6) for i in range(total)])),
            endpoint="/v1/completions", completion_window="24h")
        wait_for(lambda: read_events(home, "batch.line_done"), "a first line done", timeout=120)
        stop_daemon(proc)
    before = read_events(home, "batch.line_done")
    assert 1 <= len(before) < total, "the daemon stopped mid-batch"
    port = free_port()
    proc = _serve(home, port)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)
        done = wait_batch(client, batch.id, timeout=240)
        assert done.status == "completed", done
        assert done.request_counts is not None and done.request_counts.completed == total
        out = output_lines(client, done.output_file_id)
        assert [line["custom_id"] for line in out] == [f"r{i}" for i in range(total)]
    finally:
        stop_daemon(proc)
    indexes = Counter(e["data"]["index"] for e in read_events(home, "batch.line_done"))
    assert indexes == Counter(range(total)), "every line done exactly once"
    # The lines done before the stop never ran again: each index's trace is the one recorded before the stop.
    first = {e["data"]["index"]: e["data"]["trace_id"] for e in before}
    line_traces = {e["trace_id"] for e in read_events(home, "request.received") if e["data"]["priority"] == -1000}
    assert len(line_traces) in (total, total + 1)  # + the line that was running when the daemon stopped
    reran = [e for e in read_events(home, "batch.line_done") if e["data"]["index"] in first]
    assert {e["data"]["trace_id"] for e in reran} == set(first.values())
