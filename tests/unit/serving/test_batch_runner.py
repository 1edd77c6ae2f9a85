"""The batch runner's decisions against a real log and content store, with a fake pipeline: every line runs once at
the background priority, a restarted runner skips the lines the log says are done (and runs again the one that was
in flight), a refusal for want of room is tried again, a window that passed expires the rest, a bad line fails the
batch before anything runs."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from blazar.clock import FakeClock
from blazar.context import Blazar
from blazar.errors import QueueTimeout, Refused
from blazar.events.base import Event
from blazar.events.batches import BatchCreated, FileUploaded
from blazar.projections.batches import batch_row
from blazar.serving.admission import BACKGROUND_PRIORITY
from blazar.serving.batches import BatchRunner
from blazar.serving.request import Answer, Request
from blazar.store.files import FileStore, new_batch_id, new_file_id
from tests.support.bounds import HANG_S

BOUND_S = HANG_S


def ask(endpoint: str, body: dict[str, Any]) -> Request:
    if "prompt" not in body:
        raise ValueError("prompt: Field required")
    return Request(model=body["model"], engine_path=endpoint, body=None, stream=False,
                   max_tokens=body.get("max_tokens"))


class Pipeline:
    """Answers each line with its prompt's length as tokens; `hold` makes the line with that prompt wait (in flight)
    until released; `refuse` maps prompts to refusals raised once."""

    def __init__(self, hold: str | None = None, refuse: dict[str, Refused] | None = None) -> None:
        self.seen: list[Request] = []
        self.hold, self.refuse = hold, dict(refuse or {})
        self.held = asyncio.Event()
        self.release = asyncio.Event()  # set: the held line goes on

    async def serve(self, request: Request) -> Answer:
        self.seen.append(request)
        prompt = request.parsed["prompt"]
        if prompt in self.refuse:
            raise self.refuse.pop(prompt)
        if prompt == self.hold:
            self.held.set()
            await self.release.wait()  # until released, or cancelled
        body = {"object": "text_completion", "choices": [{"text": prompt.upper()}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": 1}}
        return Answer(status=200, data=orjson.dumps(body), content_type="application/json")


def line(i: int, **body: Any) -> bytes:
    return orjson.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
                         "body": {"model": "m", "prompt": f"p{i}", **body}}) + b"\n"


async def record(app: Blazar, *events: Event) -> None:
    await app.log.append(list(events), actor="test")
    await app.runner.catch_up()


async def a_batch(app: Blazar, data: bytes, window_s: float = 86400.0, owner: str = "") -> str:
    store = FileStore(app.paths)
    file_id = new_file_id()
    writing = store.writing(1 << 20)
    writing.write(data)
    stored = writing.keep(file_id)
    batch_id = new_batch_id()
    store.link_input(batch_id, file_id)
    await record(app, FileUploaded(file_id=file_id, filename="in.jsonl", purpose="batch", bytes=stored.bytes,
                                   sha256=stored.sha256),
             BatchCreated(batch_id=batch_id, owner=owner, input_file_id=file_id, endpoint="/v1/completions",
                          completion_window="24h", window_s=window_s))
    return batch_id


async def run_until(runner: BatchRunner, batch_id: str, statuses: set[str]) -> str:
    async with asyncio.timeout(BOUND_S):
        while True:
            await runner._step()
            row = batch_row(runner.app.runner.state("batches"), batch_id)
            assert row is not None
            if row.status in statuses:
                return row.status
            await asyncio.gather(*runner._flying.values())


async def done_indexes(app: Blazar) -> list[int]:
    return [r.event.index async for r in app.log.read(types=["batch.line_done"])]  # type: ignore[attr-defined]


def output(app: Blazar, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    data = FileStore(app.paths).open_file(file_id).read_bytes()
    return [orjson.loads(x) for x in data.splitlines()]


async def test_every_line_runs_once_below_every_client_and_the_output_keeps_the_input_order(app: Blazar) -> None:
    batch_id = await a_batch(app, line(0) + b"\n" + line(1) + line(2))  # a blank line is no request
    pipeline = Pipeline()
    runner = BatchRunner(app, pipeline, ask)  # type: ignore[arg-type]
    assert await run_until(runner, batch_id, {"completed"}) == "completed"
    assert sorted(r.parsed["prompt"] for r in pipeline.seen) == ["p0", "p1", "p2"]
    assert {r.priority for r in pipeline.seen} == {BACKGROUND_PRIORITY} and BACKGROUND_PRIORITY < -100
    assert sorted(await done_indexes(app)) == [0, 1, 2]
    row = batch_row(app.runner.state("batches"), batch_id)
    assert row is not None and (row.total, row.completed, row.failed, row.prompt_tokens) == (3, 3, 0, 6)
    out = output(app, row.output_file_id)
    assert [x["custom_id"] for x in out] == ["c0", "c1", "c2"] and row.error_file_id is None
    assert out[1]["response"]["body"]["choices"][0]["text"] == "P1"
    assert out[1]["response"]["request_id"] == pipeline.seen[1].trace_id
    # The working files are gone; the line answers live only in the output file.
    assert not FileStore(app.paths).batch_dir(batch_id).exists()


async def test_a_restarted_runner_skips_done_lines_and_runs_the_one_in_flight_again(app: Blazar) -> None:
    batch_id = await a_batch(app, line(0) + line(1) + line(2) + line(3))
    first = Pipeline(hold="p2")
    crashed = BatchRunner(app, first, ask)  # type: ignore[arg-type]
    async with asyncio.timeout(BOUND_S):
        while not first.held.is_set():
            await crashed._step()
            await asyncio.sleep(0)
            done = [t for t in crashed._flying.values() if t.done()]
            await asyncio.gather(*done)
    for task in list(crashed._flying.values()):  # the daemon stops: the line in flight records nothing
        task.cancel()
    await asyncio.gather(*crashed._flying.values(), return_exceptions=True)
    assert sorted(await done_indexes(app)) == [0, 1]
    again = Pipeline()
    resumed = BatchRunner(app, again, ask)  # type: ignore[arg-type]
    assert await run_until(resumed, batch_id, {"completed"}) == "completed"
    assert [r.parsed["prompt"] for r in again.seen] == ["p2", "p3"]
    assert sorted(await done_indexes(app)) == [0, 1, 2, 3]


async def test_a_refusal_for_room_is_tried_again_and_another_fails_the_line(app: Blazar) -> None:
    batch_id = await a_batch(app, line(0) + line(1))
    pipeline = Pipeline(refuse={"p0": QueueTimeout("no slot within 1 s"),
                                "p1": Refused("no model m", reason="model_not_found", http_status=404)})
    runner = BatchRunner(app, pipeline, ask, retry_pause_s=0.01)  # type: ignore[arg-type]
    assert await run_until(runner, batch_id, {"completed"}) == "completed"
    assert [r.parsed["prompt"] for r in pipeline.seen].count("p0") == 2
    row = batch_row(app.runner.state("batches"), batch_id)
    assert row is not None and (row.completed, row.failed) == (1, 1)
    (err,) = output(app, row.error_file_id)
    assert err["custom_id"] == "c1" and err["response"]["status_code"] == 404
    assert err["response"]["body"]["error"]["code"] == "model_not_found"


async def test_a_window_that_passed_expires_every_unfinished_line(app: Blazar, clock: FakeClock) -> None:
    batch_id = await a_batch(app, line(0) + line(1), window_s=60)
    runner = BatchRunner(app, Pipeline(), ask)  # type: ignore[arg-type]
    await runner._step()  # validated
    await asyncio.gather(*runner._flying.values())
    clock.advance(120)
    assert await run_until(runner, batch_id, {"expired", "completed"}) == "expired"
    row = batch_row(app.runner.state("batches"), batch_id)
    assert row is not None
    expired = [x for x in output(app, row.error_file_id) if x["error"] and x["error"]["code"] == "batch_expired"]
    assert len(expired) + row.completed == 2 and row.failed == len(expired)


async def test_a_bad_line_fails_the_batch_before_any_line_runs(app: Blazar) -> None:
    batch_id = await a_batch(app, line(0) + b'{"custom_id": "x"}\n' + line(2, stream=True) + b"[1]\n")
    pipeline = Pipeline()
    runner = BatchRunner(app, pipeline, ask)  # type: ignore[arg-type]
    assert await run_until(runner, batch_id, {"failed", "completed"}) == "failed"
    row = batch_row(app.runner.state("batches"), batch_id)
    assert row is not None
    assert [(e.line, e.code) for e in row.errors] == [(2, "invalid_method"), (3, "invalid_request"),
                                                     (4, "invalid_json_line")]
    assert pipeline.seen == []


@pytest.mark.parametrize(("window", "seconds"), [("24h", 86400.0), ("30m", 1800.0), ("90s", 90.0), ("1d", None),
                                                 ("0h", None), ("٣h", None), ("200h", None)])
def test_completion_windows(window: str, seconds: float | None) -> None:
    from blazar.serving.batch_lines import window_seconds

    assert window_seconds(window) == seconds


async def test_a_batch_whose_input_copy_is_gone_fails_instead_of_stalling(app: Blazar) -> None:
    batch_id = await a_batch(app, line(0) + line(1))
    first = BatchRunner(app, Pipeline(), ask)  # type: ignore[arg-type]
    await first._step()  # validated, line 0 started
    await asyncio.gather(*first._flying.values())
    FileStore(app.paths).input_path(batch_id).unlink()  # a home restored without it
    restarted = BatchRunner(app, Pipeline(), ask)  # type: ignore[arg-type]
    assert await run_until(restarted, batch_id, {"failed", "completed"}) == "failed"
    row = batch_row(app.runner.state("batches"), batch_id)
    assert row is not None and [e.code for e in row.errors] == ["file_not_found"] and row.completed == 1


async def test_the_lines_of_a_key_revoked_since_fail_and_never_reach_the_pipeline(app: Blazar) -> None:
    batch_id = await a_batch(app, line(0), owner="key:ghost")  # no such key (any more)
    pipeline = Pipeline()
    runner = BatchRunner(app, pipeline, ask)  # type: ignore[arg-type]
    assert await run_until(runner, batch_id, {"completed"}) == "completed"
    row = batch_row(app.runner.state("batches"), batch_id)
    assert row is not None and (row.completed, row.failed) == (0, 1) and pipeline.seen == []
    (err,) = output(app, row.error_file_id)
    assert err["response"]["status_code"] == 401 and "ghost" in err["response"]["body"]["error"]["message"]


async def test_at_start_the_working_files_of_no_open_batch_are_swept(app: Blazar) -> None:
    running = await a_batch(app, line(0))
    store = FileStore(app.paths)
    orphan = new_batch_id()  # its batch.created never reached the log
    store.write_line(orphan, 0, b"{}")
    runner = BatchRunner(app, Pipeline(), ask)  # type: ignore[arg-type]
    runner._sweep()
    assert not store.batch_dir(orphan).exists() and store.input_path(running).exists()


async def test_the_runner_keeps_offsets_not_lines_and_reads_each_line_when_it_runs(app: Blazar) -> None:
    import gc

    from blazar.serving.batch_lines import Line

    total = 200
    batch_id = await a_batch(app, b"".join(line(i, padding="x" * 1_000) for i in range(total)))
    pipeline = Pipeline(hold="p0")
    runner = BatchRunner(app, pipeline, ask)  # type: ignore[arg-type]
    async with asyncio.timeout(BOUND_S):
        while not pipeline.held.is_set():
            await runner._step()
            await asyncio.sleep(0)
    # Validated and running line 0: what the runner holds for the batch is its lines' offsets, 8 bytes each, and no
    # line but the one in flight (the whole input parsed was about 10x its size, per open batch).
    offsets = runner._offsets[batch_id]
    assert offsets.itemsize == 8 and len(offsets) == total
    gc.collect()
    held = [o for o in gc.get_objects() if isinstance(o, Line)]
    assert len(held) <= 1 and all(h.custom_id == "c0" for h in held)
    assert not [v for v in vars(runner).values() if isinstance(v, dict) and any(
        isinstance(x, list) and x and isinstance(x[0], Line) for x in v.values())]
    # A line is read from disk when it runs: changing the input under a later line changes what runs.
    path = FileStore(app.paths).input_path(batch_id)
    data = bytearray(path.read_bytes())
    at = offsets[5] + data[offsets[5]:].index(b'"p5"')
    data[at:at + 4] = b'"q5"'
    path.unlink()  # its own copy (a hard link): a new file under the name, the stored file untouched
    path.write_bytes(bytes(data))
    pipeline.release.set()
    assert await run_until(runner, batch_id, {"completed"}) == "completed"
    assert [r.parsed["prompt"] for r in pipeline.seen][:6] == ["p0", "p1", "p2", "p3", "p4", "q5"]


async def test_a_batch_whose_input_lost_lines_since_validation_fails_after_a_restart(app: Blazar) -> None:
    batch_id = await a_batch(app, line(0) + line(1) + line(2))
    first = BatchRunner(app, Pipeline(hold="p0"), ask)  # type: ignore[arg-type]
    await first._step()  # validated, line 0 started (and held)
    for task in list(first._flying.values()):
        task.cancel()
    await asyncio.gather(*first._flying.values(), return_exceptions=True)
    path = FileStore(app.paths).input_path(batch_id)
    path.unlink()
    path.write_bytes(line(0) + line(1))
    restarted = BatchRunner(app, Pipeline(), ask)  # type: ignore[arg-type]
    assert await run_until(restarted, batch_id, {"failed", "completed"}) == "failed"
    row = batch_row(app.runner.state("batches"), batch_id)
    assert row is not None and [e.code for e in row.errors] == ["file_changed"]


async def test_an_answer_past_the_keys_storage_stops_the_batch_keeping_whole_files(app: Blazar) -> None:
    from blazar.operations import keys
    from blazar.projections.batches import storage_used

    await keys.create(app, "writer", max_storage_bytes=1_000)
    batch_id = await a_batch(app, b"".join(line(i) for i in range(10)), owner="key:writer")
    pipeline = Pipeline()
    runner = BatchRunner(app, pipeline, ask)  # type: ignore[arg-type]
    assert await run_until(runner, batch_id, {"failed", "completed"}) == "failed"
    row = batch_row(app.runner.state("batches"), batch_id)
    assert row is not None and [e.code for e in row.errors] == ["storage_quota_exceeded"]
    assert "of the 1000 bytes" in row.errors[0].message and row.failed == 0
    kept = row.completed
    assert 0 < kept < 10 and len(pipeline.seen) == kept + 1  # the answer that did not fit, then no other line
    out = output(app, row.output_file_id)
    assert [x["custom_id"] for x in out] == [f"c{i}" for i in range(kept)]
    held = storage_used(app.runner.state("batches"), "key:writer")
    assert held <= 1_000 and held == FileStore(app.paths).open_file(row.output_file_id).stat().st_size
    # Full to the byte: a batch of the key's runs no line at all.
    await keys.change_limits(app, "writer", {"max_storage_bytes": held})
    full = await a_batch(app, line(0), owner="key:writer")
    assert await run_until(runner, full, {"failed", "completed"}) == "failed"
    assert len(pipeline.seen) == kept + 1
    row = batch_row(app.runner.state("batches"), full)
    assert row is not None and row.output_file_id is None and "no room" in row.errors[0].message
