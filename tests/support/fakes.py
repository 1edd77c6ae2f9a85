"""Stand-ins for what the app and the gateway are given: the supervisor, the engine client, the gateway. Each records
what it was asked; the tests assemble the real app (and the real gateway and admission) around them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx2
import orjson

from blazar.errors import EngineStreamBroken, EngineUnreachable, LoadFailed, ModelNotFound
from blazar.events.tuning import Posture
from blazar.instances.supervisor import UNSET, Instance, ResolvedModel
from tests.support.resolved import resolved

# What FakeEngine answers a chat that does not stream.
ANSWER = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 3, "completion_tokens": 1}}


class FakeSupervisor:
    """The supervisor, as the admin routes and the gateway call it.

    The admin commands (`load`, `stop`, `reset`) record each call in `calls`; `fail` makes the next one raise; `ps`
    answers `rows`; `load` reports `posture` and `profile_seq`.

    The gateway's side: `resolve` knows every model but "missing"; `ensure` records its model and keywords in
    `ensured` and hands out the one instance i1 on port 1, or, `in_turn`, instances i1, i2, ... on ports 1, 2, ...;
    each has `slots` slots. `held` counts holds less unholds. `dead` are the instances whose port refuses and whose
    child is gone (`gone` says so, and records whom it was asked about in `asked`); `exited` were gone from the
    supervisor by the time the request got its slot (`hold` raises LoadFailed).
    """

    def __init__(self, *, dead: set[str] | None = None, exited: set[str] | None = None, in_turn: bool = False,
                 slots: int = 2) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.fail: Exception | None = None
        self.rows: list[dict] = []
        self.posture: Posture | None = None
        self.profile_seq: int | None = None
        self.dead = dead or set()
        self.exited = exited or set()
        self.in_turn, self.slots = in_turn, slots
        self.ensured: list[dict[str, Any]] = []
        self.held = 0
        self.asked: list[str] = []

    # -- the admin routes --------------------------------------------------------------------------------------------

    def _maybe_fail(self) -> None:
        if self.fail is not None:
            raise self.fail

    async def load(self, model: str, *, keep_alive: Any = UNSET, pinned: Any = None, ctx: int | None = None,
                   session: bool = False) -> Instance:
        self.calls.append(("load", {"model": model, "keep_alive": keep_alive, "pinned": pinned, "ctx": ctx}
                           | ({"session": True} if session else {})))
        self._maybe_fail()
        return Instance(instance_id="abc123", model=model, port=40001, slots=2, ctx_tokens=ctx or 8192,
                        engine_tag="b1234", load_ms=420, posture=self.posture, profile_seq=self.profile_seq)

    async def stop(self, model: str) -> list[str]:
        self.calls.append(("stop", {"model": model}))
        self._maybe_fail()
        return ["abc123"]

    async def reset(self, model: str) -> bool:
        self.calls.append(("reset", {"model": model}))
        self._maybe_fail()
        return True

    def ps(self) -> list[dict]:
        return self.rows

    # -- the gateway -------------------------------------------------------------------------------------------------

    def resolve(self, model: str) -> ResolvedModel:
        if model == "missing":
            raise ModelNotFound("model 'missing' not found")
        return resolved(model)

    async def ensure(self, model: ResolvedModel, **kw: Any) -> Instance:
        name = model.name
        self.ensured.append({"name": name, **kw})
        n = len(self.ensured) if self.in_turn else 1
        return Instance(instance_id=f"i{n}", model=name, port=n, slots=self.slots, ctx_tokens=4096, engine_tag="t")

    def hold(self, inst: Instance) -> None:
        if inst.instance_id in self.exited:
            raise LoadFailed(f"instance {inst.instance_id} of {inst.model} is gone")
        self.held += 1

    def unhold(self, inst: Instance) -> None:
        self.held -= 1

    async def gone(self, inst: Instance) -> bool:
        self.asked.append(inst.instance_id)
        return inst.instance_id in self.dead


class KindsSupervisor(FakeSupervisor):
    """Resolves `*-whisper` and `*-piper` names as models of those kinds, every other name (but "missing") as a
    llama-server GGUF."""

    def resolve(self, model: str) -> ResolvedModel:
        got = super().resolve(model)
        for kind in ("whisper", "piper"):
            if model.endswith(f"-{kind}"):
                return replace(got, kind=kind)
        return got


class EngineStream(httpx2.Response):
    """A streamed answer read as the relay reads the engine client's (`aiter_raw(heartbeat_s)`, blazar/adapters/
    engines/client.py): a fake answers at once, so there is no silence to fill with heartbeats."""

    def aiter_raw(self, heartbeat_s: float | None = None) -> AsyncIterator[bytes]:  # type: ignore[override]
        return super().aiter_raw()


class FakeEngine:
    """The engine client (`open`, `count_tokens`); the instance on port N is iN.

    With `events` (a list a test may replace later), every request is answered with those SSE events, whatever it
    asked. Without, it answers as a chat engine: ANSWER whole, or streamed as one chunk and [DONE]; `breaks` breaks
    the stream after the chunk. A port in `refusing` refuses the connection (EngineUnreachable). What reached the
    engine is recorded twice: (path, body) in `sent`, (base_url, body) in `bodies`.
    """

    def __init__(self, *, refusing: set[int] | None = None, breaks: bool = False,
                 events: list[dict[str, Any]] | None = None) -> None:
        self.refusing, self.breaks = refusing or set(), breaks
        self.events = events
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.bodies: list[tuple[str, dict[str, Any]]] = []

    async def open(self, base_url: str, path: str, body: bytes, *, api_key: str | None = None) -> httpx2.Response:
        port = int(base_url.rsplit(":", 1)[1])
        if port in self.refusing:
            raise EngineUnreachable(f"the engine at {base_url} did not answer {path}: Cannot connect to host")
        self.sent.append((path, orjson.loads(body)))
        self.bodies.append((base_url, orjson.loads(body)))
        if self.events is not None:
            return self._scripted(self.events)
        if not orjson.loads(body).get("stream"):
            return httpx2.Response(200, content=orjson.dumps(ANSWER), headers={"content-type": "application/json"})
        chunk = {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}
        breaks = self.breaks

        async def blocks() -> AsyncIterator[bytes]:
            yield b"data: " + orjson.dumps(chunk) + b"\n\n"
            if breaks:
                raise EngineStreamBroken("the connection dropped")
            yield b"data: [DONE]\n\n"

        return EngineStream(200, content=blocks(), headers={"content-type": "text/event-stream"})

    @staticmethod
    def _scripted(events: list[dict[str, Any]]) -> httpx2.Response:
        blocks = [b"data: " + orjson.dumps(e) + b"\n\n" for e in events]

        async def stream() -> AsyncIterator[bytes]:
            for block in blocks:
                yield block

        return EngineStream(200, content=stream(), headers={"content-type": "text/event-stream"})

    async def count_tokens(self, base_url: str, route: str, body: dict[str, Any], *, api_key: str | None = None
                           ) -> int:
        return 10


class FakeGateway:
    """The routes only keep a reference to the gateway when the app is assembled; nothing here calls it."""
