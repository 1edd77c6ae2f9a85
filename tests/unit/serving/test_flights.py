"""Single-flight's fault paths, against a fake supervisor and a fake engine that the test holds at a gate: a
follower that joined a leader which is then refused meets the same refusal (recorded on its own trace); a leader
that goes away before anything was shared leaves its followers to run again, as leaders of their own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import orjson
import pytest

from blazar.context import Blazar
from blazar.errors import Refused
from blazar.instances.supervisor import Instance, ResolvedModel
from blazar.serving.admission import Admission
from blazar.serving.gateway import Gateway
from blazar.serving.request import Request
from tests.support.bounds import HANG_S
from tests.support.fakes import EngineStream
from tests.support.resolved import resolved

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0, "stream": True}
CHUNK = {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "Hi"}}]}


class GatedSupervisor:
    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.ctx_tokens = 4096

    def resolve(self, model: str) -> ResolvedModel:
        return resolved(model)

    async def ensure(self, model: ResolvedModel, **kw: Any) -> Instance:
        await self.gate.wait()
        return Instance(instance_id="i1", model=model.name, port=1, slots=2, ctx_tokens=self.ctx_tokens,
                        engine_tag="t")

    def hold(self, inst: Instance) -> None: ...

    def unhold(self, inst: Instance) -> None: ...


class Engine:
    def __init__(self) -> None:
        self.opened = 0

    async def open(self, base_url: str, path: str, body: bytes, *, api_key: str | None = None) -> httpx2.Response:
        self.opened += 1
        blocks = [b"data: " + orjson.dumps(CHUNK) + b"\n\n", b"data: [DONE]\n\n"]

        async def stream() -> AsyncIterator[bytes]:
            for block in blocks:
                yield block

        return EngineStream(200, content=stream(), headers={"content-type": "text/event-stream"})

    async def count_tokens(self, base_url: str, route: str, body: dict[str, Any], *, api_key: str | None = None
                           ) -> int:
        return 10_000  # over any context: a refusal when the cheap bound does not settle it


def plan(trace: str) -> Request:
    raw = orjson.dumps(BODY)
    return Request(model="m", engine_path="/v1/chat/completions", body=None, stream=True, path="/v1/chat/completions",
                   raw=raw, parsed=dict(BODY), trace_id=trace)


@pytest.fixture
def sup() -> GatedSupervisor:
    return GatedSupervisor()


@pytest.fixture
async def gateway(app: Blazar, sup: GatedSupervisor) -> Gateway:
    return Gateway(app, sup, Admission(), Engine())  # type: ignore[arg-type]


async def trace_types(app: Blazar, trace: str) -> list[str]:
    await app.request_writer().flush()
    return [r.type async for r in app.log.read(trace_id=trace)]


async def test_a_follower_of_a_refused_leader_meets_the_same_refusal(app: Blazar, sup: GatedSupervisor,
                                                                      gateway: Gateway) -> None:
    sup.ctx_tokens = 16  # the prompt's bound is over it and the engine counts 10,000: context_length_exceeded
    leader = asyncio.create_task(gateway.serve(plan("a" * 32)))
    await asyncio.sleep(0.01)
    follower = asyncio.create_task(gateway.serve(plan("b" * 32)))
    await asyncio.sleep(0.01)
    sup.gate.set()
    for task in (leader, follower):
        with pytest.raises(Refused) as e:
            await asyncio.wait_for(task, HANG_S)
        assert (e.value.http_status, e.value.reason) == (400, "context_length_exceeded")
    assert (await trace_types(app, "b" * 32)) == ["request.received", "request.shared", "request.rejected"]
    assert (await trace_types(app, "a" * 32))[-1] == "request.rejected"


async def test_a_leader_gone_before_sharing_leaves_its_follower_to_run_again(app: Blazar, sup: GatedSupervisor,
                                                                              gateway: Gateway) -> None:
    async def client(p: Request) -> tuple[dict[str, str], bytes]:
        """As the server does: the answer's stream is sent from the request's own task."""
        answer = await gateway.serve(p)
        assert answer.stream is not None
        return answer.headers, b"".join([chunk async for chunk in answer.stream])

    leader = asyncio.create_task(client(plan("c" * 32)))
    await asyncio.sleep(0.01)
    follower = asyncio.create_task(client(plan("d" * 32)))
    await asyncio.sleep(0.01)
    leader.cancel()  # its client hung up while the model "loaded"
    with pytest.raises(asyncio.CancelledError):
        await leader
    sup.gate.set()
    headers, body = await asyncio.wait_for(follower, HANG_S)
    assert headers["x-blazar-shared"] == "leader"  # it ran again, leading
    assert body.endswith(b"data: [DONE]\n\n") and b'"Hi"' in body
    assert (await trace_types(app, "c" * 32))[-1] == "request.failed"
    assert (await trace_types(app, "d" * 32)) == [
        "request.received", "request.shared", "request.routed", "request.admitted", "request.first_token",
        "request.completed"]
    assert len(gateway.flights) == 0
