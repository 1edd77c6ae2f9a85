"""Bounded output through the gateway, against a fake supervisor and a fake engine that counts the prompt at 1,000
tokens in a 1,024-token slot: a max_tokens the context cannot hold runs capped at what is left (the engine is asked
for that, the answer's header and `request.bounded` say so); `max_tokens_over_context = refuse` keeps the 400."""

from __future__ import annotations

from typing import Any

import httpx2
import orjson
import pytest

from blazar import config
from blazar.context import Blazar
from blazar.errors import Refused
from blazar.instances.supervisor import Instance, ResolvedModel
from blazar.serving.admission import Admission
from blazar.serving.call import Call
from blazar.serving.context_fit import BOUNDED_HEADER
from blazar.serving.gateway import Gateway
from blazar.serving.request import Request
from tests.support.resolved import resolved

PROMPT_TOKENS, CTX = 1000, 1024
ANSWER = {"id": "c1", "object": "chat.completion", "model": "m",
          "choices": [{"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": "x"}}],
          "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 24, "total_tokens": CTX}}


class Supervisor:
    def resolve(self, model: str) -> ResolvedModel:
        return resolved(model)

    async def ensure(self, model: ResolvedModel, **kw: Any) -> Instance:
        return Instance(instance_id="i1", model=model.name, port=1, slots=1, ctx_tokens=CTX, engine_tag="t")

    def hold(self, inst: Instance) -> None: ...

    def unhold(self, inst: Instance) -> None: ...


class Engine:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def open(self, base_url: str, path: str, body: bytes, *, api_key: str | None = None) -> httpx2.Response:
        self.bodies.append(orjson.loads(body))
        return httpx2.Response(200, content=orjson.dumps(ANSWER), headers={"content-type": "application/json"})

    async def count_tokens(self, base_url: str, route: str, body: dict[str, Any], *, api_key: str | None = None
                           ) -> int:
        return PROMPT_TOKENS


def ask(trace: str, **limits: int) -> Request:
    body = {"model": "m", "messages": [{"role": "user", "content": "w " * 600}], **limits}
    return Request(model="m", engine_path="/v1/chat/completions", body=None, stream=False,
                   path="/v1/chat/completions", raw=orjson.dumps(body), parsed=body, trace_id=trace,
                   max_tokens=limits.get("max_completion_tokens") or limits.get("max_tokens"))


async def trace_of(app: Blazar, trace: str) -> list[Any]:
    await app.request_writer().flush()
    return [r async for r in app.log.read(trace_id=trace)]


async def test_an_output_over_the_context_is_bounded_and_says_so(app: Blazar) -> None:
    engine = Engine()
    gateway = Gateway(app, Supervisor(), Admission(), engine)  # type: ignore[arg-type]
    answer = await gateway.serve(ask("a" * 32, max_tokens=32000, max_completion_tokens=32000))
    assert engine.bodies[-1]["max_tokens"] == engine.bodies[-1]["max_completion_tokens"] == CTX - PROMPT_TOKENS
    assert answer.headers[BOUNDED_HEADER] == str(CTX - PROMPT_TOKENS)
    records = await trace_of(app, "a" * 32)
    assert [r.type for r in records] == ["request.received", "request.routed", "request.bounded",
                                        "request.admitted", "request.first_token", "request.completed"]
    bounded = records[2].event
    assert (bounded.prompt_tokens, bounded.max_tokens, bounded.bounded_max_tokens, bounded.ctx_tokens) == (
        PROMPT_TOKENS, 32000, CTX - PROMPT_TOKENS, CTX)
    # What fits runs as asked: nothing bounded, no header.
    answer = await gateway.serve(ask("b" * 32, max_tokens=10))
    assert engine.bodies[-1]["max_tokens"] == 10 and BOUNDED_HEADER not in answer.headers
    assert "request.bounded" not in [r.type for r in await trace_of(app, "b" * 32)]


async def test_refuse_keeps_todays_400(app: Blazar, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app, "settings", lambda: config.build({"inputs.max_tokens_over_context": "refuse"}))
    engine = Engine()
    gateway = Gateway(app, Supervisor(), Admission(), engine)  # type: ignore[arg-type]
    with pytest.raises(Refused) as e:
        await gateway.serve(ask("c" * 32, max_tokens=32000))
    assert (e.value.http_status, e.value.reason) == (400, "context_length_exceeded") and not engine.bodies
    assert [r.type for r in await trace_of(app, "c" * 32)][-1] == "request.rejected"


def test_a_request_routed_again_forgets_the_cap_of_its_first_instance() -> None:
    call = Call(ask("d" * 32, max_tokens=32000), Gateway.__new__(Gateway))
    call.ask.bound_output(24, {"max_tokens": 24, "n_predict": 24})
    assert call.ask.engine_body()["max_tokens"] == call.ask.engine_body()["n_predict"] == 24
    assert (call.ask.max_tokens, call.ask.bounded_max_tokens) == (24, 24)
    call.ask.unbound()
    assert call.ask.engine_body()["max_tokens"] == 32000 and "n_predict" not in call.ask.engine_body()
    assert (call.ask.max_tokens, call.ask.bounded_max_tokens) == (32000, None)
    assert call.request.parsed["max_tokens"] == 32000  # the client's body was never changed
