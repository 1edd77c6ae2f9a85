"""The `prefix` projection: per client (key and program), how many turns broke the prefix in a row; three in a row
flag it, a turn that kept its prefix clears it, keys never merge, hops are not counted, and the clients are
bounded."""

from __future__ import annotations

from typing import Any

from blazar.events.requests import RequestPrefixCompared
from blazar.projections import fold
from blazar.projections.prefix import FLAG_STREAK, MAX_CLIENTS, PrefixProjection, clients, flagged
from tests.support.events import rec


def compared(trace: str, *, broke: bool, agent: str | None = "claude-cli", **kw: Any) -> RequestPrefixCompared:
    fields: dict[str, Any] = {
        "trace_id": trace, "model": "m", "instance_id": "i1", "slot_id": 0, "agent": agent,
        "previous_trace_id": "p", "previous_prompt_tokens": 2950, "previous_messages": 2, "messages": 4,
        "prompt_tokens": 3010, "reused_tokens": 98 if broke else 2950, "missed": broke,
        "part": "system" if broke else None, "message_index": 0 if broke else None,
        "reprocessed_tokens": 2912 if broke else 60, "prefill_ms": 4100.0 if broke else 80.0}
    return RequestPrefixCompared(**{**fields, **kw})


def state(*events: tuple[RequestPrefixCompared, str]) -> Any:
    return fold(PrefixProjection(), [rec(i, ev, actor=actor) for i, (ev, actor) in enumerate(events, start=1)])


def test_a_client_that_breaks_its_prefix_every_turn_is_flagged_after_three() -> None:
    two = state(*((compared(f"t{i}", broke=True), "key:alice") for i in range(FLAG_STREAK - 1)))
    assert flagged(two) == []
    three = state(*((compared(f"t{i}", broke=True), "key:alice") for i in range(FLAG_STREAK)))
    [client] = flagged(three)
    assert (client.actor, client.agent, client.streak, client.breaks, client.turns) == \
        ("key:alice", "claude-cli", 3, 3, 3)
    assert (client.break_trace_id, client.break_part, client.break_message_index) == ("t2", "system", 0)
    assert (client.reprocessed_tokens, client.prefill_ms) == (3 * 2912, 3 * 4100.0)


def test_an_append_only_conversation_is_not_flagged_and_a_kept_turn_clears_a_streak() -> None:
    s = state(*((compared(f"t{i}", broke=False), "key:alice") for i in range(5)))
    [client] = clients(s)
    assert (client.turns, client.breaks, client.streak, client.flagged) == (5, 0, 0, False)
    s = state(*((compared(f"t{i}", broke=True), "key:alice") for i in range(3)), (compared("t4", broke=False),
                                                                                 "key:alice"))
    assert flagged(s) == [] and clients(s)[0].breaks == 3


def test_a_miss_the_client_did_not_cause_is_no_break() -> None:
    lost = compared("t", broke=True, part=None, message_index=None)  # missed, but the prompt extended the last one
    s = state(*((lost, "key:alice") for _ in range(4)))
    assert flagged(s) == [] and clients(s)[0].breaks == 0


def test_keys_and_programs_are_separate_clients_and_hops_are_not_counted() -> None:
    s = state(*((compared(f"a{i}", broke=True), "key:alice") for i in range(3)),
              *((compared(f"b{i}", broke=False), "key:bob") for i in range(3)),
              (compared("c", broke=True, agent="codex"), "key:alice"),
              (compared("h", broke=True), "node:other"))
    assert [(c.actor, c.agent, c.flagged) for c in clients(s)] == [
        ("key:alice", "claude-cli", True), ("key:alice", "codex", False), ("key:bob", "claude-cli", False)]


def test_clients_are_bounded_the_one_seen_longest_ago_forgotten() -> None:
    s = state(*((compared(f"t{i}", broke=False, agent=f"agent{i}"), "key:alice") for i in range(MAX_CLIENTS + 1)))
    assert len(s.clients) == MAX_CLIENTS
    assert "key:alice agent0" not in s.clients and f"key:alice agent{MAX_CLIENTS}" in s.clients
