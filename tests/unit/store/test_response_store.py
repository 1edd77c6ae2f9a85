"""The content store of stateful Responses (blazar/store/responses.py): per tenant, expired by the retention period,
and deleted for real (the text is gone from the file)."""

from __future__ import annotations

from pathlib import Path

from blazar.store.responses import ResponseStore

MARKER = "the-secret-words-of-alice"


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def _store(tmp_path: Path, clock: Clock, retention_s: float = 3600.0) -> ResponseStore:
    return ResponseStore(tmp_path / "responses.db", lambda: retention_s, clock)


def _response(rid: str, clock: Clock) -> dict:
    return {"id": rid, "created_at": int(clock.t), "output": [{"type": "message", "content": [
        {"type": "output_text", "text": MARKER}]}]}


def test_a_response_is_its_tenants_only(tmp_path: Path) -> None:
    clock = Clock()
    store = _store(tmp_path, clock)
    size = store.put("key:alice", _response("resp_1", clock), [{"id": "msg_1", "type": "message"}])
    assert size > len(MARKER)
    got = store.get("key:alice", "resp_1")
    assert got is not None and got.input == [{"id": "msg_1", "type": "message"}]
    assert got.conversation[-1]["content"][0]["text"] == MARKER
    assert store.get("key:mallory", "resp_1") is None and store.get(None, "resp_1") is None
    assert store.delete("key:mallory", "resp_1") is None
    assert store.delete("key:alice", "resp_1") == size and store.get("key:alice", "resp_1") is None
    assert store.delete("key:alice", "resp_1") is None


def test_deleting_removes_the_text_from_the_file(tmp_path: Path) -> None:
    clock = Clock()
    store = _store(tmp_path, clock)
    store.put(None, _response("resp_1", clock), [])
    assert MARKER.encode() in b"".join(p.read_bytes() for p in tmp_path.iterdir())  # the file or its WAL
    store.delete(None, "resp_1")
    store.close()
    assert MARKER.encode() not in b"".join(p.read_bytes() for p in tmp_path.iterdir())


def test_the_retention_period_hides_then_sweeps_old_responses(tmp_path: Path) -> None:
    clock = Clock()
    store = _store(tmp_path, clock, retention_s=3600)
    store.put("key:a", _response("resp_old", clock), [])
    clock.t += 1800
    store.put("key:a", _response("resp_new", clock), [])
    clock.t += 2000  # resp_old is 3800 s old, resp_new 2000 s
    assert store.get("key:a", "resp_old") is None and store.get("key:a", "resp_new") is not None
    swept = store.sweep()
    assert [(s.id, s.tenant) for s in swept] == [("resp_old", "key:a")] and swept[0].content_bytes > 0
    assert store.sweep() == []  # at most once a minute
    clock.t += 3600
    assert [s.id for s in store.sweep()] == ["resp_new"]
    store.close()
    assert MARKER.encode() not in (tmp_path / "responses.db").read_bytes()
