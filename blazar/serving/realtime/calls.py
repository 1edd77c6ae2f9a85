"""A response's function calls: the chat's tool-call pieces (`ToolCallDelta`) streamed to the client as the
protocol's function-call items. A call's first piece opens its item (`response.output_item.added`, and
`conversation.item.added` unless the response is out of band) at the next output index, then its arguments come as
`response.function_call_arguments.delta`; the response's end closes each call in order
(`response.function_call_arguments.done`, `response.output_item.done`, `conversation.item.done`, the item kept in
the conversation) and hands `response.done` its items. The client runs the function and sends its result back as
a `function_call_output` item (blazar/serving/realtime/tools.py)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from blazar.serving.realtime.events import event, new_id
from blazar.serving.realtime.port import ToolCallDelta
from blazar.serving.realtime.tools import call_item

if TYPE_CHECKING:
    from blazar.serving.realtime.turn import Turn


@dataclass
class Call:
    item_id: str
    call_id: str
    name: str
    output_index: int
    arguments: list[str] = field(default_factory=list)

    def item(self, status: str) -> dict[str, Any]:
        return call_item(self.item_id, self.call_id, self.name, "".join(self.arguments), status)


class Calls:
    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self.by_index: dict[int, Call] = {}  # the chat's tool-call index → its call

    @property
    def made(self) -> int:
        return len(self.by_index)

    async def take(self, piece: ToolCallDelta) -> None:
        """One piece of a call: the first opens its item (the output index after those already open)."""
        call = self.by_index.get(piece.index)
        if call is None:
            call = await self._open(piece)
        elif piece.name and not call.name:  # a name after the call's first piece
            call.name = piece.name
        if piece.arguments:
            call.arguments.append(piece.arguments)
            await self.turn.session.send(event("response.function_call_arguments.delta", **self._at(call),
                                               delta=piece.arguments))

    async def _open(self, piece: ToolCallDelta) -> Call:
        turn = self.turn
        previous = self.previous_item_id()
        call = Call(new_id("item"), piece.call_id or f"call_{secrets.token_hex(12)}", piece.name or "",
                    self.made + (1 if turn.text_opened else 0))
        self.by_index[piece.index] = call
        opened = call.item("in_progress")
        await turn.session.send(event("response.output_item.added", response_id=turn.id,
                                      output_index=call.output_index, item=opened))
        if not turn.out_of_band:
            await turn.session.send(event("conversation.item.added", previous_item_id=previous, item=opened))
        return call

    def previous_item_id(self) -> str | None:
        """The item before the next one this response opens: its last call, its text, or the conversation's last."""
        if self.by_index:
            return list(self.by_index.values())[-1].item_id
        if self.turn.text_opened:
            return self.turn.item_id
        items = self.turn.session.items
        return items[-1]["id"] if items else None

    def _at(self, call: Call) -> dict[str, Any]:
        return {"response_id": self.turn.id, "item_id": call.item_id, "output_index": call.output_index,
                "call_id": call.call_id}

    async def end(self, status: str) -> list[dict[str, Any]]:
        """Close each call in order (`status`: completed, or incomplete when the response was cut short) and keep it
        in the conversation; its items for `response.done`."""
        session = self.turn.session
        done: list[dict[str, Any]] = []
        for call in self.by_index.values():
            item = call.item(status)
            await session.send(event("response.function_call_arguments.done", **self._at(call), name=call.name,
                                     arguments=item["arguments"]))
            await session.send(event("response.output_item.done", response_id=self.turn.id,
                                     output_index=call.output_index, item=item))
            if not self.turn.out_of_band:
                previous = session.items[-1]["id"] if session.items else None
                session.items.append(item)
                await session.send(event("conversation.item.done", previous_item_id=previous, item=item))
            done.append(item)
        return done
