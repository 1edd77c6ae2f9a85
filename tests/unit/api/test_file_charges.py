"""An upload is a request of its key's (blazar/api/charges.py), decided before its body is read: the assembled app
(auth, the gateway's limiter) driven through ASGI with a body the test hands over a chunk at a time. The upload
holds the key's concurrency lease while its body arrives and gives it back once stored; an upload refused for the
key's limits asks for no more of its body than the first chunk (which falcon reads before it routes)."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

from blazar.api.app import create_app
from blazar.context import Blazar
from blazar.operations import keys
from blazar.serving.admission import Admission
from blazar.serving.gateway import Gateway
from tests.support.bounds import HANG_S
from tests.support.fakes import FakeEngine, FakeSupervisor

BOUNDARY = "blazar-unit"
HEAD = (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--{BOUNDARY}\r\n'
        'Content-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n").encode()
TAIL = b'{"custom_id": "a"}\n' + f"\r\n--{BOUNDARY}--\r\n".encode()


class Upload:
    """One POST /v1/files through the ASGI app: its body is HEAD, then TAIL once `go_on` is set."""

    def __init__(self, api: Any, secret: str) -> None:
        self.api, self.secret = api, secret
        self.go_on, self.answered = asyncio.Event(), asyncio.Event()
        self.asked = asyncio.Event()  # the app asked for the body past its first chunk
        self.reads = 0  # how often the app asked for more of the body
        self.status: int | None = None
        self.body = b""

    async def receive(self) -> MutableMapping[str, Any]:
        self.reads += 1
        if self.reads == 1:
            return {"type": "http.request", "body": HEAD, "more_body": True}
        if self.reads == 2:
            self.asked.set()
            await self.go_on.wait()
            return {"type": "http.request", "body": TAIL, "more_body": False}
        await self.answered.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body":
            self.body += message.get("body", b"")
            if not message.get("more_body"):
                self.answered.set()

    async def __call__(self) -> None:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v1/files", "raw_path": b"/v1/files", "query_string": b"",
                 "root_path": "", "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 11435),
                 "headers": [(b"host", b"localhost"), (b"authorization", f"Bearer {self.secret}".encode()),
                             (b"content-type", f"multipart/form-data; boundary={BOUNDARY}".encode())]}
        await self.api(scope, self.receive, self.send)


async def test_an_upload_holds_its_keys_lease_while_its_body_arrives_and_a_refused_one_reads_none(
        app: Blazar) -> None:
    supervisor = FakeSupervisor()
    gateway = Gateway(app, supervisor, Admission(), FakeEngine())  # type: ignore[arg-type]
    api = create_app(app, supervisor, gateway)  # type: ignore[arg-type]
    _, secret = await keys.create(app, "one", max_concurrent=1)
    slow = Upload(api, secret)
    task = asyncio.create_task(slow())
    await asyncio.wait_for(slow.asked.wait(), HANG_S)  # the route reads the body: it is past the key's checks
    assert gateway.limits.in_flight("one") == 1 and slow.status is None
    refused = Upload(api, secret)
    refused.go_on.set()
    await asyncio.wait_for(refused(), HANG_S)
    assert refused.status == 429 and b"max_concurrent" in refused.body
    assert refused.reads == 1  # nothing of its body past the first chunk: never written anywhere
    slow.go_on.set()
    await asyncio.wait_for(task, HANG_S)
    assert slow.status == 200 and b'"filename":"in.jsonl"' in slow.body
    assert gateway.limits.in_flight("one") == 0
