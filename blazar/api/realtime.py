"""`/v1/realtime?model=NAME` over a WebSocket: the OpenAI Realtime API's text sessions. Auth decides at the door as
on every route (blazar/api/auth.py `process_resource_ws`); a refusal, a model out of the key's scope or unknown is
told as an `error` event, then the socket is closed with 1008 (policy violation): the SDK's client reads the words.
Each response is a chat through the gateway's own pipeline as an internal /v1/chat/completions request of the same
caller (`GatewayChat`: scope, limits, admission, the request's events and trace as any chat's). The session itself
is blazar/serving/realtime/session.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import falcon
import falcon.asgi
import orjson

from blazar.api import bounds, errors
from blazar.api.auth import REALTIME_PROTOCOL, Access, principal_of
from blazar.api.realtime_caller import PATH, Caller
from blazar.api.realtime_hear import GatewayHear
from blazar.api.realtime_trace import GatewayTurns
from blazar.api.realtime_voice import session_voice
from blazar.api.routes import Deps, Route
from blazar.dialects.tools import constrain
from blazar.errors import BlazarError, ModelNotFound, RealtimeChatRefused, RealtimeProfileError
from blazar.ids import new_trace_id
from blazar.queries import realtime as profiles
from blazar.serving.prefix import agent_of
from blazar.serving.principal import Principal
from blazar.serving.realtime.events import error
from blazar.serving.realtime.facts import TurnModels
from blazar.serving.realtime.port import Absent, ChatWatch, ToolCallDelta, Usage
from blazar.serving.realtime.session import NO_WHISPER, Bounds, RealtimeSession
from blazar.serving.request import NO_HOOKS, Hooks

CHAT = "/v1/chat/completions"
POLICY_VIOLATION = 1008
TOO_BIG = 1009
GOING_AWAY = 1001


class GatewayChat:
    """A session's chats, each an internal chat request of the connection's caller through `Gateway.serve`."""

    def __init__(self, caller: Caller) -> None:
        self.caller = caller

    async def chat(self, body: dict[str, Any], watch: ChatWatch | None = None
                   ) -> AsyncIterator[str | Usage | ToolCallDelta]:
        raw = orjson.dumps(body)
        asked = dict(body)  # a forced tool choice is rewritten as the engine's grammar, as the chat route does
        hooks = Hooks(on_queued=watch.chat_queued) if watch is not None else NO_HOOKS
        trace_id = new_trace_id()
        if watch is not None:
            watch.chat_began(trace_id)
        try:
            forced = constrain(asked)
            request = self.caller.request(model=body["model"], engine_path=CHAT, body=asked, stream=True,
                                          max_tokens=body.get("max_tokens"), forced=forced, trace_id=trace_id,
                                          raw=raw, parsed=body, hooks=hooks)
            answer = await self.caller.gateway.serve(request)
        except BlazarError as e:
            raise RealtimeChatRefused(self.caller.tell(e), e.code) from None
        if answer.stream is None:
            message = answer.refusal[0] if answer.refusal else f"the engine answered {answer.status}"
            raise RealtimeChatRefused(message, "engine_error")
        stream = answer.stream
        try:
            async for piece in sse_pieces(stream):
                yield piece
        finally:  # NOTE: closed now, not when collected: its relay ends the engine request and the call
            if isinstance(stream, AsyncGenerator):
                await stream.aclose()


async def sse_pieces(stream: AsyncIterator[bytes]) -> AsyncIterator[str | Usage | ToolCallDelta]:
    """An OpenAI chat stream's text deltas, tool-call pieces and usage, from the SSE bytes as they come (events may be
    split)."""
    rest = b""
    async for block in stream:
        rest += block
        *lines, rest = rest.split(b"\n")
        for line in lines:
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            data = orjson.loads(line[6:])
            if "error" in data:
                broke = str(data["error"].get("message", "the engine's stream broke"))
                raise RealtimeChatRefused(broke, "engine_error")
            for choice in data.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    yield delta["content"]
                for call in delta.get("tool_calls") or ():
                    yield _call_piece(call)
            usage = data.get("usage")
            if usage:
                yield Usage(int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)))


def _call_piece(call: dict[str, Any]) -> ToolCallDelta:
    fn = call.get("function") or {}
    return ToolCallDelta(int(call.get("index") or 0), call.get("id") or None, fn.get("name") or None,
                         fn.get("arguments") or "")


@dataclass(frozen=True, slots=True)
class Served:
    """The models a connection's session runs on: the chat model, and the whisper model that hears (None: the
    session does not hear, `absent` says why)."""

    llm: str
    stt: str | None
    absent: Absent = NO_WHISPER


class Realtime:
    def __init__(self, deps: Deps) -> None:
        self.app = deps.app
        self.gateway = deps.gateway
        self.audience = errors.Audience.of(deps.app)

    async def on_websocket(self, req: falcon.asgi.Request, ws: falcon.asgi.WebSocket) -> None:
        # A browser that offered subprotocols fails a handshake that picks none: `realtime` when asked, never the key's.
        await ws.accept(subprotocol=REALTIME_PROTOCOL if REALTIME_PROTOCOL in ws.subprotocols else None)
        model = req.get_param("model") or ""
        refused = getattr(req.context, "refused", None)
        principal = principal_of(req)
        try:
            if refused is not None:
                raise refused
            if not model:
                raise ModelNotFound("the model is asked in the URL: /v1/realtime?model=NAME")
            bounds.check_name(model)
            served = self._models(req, principal, model)
        except (BlazarError, falcon.HTTPError) as e:
            await self._refuse(req, ws, e)
            return
        await self._serve(req, ws, model, principal, served)

    def _models(self, req: falcon.asgi.Request, principal: Principal | None, model: str) -> Served:
        """What serves a session asking for `model` (blazar/queries/realtime.py): a profile's models, each in the
        key's scope (else refused); or the chat model, in its scope, hearing with the default whisper model when the
        store has one and the key may use it (else the session is text only, and says why when audio is asked).
        NOTE: the scope before existence: nothing told beyond it."""
        p = profiles.profile(self.app, model)
        if p is not None:
            for name in (p.stt, p.llm, p.tts):
                self.gateway.check_scope(principal, name)
            m = profiles.session_models(self.app, model)
            return Served(m.llm, m.stt)
        self.gateway.check_scope(principal, model)
        self.gateway.supervisor.resolve(model)
        try:
            stt = profiles.default_stt(self.app)
        except RealtimeProfileError as e:
            return Served(model, None, Absent("audio_not_supported", str(e)))
        try:
            self.gateway.check_scope(principal, stt)
        except BlazarError as e:
            return Served(model, None, Absent(e.code, f"{self.audience.told(req, e)} ({stt} is the whisper model "
                                                      "that hears this session)"))
        return Served(model, stt)

    async def _refuse(self, req: falcon.asgi.Request, ws: falcon.asgi.WebSocket, e: Exception) -> None:
        if isinstance(e, BlazarError):
            message, code = self.audience.told(req, e), e.code
        else:  # a bad model name (bounds.check_name)
            message, code = str(getattr(e, "description", None) or e), "invalid_request_error"
        await ws.send_media(error(message, code=code))
        await ws.close(POLICY_VIOLATION)

    async def _serve(self, req: falcon.asgi.Request, ws: falcon.asgi.WebSocket, model: str,
                     principal: Principal | None, served: Served) -> None:
        inputs = self.app.settings().inputs
        agent = agent_of(req.get_header("User-Agent"))
        caller = Caller(self.gateway, principal, req.remote_addr, agent, lambda e: self.audience.told(req, e))
        chat = GatewayChat(caller)
        hear = None if served.stt is None else GatewayHear(caller, served.stt, inputs.max_audio_s)

        async def send(event: dict[str, Any]) -> None:
            await ws.send_text(orjson.dumps(event).decode())

        limits = Bounds(inputs.realtime_max_items, inputs.realtime_max_output_tokens,
                        max_tools=inputs.realtime_max_tools, max_buffer_s=inputs.realtime_max_buffer_s)
        voice, no_voice, no_voice_code = session_voice(self.app, caller, model)
        models = TurnModels(asked=model, llm=served.llm, stt=served.stt, tts=voice.voice if voice else None,
                            speaker=voice.speaker if voice else None)
        session = RealtimeSession(model, chat, send, limits, recorder=GatewayTurns(self.app, models, principal),
                                  llm=served.llm, stt=served.stt, hear=hear, hear_absent=served.absent,
                                  speak=voice, no_voice=no_voice, no_voice_code=no_voice_code)
        limit = inputs.realtime_max_message_kib << 10
        ends = time.monotonic() + inputs.realtime_max_session_s
        try:
            await session.start()
            while True:
                left = ends - time.monotonic()
                try:
                    message = await asyncio.wait_for(ws.receive_text(), min(inputs.realtime_idle_s, max(left, 0)))
                except falcon.errors.PayloadTypeError:
                    await send(error("events are sent as text (JSON) messages", code="invalid_event"))
                    continue
                except TimeoutError:
                    if left <= inputs.realtime_idle_s:
                        await session.stop()  # the running response ends (cancelled) before the session does
                        await send(error(f"the session lasted {inputs.realtime_max_session_s:g} s, its most: it ends "
                                         "(inputs.realtime_max_session_s)", code="session_expired"))
                    else:
                        await send(error(f"no event for {inputs.realtime_idle_s:g} s: the session ends "
                                         "(inputs.realtime_idle_s)", code="idle_timeout"))
                    await ws.close(GOING_AWAY)
                    return
                if len(message) > limit or len(message.encode()) > limit:  # characters, then bytes
                    await send(error(f"an event is {inputs.realtime_max_message_kib} KiB at most "
                                     "(inputs.realtime_max_message_kib)", code="message_too_large"))
                    await ws.close(TOO_BIG)
                    return
                await session.receive(message)
        except falcon.WebSocketDisconnected:
            pass
        finally:
            await session.close()  # a dropped connection cancels what runs: its engine requests with it


ROUTES = (
    # A WebSocket (a plain GET is 405): OpenAPI cannot say it; docs/21.REALTIME.md does.
    Route(PATH, Access.KEY, Realtime, {}, websocket=True),
)
