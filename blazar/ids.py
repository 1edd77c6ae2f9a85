"""Identifiers: trace ids are 32 lowercase hex characters (W3C trace-context compatible)."""

from __future__ import annotations

import secrets


def new_trace_id() -> str:
    return secrets.token_hex(16)
