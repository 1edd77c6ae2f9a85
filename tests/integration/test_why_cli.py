"""`blazar why` end to end: request and instance events written into a real log, explained by the real command."""

from __future__ import annotations

from pathlib import Path

from blazar.bootstrap import bootstrap
from blazar.clock import FakeClock
from blazar.events import Event
from blazar.events.instances import InstanceEvicted, InstanceReady, InstanceStarted
from blazar.events.requests import (
    Evicted,
    RequestAdmitted,
    RequestCompleted,
    RequestFirstToken,
    RequestPrefixCompared,
    RequestQueued,
    RequestReceived,
    RequestRejected,
    RequestRouted,
)
from blazar.paths import Paths
from tests.conftest import Cli

MiB = 1 << 20
COLD = "aaaaaaaa11111111aaaaaaaa11111111"
TWIN = "aaaaaaaa22222222aaaaaaaa22222222"  # shares COLD's first 8 characters
REJECTED = "bbbbbbbb33333333bbbbbbbb33333333"


def _received(trace: str) -> RequestReceived:
    return RequestReceived(trace_id=trace, dialect="openai", route="/v1/chat/completions", model="gemma", stream=True)


async def _write(paths: Paths, steps: list[tuple[float, Event, str | None]]) -> None:
    """Append each event `dt` seconds after the one before, with its trace id in the envelope."""
    clock = FakeClock()
    app = await bootstrap(paths=paths, clock=clock, actor="test:pytest")
    try:
        for dt, event, trace in steps:
            clock.advance(dt)
            await app.log.append(event, actor="daemon:test", trace_id=trace)
    finally:
        await app.close()


async def _history(paths: Paths) -> None:
    await _write(paths, [
        (0.0, InstanceStarted(instance_id="q1", model="qwen", engine_tag="b1", pid=11, port=40001, argv=["x"],
                              log_path="instances/q1.log", ctx_tokens=4096, engine_ctx=4096, slots=1,
                              planned_bytes=500 * MiB, estimate_bytes=500 * MiB), None),
        (1.0, InstanceReady(instance_id="q1", model="qwen", load_ms=1000), None),
        (60.0, _received(COLD), COLD),
        (0.002, RequestQueued(trace_id=COLD, model="gemma", position=2, depth=2, slots=1, busy=1), COLD),
        (1.5, RequestAdmitted(trace_id=COLD, model="gemma", waited_ms=1500.0, slots=1, busy=1, queued_behind=1),
         COLD),
        (0.01, InstanceEvicted(instance_id="q1", model="qwen", reason="memory", for_model="gemma", idle_s=40.0,
                               bytes_freed=500 * MiB), None),
        (0.1, InstanceStarted(instance_id="g1", model="gemma", engine_tag="b1", pid=12, port=40002, argv=["x"],
                              log_path="instances/g1.log", ctx_tokens=4096, engine_ctx=4096, slots=1,
                              planned_bytes=300 * MiB, estimate_bytes=300 * MiB), None),
        (2.0, InstanceReady(instance_id="g1", model="gemma", load_ms=2000), None),
        (0.01, RequestRouted(trace_id=COLD, model="gemma", instance_id="g1", port=40002, cold=True, load_ms=2100,
                             evicted=[Evicted(model="qwen", instance_id="q1", reason="memory")]), COLD),
        (0.2, RequestFirstToken(trace_id=COLD, model="gemma", ttft_ms=3820.0), COLD),
        (1.0, RequestCompleted(trace_id=COLD, model="gemma", instance_id="g1", duration_ms=4820.0, prompt_tokens=12,
                               completion_tokens=41), COLD),
        (1.0, _received(TWIN), TWIN),
        (0.001, RequestCompleted(trace_id=TWIN, model="gemma", duration_ms=1.0), TWIN),
        (5.0, _received(REJECTED), REJECTED),
        (0.001, RequestRejected(trace_id=REJECTED, model="gemma", status=429, reason="queue_full",
                                detail="64 waiting", retry_after_s=4.0), REJECTED),
    ])


async def test_why_tells_a_cold_queued_request_with_its_load_and_eviction(home: Path, paths: Paths, cli: Cli) -> None:
    await _history(paths)
    text = cli("why", COLD).stdout
    assert f"trace {COLD}" in text
    assert "queued at position 2 behind 1" in text and "admitted after 1.5 s" in text
    assert "evicted qwen instance q1: reason memory, idle 40 s, for gemma" in text
    assert "instance g1 of gemma ready after 2.0 s" in text
    assert "cold load of gemma on instance g1: 2.1 s, evicted qwen (idle 40 s)" in text
    assert ("verdict: completed 200 in 4.8 s: waited 1.5 s behind 1 request; cold load 2.1 s, evicted qwen "
            "(idle 40 s); first token at 3.8 s; 41 tokens out at 40 tok/s") in text
    # qwen's start and ready, a minute before the request, are not part of its story.
    assert "instance q1 of qwen spawned" not in text

    data = cli("why", COLD, "--json").json()
    assert data["trace_id"] == COLD and data["outcome"] == "completed" and data["status"] == 200
    assert [s["type"] for s in data["steps"]] == [
        "request.received", "request.queued", "request.admitted", "instance.evicted", "instance.started",
        "instance.ready", "request.routed", "request.first_token", "request.completed"]
    assert data["steps"][2]["offset_ms"] == 1502.0
    assert data["figures"]["queue_wait_ms"] == 1500.0 and data["figures"]["load_ms"] == 2100

    assert cli("why", COLD[:12], "--json").json()["trace_id"] == COLD  # a unique prefix


async def test_why_without_a_trace_explains_the_last_failed_or_rejected_request(paths: Paths, cli: Cli) -> None:
    await _history(paths)
    text = cli("why").stdout
    assert f"trace {REJECTED}" in text
    assert "verdict: rejected 429: queue full (64 waiting), retry after 4 s" in text
    assert cli("why", "--json").json()["trace_id"] == REJECTED


async def test_why_refuses_an_unknown_or_ambiguous_trace_with_exit_code_2(paths: Paths, cli: Cli) -> None:
    await _history(paths)
    unknown = cli("why", "f" * 32, check=False)
    assert unknown.code == 2 and f"no trace '{'f' * 32}' in the log" in unknown.stderr
    short = cli("why", "aaaa", check=False)
    assert short.code == 2 and "at least 8 characters" in short.stderr
    ambiguous = cli("why", "aaaaaaaa", check=False)
    assert ambiguous.code == 2 and "more than one trace id" in ambiguous.stderr


def test_why_with_no_failure_in_the_log_says_so(cli: Cli) -> None:
    res = cli("why")
    assert res.code == 0 and "no request has failed or been rejected" in res.stdout
    assert cli("why", "--json").json() is None


def _compared(trace: str, *, broke: bool) -> RequestPrefixCompared:
    return RequestPrefixCompared(
        trace_id=trace, model="gemma", instance_id="g1", slot_id=0, agent="claude-cli", previous_trace_id="p" * 32,
        previous_prompt_tokens=2950, previous_messages=2, messages=4, prompt_tokens=3010,
        reused_tokens=98 if broke else 2950, missed=broke, part="system" if broke else None,
        message_index=0 if broke else None, reprocessed_tokens=2912 if broke else 60,
        prefill_ms=4100.0 if broke else 80.0)


async def test_why_clients_flags_a_client_that_breaks_its_prefix_every_turn_and_not_an_append_only_one(
        paths: Paths, cli: Cli) -> None:
    app = await bootstrap(paths=paths, clock=FakeClock(), actor="test:pytest")
    try:
        await app.log.append([_compared(f"{i:032x}", broke=True) for i in range(3)], actor="key:alice")
        await app.log.append([_compared(f"{i + 16:032x}", broke=False) for i in range(3)], actor="key:bob")
    finally:
        await app.close()
    rows = cli("why", "--clients", "--json").json()
    assert [(r["actor"], r["agent"], r["flagged"], r["streak"], r["breaks"], r["changed"]) for r in rows] == [
        ("key:alice", "claude-cli", True, 3, 3, "message 0 (system)"),
        ("key:bob", "claude-cli", False, 0, 0, None)]
    text = cli("why", "--clients").stdout
    assert "key:alice (claude-cli)" in text and "8,736 tokens, 12.3 s" in text
    assert cli("why", "--clients", "f" * 32, check=False).code == 2
