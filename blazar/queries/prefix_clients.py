"""`blazar why --clients` and the console's list of clients that break the prefix cache: the `prefix` projection's
clients as rows, flagged first (their last FLAG_STREAK turns or more each changed the prompt early and were prefilled
again). Read-only."""

from __future__ import annotations

from typing import Any

from blazar.projections.prefix import FLAG_STREAK, ClientPrefix, PrefixState, clients
from blazar.queries.prefix_words import PART_WORDS

__all__ = ["FLAG_STREAK", "client_row", "client_rows", "where_broke"]


def where_broke(c: ClientPrefix) -> str | None:
    """Where its last break's prompt first differed, in words."""
    if c.break_part is None:
        return None
    if c.break_part == "tools" or c.break_message_index is None:
        return "the tool list"
    return f"message {c.break_message_index} ({PART_WORDS.get(c.break_part, c.break_part)})"


def client_row(c: ClientPrefix) -> dict[str, Any]:
    return {"actor": c.actor, "agent": c.agent, "flagged": c.flagged, "streak": c.streak, "turns": c.turns,
            "breaks": c.breaks, "reprocessed_tokens": c.reprocessed_tokens, "prefill_ms": c.prefill_ms,
            "last_ts": c.last_ts, "last_trace_id": c.last_trace_id, "break_trace_id": c.break_trace_id,
            "break_part": c.break_part, "break_message_index": c.break_message_index, "changed": where_broke(c)}


def client_rows(state: PrefixState, *, only_flagged: bool = False, limit: int | None = None) -> list[dict[str, Any]]:
    """The clients as rows: flagged first, then the longest streak, then the most recent."""
    rows = [client_row(c) for c in clients(state) if c.flagged or not only_flagged]
    return rows[:limit] if limit is not None else rows
