"""The content store of stateful Responses: each stored Response (its input items, and the Response itself) in its
own SQLite file beside the log, `responses.db` under the data directory. The log keeps only ids, sizes and tokens
(blazar/events/responses.py); the text lives here, where it can really be deleted.

A row belongs to its tenant (keys are tenants): a lookup names the tenant, and another tenant's id is as unknown as
an id never stored. Rows older than the retention period are gone for every reader at once and swept from the file
on the next use. Deleting is real: `secure_delete` overwrites a deleted row's bytes, and the rollback journal (not a
WAL, whose old frames would keep them) is removed after each commit.

Writes are one small row and never wait for an fsync per row (synchronous NORMAL); they happen once per answer, not
per token. One connection, behind a lock: the daemon is one process.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

FILE = "responses.db"
_OWNER = ""  # the machine's owner (keys off) is the tenant None: stored as "" (a tenant name is never empty)
_SWEEP_EVERY_S = 60.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    created_at REAL NOT NULL,
    input BLOB NOT NULL,
    response BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_created ON responses (created_at);
"""


@dataclass(frozen=True, slots=True)
class Stored:
    id: str
    tenant: str | None
    created_at: float
    input: list[dict[str, Any]]  # every item the model was given (the history a previous response brought, too)
    response: dict[str, Any]

    @property
    def conversation(self) -> list[dict[str, Any]]:
        """What a response continuing this one starts from: its input, then its output."""
        return self.input + list(self.response.get("output") or [])


@dataclass(frozen=True, slots=True)
class Swept:
    """A row removed by the retention period: its id, tenant and size (for `response.deleted`)."""

    id: str
    tenant: str | None
    content_bytes: int


class ResponseStore:
    def __init__(self, path: Path, retention_s: Callable[[], float], now: Callable[[], float] = time.time) -> None:
        self.path = path
        self._retention_s = retention_s
        self._now = now
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._swept_at = 0.0

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
            conn.execute("PRAGMA journal_mode=DELETE")
            conn.execute("PRAGMA secure_delete=ON")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
            self._conn = conn
        return self._conn

    def _cutoff(self) -> float:
        return self._now() - self._retention_s()

    def put(self, tenant: str | None, response: dict[str, Any], input_items: list[dict[str, Any]]) -> int:
        """Keep a Response (its `id` and `created_at`) and its input; the bytes kept."""
        data_in, data_out = orjson.dumps(input_items), orjson.dumps(response)
        with self._lock:
            self._db().execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?)",
                               (response["id"], tenant or _OWNER, float(response["created_at"]), data_in, data_out))
        return len(data_in) + len(data_out)

    def get(self, tenant: str | None, response_id: str) -> Stored | None:
        """The tenant's response by id; None when there is none (never stored, another tenant's, deleted, expired)."""
        with self._lock:
            row = self._db().execute(
                "SELECT created_at, input, response FROM responses WHERE id = ? AND tenant = ? AND created_at >= ?",
                (response_id, tenant or _OWNER, self._cutoff())).fetchone()
        if row is None:
            return None
        return Stored(response_id, tenant, row[0], orjson.loads(row[1]), orjson.loads(row[2]))

    def delete(self, tenant: str | None, response_id: str) -> int | None:
        """Delete the tenant's response: the bytes it held, or None when it has none by that id."""
        with self._lock:
            row = self._db().execute(
                "DELETE FROM responses WHERE id = ? AND tenant = ? AND created_at >= ? "
                "RETURNING length(input) + length(response)",
                (response_id, tenant or _OWNER, self._cutoff())).fetchone()
        return None if row is None else int(row[0])

    def sweep(self, *, force: bool = False) -> list[Swept]:
        """Delete what outlived the retention period (at most once a minute unless `force`): what was removed."""
        now = self._now()
        if not force and now - self._swept_at < _SWEEP_EVERY_S:
            return []
        self._swept_at = now
        with self._lock:
            rows = self._db().execute(
                "DELETE FROM responses WHERE created_at < ? RETURNING id, tenant, length(input) + length(response)",
                (self._cutoff(),)).fetchall()
        return [Swept(r[0], r[1] or None, int(r[2])) for r in rows]

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
