"""Times on the command line: ISO 8601 (`2026-12-02T17:00:00Z`, `2026-12-02`), unix seconds (`1764694800`),
or an age (`90s`, `15m`, `2h`, `7d`: that long before now)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

_AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(text: str, *, now: float) -> float:
    t = text.strip()
    m = _AGE.match(t)
    if m:
        return now - float(m.group(1)) * _UNIT[m.group(2)]
    try:
        return float(t)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"not a time: {text!r} (use ISO 8601 like 2026-12-02T17:00:00Z, unix seconds, or an age like 15m)"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()
