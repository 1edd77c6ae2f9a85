"""A chat prompt's fingerprint and where two differ (blazar/serving/prefix.py), and the watch that compares each
conversation's turns (blazar/serving/prefix_watch.py): the part named (system, tools, role, an earlier message), the
miss judged from the engine's cached tokens, tenants and conversations never compared with each other, the memory
bounded, and no text kept."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any, cast

import pytest

from blazar.events.base import Event
from blazar.events.requests import RequestPrefixCompared
from blazar.serving.admission import Ticket
from blazar.serving.call import Call, Completed
from blazar.serving.prefix import (
    MIN_REPROCESSED_TOKENS,
    Difference,
    agent_of,
    fingerprint,
    first_difference,
    missed,
)
from blazar.serving.prefix_watch import Finished, PrefixWatch
from blazar.serving.request import Request
from blazar.serving.route import Route
from tests.support.resolved import resolved

SYSTEM = {"role": "system", "content": "You are a coding agent. Today is 2026-12-07 06:40:01."}
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "write", "parameters": {"type": "object"}}}]


def chat(*messages: dict[str, Any], tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": list(messages)}
    if tools is not None:
        body["tools"] = tools
    return body


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def diff(before: dict[str, Any], after: dict[str, Any]) -> Difference | None:
    a, b = fingerprint(before), fingerprint(after)
    assert a is not None and b is not None
    return first_difference(a, b)


def test_an_appended_turn_differs_nowhere() -> None:
    first = chat(SYSTEM, user("fix the bug"), tools=TOOLS)
    second = chat(SYSTEM, user("fix the bug"), assistant("done"), user("now test it"), tools=TOOLS)
    assert diff(first, second) is None
    assert diff(first, first) is None


def test_a_changed_system_prompt_is_message_0_system() -> None:
    later = {**SYSTEM, "content": SYSTEM["content"].replace("06:40:01", "06:41:17")}
    assert diff(chat(SYSTEM, user("a")), chat(later, user("a"), assistant("b"), user("c"))) == Difference("system", 0)


def test_a_reordered_tool_list_is_the_tools_after_an_unchanged_system_prompt() -> None:
    assert diff(chat(SYSTEM, user("a"), tools=TOOLS), chat(SYSTEM, user("a"), tools=TOOLS[::-1])) == \
        Difference("tools", None)
    # ... and tools added where there were none
    assert diff(chat(SYSTEM, user("a")), chat(SYSTEM, user("a"), tools=TOOLS)) == Difference("tools", None)


def test_an_edited_earlier_turn_is_named_by_its_index() -> None:
    before = chat(SYSTEM, user("a"), assistant("b"), user("c"))
    after = chat(SYSTEM, user("a"), assistant("B, edited"), user("c"), assistant("d"), user("e"))
    assert diff(before, after) == Difference("message", 2)


def test_a_role_that_changed_and_messages_that_went_are_said_so() -> None:
    assert diff(chat(SYSTEM, user("a")), chat(user("a"), assistant("b"))) == Difference("role", 0)
    assert diff(chat(user("a"), assistant("b"), user("c")), chat(user("a"))) == Difference("message", 1)


def test_key_order_inside_a_message_does_not_count_as_a_change() -> None:
    assert diff(chat({"role": "user", "content": "a"}), chat({"content": "a", "role": "user"})) is None


def test_no_fingerprint_without_messages() -> None:
    assert fingerprint({"model": "m", "prompt": "hello"}) is None
    assert fingerprint({"model": "m", "messages": []}) is None


def test_a_miss_is_little_reused_and_enough_prefilled_again() -> None:
    assert missed(previous_prompt_tokens=2950, prompt_tokens=3010, reused_tokens=12)
    assert not missed(previous_prompt_tokens=2950, prompt_tokens=3010, reused_tokens=2950)
    # a small prompt prefilled again is not worth a word
    assert not missed(previous_prompt_tokens=40, prompt_tokens=50, reused_tokens=0)
    assert missed(previous_prompt_tokens=200, prompt_tokens=MIN_REPROCESSED_TOKENS, reused_tokens=0)


@pytest.mark.parametrize(("header", "agent"), [
    ("claude-cli/1.0.83 (external, cli)", "claude-cli"),
    ("OpenAI/Python 1.54.0", "OpenAI/Python"),
    ("codex_cli_rs/0.20.0 (Mac OS 14.5; arm64)", "codex_cli_rs"),
    ("ollama-python/0.4.7 (x86_64 linux) Python/3.12", "ollama-python"),
    ("", None), (None, None), ("   ", None), ("(weird)", None),
])
def test_a_clients_program_is_its_user_agents_first_product(header: str | None, agent: str | None) -> None:
    assert agent_of(header) == agent


def test_agent_is_bounded() -> None:
    assert len(agent_of("x" * 500) or "") == 64


def turn(trace: str, body: dict[str, Any], prompt_tokens: int, cached: int | None, *, tenant: str | None = "key:a",
         session: str | None = None, slot: int | None = 1, prompt_ms: float = 4100.0) -> Finished:
    usage: dict[str, Any] = {"prompt_tokens": prompt_tokens, "timings": {"prompt_ms": prompt_ms}}
    if cached is not None:
        usage["cached_tokens"] = cached
    return Finished(trace_id=trace, tenant=tenant, session=session, model="m", instance_id="i1", slot_id=slot,
                    agent="claude-cli", body=body, usage=usage)


def test_a_turn_that_changed_its_system_prompt_is_a_miss_named_and_costed() -> None:
    watch = PrefixWatch()
    assert watch.turn(turn("t1", chat(SYSTEM, user("a")), 2950, 0)) is None  # the first turn: nothing to compare
    later = {**SYSTEM, "content": "You are a coding agent. Today is 2026-12-07 06:41:17."}
    ev = watch.turn(turn("t2", chat(later, user("a"), assistant("b"), user("c")), 3010, 98))
    assert ev is not None
    assert (ev.previous_trace_id, ev.part, ev.message_index, ev.missed, ev.broke) == ("t1", "system", 0, True, True)
    assert (ev.previous_prompt_tokens, ev.prompt_tokens, ev.reused_tokens, ev.reprocessed_tokens) == \
        (2950, 3010, 98, 2912)
    assert (ev.prefill_ms, ev.previous_messages, ev.messages, ev.slot_id, ev.agent) == (4100.0, 2, 4, 1, "claude-cli")
    assert "coding agent" not in ev.model_dump_json()  # counts and indexes only


def test_an_append_only_turn_that_reused_its_prefix_is_no_miss() -> None:
    watch = PrefixWatch()
    watch.turn(turn("t1", chat(SYSTEM, user("a")), 2950, 0))
    ev = watch.turn(turn("t2", chat(SYSTEM, user("a"), assistant("b"), user("c")), 3010, 2950))
    assert ev is not None and not ev.missed and ev.part is None and not ev.broke


def test_an_unchanged_prefix_the_engine_lost_is_a_miss_but_no_break() -> None:
    watch = PrefixWatch()
    watch.turn(turn("t1", chat(SYSTEM, user("a")), 2950, 0))
    ev = watch.turn(turn("t2", chat(SYSTEM, user("a"), assistant("b"), user("c")), 3010, 0))
    assert ev is not None and ev.missed and ev.part is None and not ev.broke


def test_an_engine_that_does_not_say_what_it_reused_never_misses() -> None:
    watch = PrefixWatch()
    watch.turn(turn("t1", chat(SYSTEM, user("a")), 2950, None))
    ev = watch.turn(turn("t2", chat(user("other"), assistant("b"), user("c")), 3010, None))
    assert ev is not None and not ev.missed and ev.part == "role"


def test_tenants_sessions_and_slots_are_separate_conversations() -> None:
    watch = PrefixWatch()
    watch.turn(turn("a1", chat(SYSTEM, user("a")), 500, 0, tenant="key:a"))
    # another tenant on the same slot: compared with nothing of the first's
    assert watch.turn(turn("b1", chat(user("b")), 500, 0, tenant="key:b")) is None
    assert watch.turn(turn("a2", chat(SYSTEM, user("a")), 500, 0, tenant="key:a", slot=2)) is None  # another slot
    assert watch.turn(turn("s1", chat(user("s")), 500, 0, session="key:a/s")) is None  # a session, on slot 1 too
    ev = watch.turn(turn("s2", chat(user("s"), assistant("t")), 500, 480, session="key:a/s", slot=0))
    assert ev is not None and ev.previous_trace_id == "s1" and ev.session == "key:a/s"
    ev = watch.turn(turn("b2", chat(user("b"), assistant("c")), 500, 480, tenant="key:b"))
    assert ev is not None and ev.previous_trace_id == "b1"


def test_no_slot_and_no_session_is_no_conversation() -> None:
    watch = PrefixWatch()
    watch.turn(turn("t1", chat(user("a")), 500, 0, slot=None))
    assert watch.turn(turn("t2", chat(user("b")), 500, 0, slot=None)) is None
    assert len(watch) == 0


def history(n: int) -> dict[str, Any]:
    """A conversation's prompt after n turns: 2n - 1 messages."""
    messages = [user("q0")]
    for i in range(1, n):
        messages += [assistant(f"a{i}"), user(f"q{i}")]
    return chat(*messages)


def test_the_memory_is_bounded_the_least_recently_used_forgotten_first() -> None:
    watch = PrefixWatch(capacity=2)
    for slot in (1, 2):
        watch.turn(turn(f"t{slot}", history(1), 500, 0, slot=slot))
    assert watch.turn(turn("t1b", history(2), 500, 500, slot=1)) is not None  # slot 2 is now the oldest
    watch.turn(turn("t3", history(1), 500, 0, slot=3))
    assert len(watch) == 2
    assert watch.turn(turn("t2b", history(2), 500, 0, slot=2)) is None  # forgotten
    # slot 3 and slot 2 are remembered now, slot 1 forgotten; slot 2's last turn is t2b
    ev = watch.turn(turn("t2c", history(3), 500, 500, slot=2))
    assert ev is not None and ev.previous_trace_id == "t2b"


def test_a_prompt_with_no_more_messages_is_no_next_turn_and_other_programs_are_other_conversations() -> None:
    watch = PrefixWatch()
    watch.turn(turn("t1", history(2), 500, 0))
    assert watch.turn(turn("retry", history(2), 500, 0)) is None  # the same turn again
    assert watch.turn(turn("oneshot", chat(user("unrelated")), 500, 0)) is None  # another prompt on the slot
    other = replace(turn("curl", history(3), 500, 0), agent="curl")
    assert watch.turn(other) is None  # another program on the same slot: compared with nothing of claude-cli's
    watch.turn(turn("t2", history(2), 500, 0))
    ev = watch.turn(turn("t3", history(3), 500, 480))
    assert ev is not None and ev.previous_trace_id == "t2" and ev.agent == "claude-cli"


def test_a_body_that_is_no_chat_or_usage_without_prompt_tokens_is_not_compared() -> None:
    watch = PrefixWatch()
    watch.turn(turn("t1", chat(user("a")), 500, 0))
    assert watch.turn(turn("t2", {"model": "m", "prompt": "x"}, 500, 0)) is None
    assert watch.turn(replace(turn("t3", chat(user("a")), 500, 0), usage={})) is None
    ev = watch.turn(turn("t4", history(2), 500, 500))
    assert ev is not None and ev.previous_trace_id == "t1"  # neither of them was remembered


@dataclass
class Desk:
    """What a call records to: only its events matter here."""

    events: list[Event] = field(default_factory=list)

    def emit(self, event: Event, trace_id: str, actor: str | None = None) -> None:
        self.events.append(event)


def call_on_slot(desk: Desk, trace: str, body: dict[str, Any], *, remote: bool = False, **asked: Any) -> Call:
    """A call routed to an instance (`remote`: a remote engine's) and admitted to slot 1, with the chat `body`."""
    request = Request(model="m", engine_path="/v1/chat/completions", body=body, stream=False, trace_id=trace,
                      tenant="key:a", agent="claude-cli", **asked)
    call = Call(request, cast(Any, desk))
    instance = SimpleNamespace(instance_id="i1", remote=remote)
    call.take_route(Route("m", resolved("m")).to(cast(Any, instance)))
    call.admitted(Ticket(key="m", position_when_queued=0, waited_s=0.0, busy_after=1, slots=2, slot_id=1))
    return call


USAGE = {"prompt_tokens": 2950, "cached_tokens": 0, "timings": {"prompt_ms": 4100.0}}


def test_a_completed_next_turn_on_its_slot_is_recorded_and_a_remotes_or_a_follower_is_not() -> None:
    desk, watch = Desk(), PrefixWatch()
    watch.observe(call_on_slot(desk, "t1", history(1)), Completed(200, USAGE))
    watch.observe(call_on_slot(desk, "t2", history(2)), Completed(200, {**USAGE, "prompt_tokens": 3010}))
    [ev] = desk.events
    assert isinstance(ev, RequestPrefixCompared)
    assert (ev.trace_id, ev.previous_trace_id, ev.slot_id, ev.agent) == ("t2", "t1", 1, "claude-cli")
    watch.observe(call_on_slot(desk, "t3", history(3), remote=True), Completed(200, USAGE))
    watch.observe(call_on_slot(desk, "t4", history(4)), Completed(200, USAGE, shared="follower"))
    watch.observe(call_on_slot(desk, "t5", history(5), best_of=2), Completed(200, USAGE))
    watch.observe(call_on_slot(desk, "t6", history(6)), Completed(500, USAGE))
    assert len(desk.events) == 1


def test_a_comparison_that_fails_ends_nothing_and_records_nothing() -> None:
    desk, watch = Desk(), PrefixWatch()
    bad = {"model": "m", "messages": [{"role": "user", "content": "a", "x": {1, 2}}]}  # a set: no JSON
    watch.observe(call_on_slot(desk, "t1", bad), Completed(200, USAGE))
    assert desk.events == []
