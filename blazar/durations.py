"""Durations as users write them: Go-style ("5m", "1h30m", "45s", "500ms"), plain seconds ("300", 2.5), and
Ollama's conventions for keep-alive: a negative value means forever, 0 means unload at once."""

from __future__ import annotations

import math
import re

_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h|d)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# The longest duration anything takes: ten years. Past it a value is a mistake (or an overflow waiting to happen in
# a timestamp sum); "forever" is said with a negative value.
MAX_DURATION_S = 10 * 365 * 86400.0


def parse_duration(value: str | float | int) -> float:
    """Seconds, possibly negative (any negative value means forever); at most MAX_DURATION_S. ValueError names the
    accepted forms."""
    seconds = _parse(value)
    if seconds > MAX_DURATION_S:
        raise ValueError(f"duration too long: {str(value)[:40]!r} (at most ten years; negative: forever)")
    return seconds


def _parse(value: str | float | int) -> float:
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        if isinstance(value, int) and abs(value) > 1 << 62:
            return math.copysign(math.inf, value)  # past any maximum; float() of a huge int would overflow
        if not math.isfinite(value):
            raise ValueError(f"not a duration: {value!r}")
        return float(value)
    if len(value) > 64:
        raise ValueError(f"not a duration: {value[:40]!r}… (use seconds like 300, or 45s, 5m, 1h30m, 30d; negative: "
                         "forever)")
    text = value.strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    try:
        seconds = float(body)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):  # "nan", "inf": float() takes them, no duration is one
            raise ValueError(f"not a duration: {value!r}")
        return sign * seconds
    pos, total = 0, 0.0
    for m in _PART.finditer(body):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT[m.group(2)]
        pos = m.end()
    if not body or pos != len(body):
        raise ValueError(f"not a duration: {value!r} (use seconds like 300, or 45s, 5m, 1h30m, 30d; negative: forever)")
    return sign * total


def keep_alive_seconds(value: str | float | int) -> float | None:
    """A keep-alive: seconds to stay loaded after the last use; None (forever) for a negative value."""
    seconds = parse_duration(value)
    return None if seconds < 0 else seconds


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "forever"
    s = round(seconds)
    if s < 60:
        return f"{seconds:.0f}s" if seconds >= 1 or seconds == 0 else f"{seconds * 1000:.0f}ms"
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return "".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (sec, "s")) if v)
