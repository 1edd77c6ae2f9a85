"""A projection's state as a checkpoint holds it, for the tests that compare folds and resume from checkpoints."""

from __future__ import annotations

from typing import Any

import orjson

from blazar.projections.base import Projection
from blazar.projections.codec import codec_for


def state_bytes(projection: Projection[Any], state: Any) -> bytes:
    """The bytes a checkpoint of `state` holds: equal states give equal bytes."""
    return codec_for(projection.state_type).dump(state)


def through_checkpoint(projection: Projection[Any], state: Any) -> Any:
    """`state` written as a checkpoint and read back, as a restart would."""
    codec = codec_for(projection.state_type)
    return codec.load(codec.dump(state))


def json_bytes(data: Any) -> bytes:
    """Plain JSON data (views, `blazar state --json`) as bytes, keys sorted: equal data gives equal bytes."""
    return orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
