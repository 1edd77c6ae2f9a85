"""One codec for every projection's state: the state object to checkpoint bytes and back, its JSON view, its schema.

A projection's state is a tree of dataclasses (its module declares them); pydantic's `TypeAdapter` reads and writes
it, so a checkpoint is validated as it is loaded (a field the state does not have, or of the wrong type, is a
corrupt checkpoint and the projection rebuilds) and the schema it writes is one golden per projection and version
(tests/fixtures/projections/, tests/unit/projections/test_state_goldens.py): a change to a state's shape without a
new `version` fails that test, because the old checkpoints would no longer load.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter


class StateCodec:
    """Reads and writes the states of one `state_type`."""

    __slots__ = ("_adapter",)

    def __init__(self, state_type: type[Any]) -> None:
        self._adapter: TypeAdapter[Any] = TypeAdapter(state_type)

    def dump(self, state: Any) -> bytes:
        """The checkpoint's bytes."""
        return self._adapter.dump_json(state)

    def load(self, data: bytes | str) -> Any:
        """A state from checkpoint bytes; pydantic.ValidationError when they are not one."""
        return self._adapter.validate_json(data)

    def jsonable(self, state: Any) -> Any:
        """The state as plain JSON data (what `blazar state --json` shows by default)."""
        return self._adapter.dump_python(state, mode="json")

    def schema(self) -> dict[str, Any]:
        return self._adapter.json_schema()


_CODECS: dict[type[Any], StateCodec] = {}


def codec_for(state_type: type[Any]) -> StateCodec:
    """The one codec of `state_type` (a TypeAdapter is built once: it compiles a validator)."""
    codec = _CODECS.get(state_type)
    if codec is None:
        codec = _CODECS[state_type] = StateCodec(state_type)
    return codec
