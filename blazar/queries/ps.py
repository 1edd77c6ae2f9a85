"""`blazar ps` and the admin ps route: one row per instance, from the residency projection, with the live figures
(in flight, last use) that only the running supervisor knows laid over it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blazar.projections.base import State


def ps_rows(residency: State, *, now: float, live: Mapping[str, Mapping[str, Any]] | None = None) -> list[dict]:
    """Rows sorted by model then start time. `live[instance_id]` may carry in_flight and last_used (epoch s).

    Without live figures (no daemon), idleness counts from the ready time: the log knows no later use.
    """
    rows = []
    circuits = {m: (s.get("circuit") or {}).get("open_until") for m, s in residency.get("models", {}).items()}
    for inst in residency.get("instances", {}).values():
        lv = (live or {}).get(inst["instance_id"], {})
        in_flight = int(lv.get("in_flight", 0))
        last_used = lv.get("last_used") or inst.get("ready_ts") or inst.get("started_ts")
        idle_s = None if in_flight or inst["state"] != "ready" or last_used is None else max(0.0, now - last_used)
        keep = inst.get("keep_alive_s")
        expires_at = None
        if inst["state"] == "ready" and not in_flight and keep is not None and not inst.get("pinned") and last_used:
            expires_at = last_used + keep
        open_until = circuits.get(inst["model"])
        rows.append({
            "model": inst["model"],
            "instance_id": inst["instance_id"],
            "state": inst["state"],
            "pid": inst["pid"],
            "port": inst["port"],
            "ctx_tokens": inst["ctx_tokens"],
            "slots": inst["slots"],
            "planned_bytes": inst["planned_bytes"],
            "measured_bytes": inst.get("measured_bytes"),
            "idle_s": idle_s,
            "expires_at": expires_at,
            "keep_alive_s": keep,
            "pinned": bool(inst.get("pinned")),
            "engine_tag": inst["engine_tag"],
            "in_flight": in_flight,
            "started_ts": inst.get("started_ts"),
            "circuit_open_until": open_until if open_until and open_until > now else None,
        })
    rows.sort(key=lambda r: (r["model"], r["started_ts"] or 0))
    return rows


def open_circuits(residency: State, *, now: float) -> dict[str, float]:
    """Models whose circuit is open now, with when it closes by itself."""
    out = {}
    for model, s in residency.get("models", {}).items():
        until = (s.get("circuit") or {}).get("open_until")
        if until and until > now:
            out[model] = until
    return out
