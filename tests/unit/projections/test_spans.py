"""The span fold, fed request events: one span per request with children for queue wait, model load, prefill and
decode; times from the envelopes; GenAI and blazar.* attributes; the trace id rules; a traceparent's parent; no text.
"""

from __future__ import annotations

import hashlib

from blazar.events.requests import (
    MediaFacts,
    RequestAdmitted,
    RequestCompleted,
    RequestFailed,
    RequestFirstToken,
    RequestQueued,
    RequestReceived,
    RequestRejected,
    RequestRouted,
)
from blazar.projections.spans import Span, SpanFold, otel_trace_id, span_ids
from tests.support.events import TRACE, TRACE_TS, rec, streamed_cold_queued

T = TRACE
S = TRACE_TS  # the received event's ts


def ns(ts: float) -> int:
    return round(ts * 1e9)


def only(trees: list[tuple[Span, ...]]) -> dict[str, Span]:
    assert len(trees) == 1
    return {s.name.split(" ")[0]: s for s in trees[0]}


def test_a_streamed_cold_queued_request_is_one_span_with_load_queue_prefill_and_decode_children() -> None:
    spans = only(SpanFold().feed(streamed_cold_queued()))
    assert set(spans) == {"chat", "blazar.load", "blazar.queue", "blazar.prefill", "blazar.decode"}
    root = spans["chat"]
    assert root.name == "chat gemma" and root.kind == "server" and root.parent_span_id is None
    assert root.trace_id == T and root.span_id == span_ids(T)["request"]
    assert (root.start_ns, root.end_ns) == (ns(S), ns(S + 2.5))
    assert root.error is None
    for name in ("blazar.load", "blazar.queue", "blazar.prefill", "blazar.decode"):
        child = spans[name]
        assert child.trace_id == T and child.parent_span_id == root.span_id and child.kind == "internal"
        assert root.start_ns <= child.start_ns <= child.end_ns <= root.end_ns
    assert len({s.span_id for s in spans.values()}) == 5
    # The load ended when the request was routed and took load_ms; the queue wait ran from queued to admitted;
    # prefill from admission to the first token, decode from there to the end.
    assert (spans["blazar.load"].start_ns, spans["blazar.load"].end_ns) == (ns(S + 0.2), ns(S + 1.0))
    assert (spans["blazar.queue"].start_ns, spans["blazar.queue"].end_ns) == (ns(S + 1.1), ns(S + 1.5))
    assert (spans["blazar.prefill"].start_ns, spans["blazar.prefill"].end_ns) == (ns(S + 1.5), ns(S + 1.7))
    assert (spans["blazar.decode"].start_ns, spans["blazar.decode"].end_ns) == (ns(S + 1.7), ns(S + 2.5))


def test_the_request_span_carries_the_genai_and_decision_attributes() -> None:
    spans = only(SpanFold().feed(streamed_cold_queued(actor="key:ci")))
    a = spans["chat"].attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == "gemma" and a["gen_ai.response.model"] == "gemma3-270m"
    assert a["gen_ai.usage.input_tokens"] == 12 and a["gen_ai.usage.output_tokens"] == 20
    assert a["gen_ai.request.max_tokens"] == 32 and a["gen_ai.response.finish_reasons"] == ["length"]
    assert a["gen_ai.provider.name"] == "llama.cpp"
    assert a["blazar.instance_id"] == "i2" and a["blazar.cold"] is True and a["blazar.load_ms"] == 800
    assert a["blazar.queue.position"] == 1 and a["blazar.admission.decision"] == "queued"
    assert a["blazar.queue.waited_ms"] == 400.0 and a["blazar.ttft_ms"] == 1700.0
    assert a["blazar.dialect"] == "openai" and a["blazar.key_name"] == "ci" and a["blazar.status"] == 200
    assert a["blazar.outcome"] == "completed" and a["blazar.trace_id"] == T
    load = spans["blazar.load"]
    assert load.attributes["blazar.evicted.models"] == ["qwen"]
    assert load.attributes["blazar.evicted.instance_ids"] == ["i1"]
    assert load.attributes["blazar.evicted.reasons"] == ["memory"]
    assert [(e.name, e.attributes) for e in load.events] == [
        ("blazar.evicted", {"blazar.model": "qwen", "blazar.instance_id": "i1", "blazar.reason": "memory"})]
    assert spans["blazar.prefill"].attributes["gen_ai.usage.input_tokens"] == 12
    assert spans["blazar.decode"].attributes["gen_ai.usage.output_tokens"] == 20
    assert spans["blazar.decode"].attributes["blazar.engine.tokens_per_s"] == 28.5


def test_a_whole_answer_splits_prefill_and_decode_by_the_engines_prompt_ms() -> None:
    events = [
        rec(1, RequestReceived(trace_id=T, dialect="ollama", route="/api/generate", model="gemma"), ts=S),
        rec(2, RequestRouted(trace_id=T, model="gemma3-270m", instance_id="i1", port=1, cold=False), ts=S + 0.01),
        rec(3, RequestAdmitted(trace_id=T, model="gemma3-270m", slots=1, busy=1), ts=S + 0.02),
        rec(4, RequestFirstToken(trace_id=T, model="gemma3-270m", ttft_ms=990.0), ts=S + 0.99),
        rec(5, RequestCompleted(trace_id=T, model="gemma3-270m", duration_ms=1000.0,
                                engine_timings={"prompt_ms": 100.0}), ts=S + 1.0),
    ]
    spans = only(SpanFold().feed(events))
    assert set(spans) == {"text_completion", "blazar.prefill", "blazar.decode"}  # warm, not queued
    assert spans["text_completion"].attributes["blazar.admission.decision"] == "admitted"
    assert (spans["blazar.prefill"].start_ns, spans["blazar.prefill"].end_ns) == (ns(S + 0.02), ns(S + 0.12))
    assert (spans["blazar.decode"].start_ns, spans["blazar.decode"].end_ns) == (ns(S + 0.12), ns(S + 1.0))
    assert "blazar.ttft_ms" not in spans["text_completion"].attributes  # a whole answer has no first token


def test_a_refusal_is_an_error_span_with_its_reason_and_no_engine_children() -> None:
    events = [
        rec(1, RequestReceived(trace_id=T, dialect="openai", route="/v1/embeddings", model="gemma"), ts=S),
        rec(2, RequestRouted(trace_id=T, model="gemma3-270m", instance_id="i1", port=1, cold=False), ts=S + 0.01),
        rec(3, RequestQueued(trace_id=T, model="gemma3-270m", position=3, depth=3, slots=1, busy=1), ts=S + 0.02),
        rec(4, RequestRejected(trace_id=T, model="gemma3-270m", status=503, reason="queue_timeout",
                               detail="waited 2 s for a slot", retry_after_s=1.0), ts=S + 2.02),
    ]
    spans = only(SpanFold().feed(events))
    assert set(spans) == {"embeddings", "blazar.queue"}
    root = spans["embeddings"]
    assert root.error == "refused: queue_timeout (HTTP 503)"
    assert root.attributes["blazar.refusal.reason"] == "queue_timeout" and root.attributes["error.type"] == \
        "queue_timeout"
    assert root.attributes["blazar.admission.decision"] == "rejected"
    assert root.attributes["blazar.status"] == 503 and root.attributes["blazar.refusal.retry_after_s"] == 1.0
    assert spans["blazar.queue"].error == root.error and spans["blazar.queue"].end_ns == root.end_ns


def test_a_failure_after_the_first_token_marks_the_decode_span() -> None:
    failed = RequestFailed(trace_id=T, model="gemma3-270m", status=499, reason="client_disconnected", detail="gone")
    events = [*streamed_cold_queued()[:5], rec(6, failed, ts=S + 2.0)]
    spans = only(SpanFold().feed(events))
    assert spans["chat"].error == "failed: client_disconnected (HTTP 499)"
    assert spans["chat"].attributes["blazar.failure.reason"] == "client_disconnected"
    assert spans["blazar.decode"].error == spans["chat"].error and spans["blazar.prefill"].error is None


def test_a_traceparent_makes_the_request_a_child_of_the_clients_span_in_its_trace() -> None:
    parent_trace, parent_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    spans = only(SpanFold().feed(streamed_cold_queued(parent_trace_id=parent_trace, parent_span_id=parent_span)))
    assert all(s.trace_id == parent_trace for s in spans.values())
    assert spans["chat"].parent_span_id == parent_span
    assert spans["blazar.queue"].parent_span_id == spans["chat"].span_id
    assert spans["chat"].attributes["blazar.trace_id"] == T  # the log's id, to find it with `blazar why`


def test_a_trace_id_that_is_not_32_hex_gets_a_stable_derived_one() -> None:
    assert otel_trace_id("my-request-0001") == hashlib.sha256(b"my-request-0001").hexdigest()[:32]
    assert otel_trace_id(T.upper()) == T
    assert otel_trace_id("0" * 32) != "0" * 32  # the invalid all-zero id is never used
    spans = only(SpanFold().feed(streamed_cold_queued("my-request-0001")))
    assert {s.trace_id for s in spans.values()} == {otel_trace_id("my-request-0001")}
    assert spans["chat"].attributes["blazar.trace_id"] == "my-request-0001"


def test_spans_are_built_only_once_the_request_ended_and_are_the_same_on_replay() -> None:
    fold = SpanFold()
    events = streamed_cold_queued()
    assert fold.feed(events[:5]) == [] and fold.in_flight == 1
    first = fold.feed(events[5:])
    assert fold.in_flight == 0 and len(first[0]) == 5
    assert SpanFold().feed(events) == first  # deterministic: ids and times come from the events


# Every attribute that holds text, and what it is: names, ids, reasons, Blazar's own refusal words. Never content.
TEXT_ATTRIBUTES = {
    "gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.system", "gen_ai.request.model",
    "gen_ai.response.model", "gen_ai.response.finish_reasons", "http.request.method", "http.route", "error.type",
    "blazar.trace_id", "blazar.client_trace_id", "blazar.dialect", "blazar.outcome", "blazar.instance_id",
    "blazar.key_name", "blazar.admission.decision", "blazar.model", "blazar.reason", "blazar.evicted.models",
    "blazar.evicted.instance_ids", "blazar.evicted.reasons", "blazar.refusal.reason", "blazar.refusal.detail",
    "blazar.failure.reason",
}


def test_no_text_but_names_ids_and_reasons_reaches_a_span() -> None:
    failed = RequestFailed(trace_id=T, model="m", status=502, reason="engine_error", detail="the engine said: hi")
    requests = [streamed_cold_queued(actor="key:ci", client_trace_id="mine-0001"),
                [*streamed_cold_queued()[:4], rec(9, failed, ts=S + 2)],
                [streamed_cold_queued()[0], rec(2, RequestRejected(trace_id=T, status=404, reason="model_not_found",
                                                                   detail="no model gemma"), ts=S + 1)]]
    texts = set()
    for events in requests:
        for s in SpanFold().feed(events)[0]:
            for attrs in (s.attributes, *(e.attributes for e in s.events)):
                texts |= {k for k, v in attrs.items() if isinstance(v, str | list)}
            assert "hi" not in (s.error or "")  # an engine's failure text stays in the log, not the span
    assert texts <= TEXT_ATTRIBUTES, texts - TEXT_ATTRIBUTES


def test_requests_in_flight_are_bounded_and_strays_are_counted() -> None:
    fold = SpanFold(max_in_flight=2)
    for i, trace in enumerate(("a" * 32, "b" * 32, "c" * 32)):
        fold.feed([rec(i + 1, RequestReceived(trace_id=trace, dialect="openai", route="/v1/chat/completions",
                                              model="m"), ts=S + i)])
    assert fold.in_flight == 2 and fold.abandoned == 1
    assert fold.feed([rec(9, RequestCompleted(trace_id="a" * 32, model="m", duration_ms=1.0), ts=S + 9)]) == []
    assert fold.unmatched == 1
    (tree,) = fold.feed([rec(10, RequestCompleted(trace_id="c" * 32, model="m", duration_ms=1.0), ts=S + 10)])
    assert [s.name for s in tree] == ["chat m"]  # never admitted: no engine children


def test_a_requests_images_are_counted_on_its_span_never_their_bytes() -> None:
    media = MediaFacts(images=2, image_types=["image/png", "image/jpeg"], image_bytes=5000, image_pixels=2048,
                       audio_clips=1, audio_formats=["wav"], audio_bytes=900)
    root = only(SpanFold().feed(streamed_cold_queued(media=media)))["chat"]
    assert root.attributes["blazar.images.count"] == 2 and root.attributes["blazar.images.bytes"] == 5000
    assert root.attributes["blazar.images.types"] == "image/jpeg,image/png"
    assert root.attributes["blazar.audio.count"] == 1 and root.attributes["blazar.audio.bytes"] == 900
    plain = only(SpanFold().feed(streamed_cold_queued()))["chat"]
    assert not any(k.startswith(("blazar.images", "blazar.audio")) for k in plain.attributes)


def test_an_audio_request_span_names_its_operation_provider_and_audio() -> None:
    from blazar.events.audio import RequestAudio

    t = "a" * 32
    events = [
        RequestReceived(trace_id=t, dialect="openai", route="/v1/audio/transcriptions", model="whisper-base"),
        RequestAudio(trace_id=t, model="whisper-base", kind="whisper", route="transcriptions", audio_seconds=6.5,
                     response_format="srt", processing_ms=650.0, real_time_factor=0.1, language="en"),
        RequestCompleted(trace_id=t, model="whisper-base", duration_ms=700.0),
    ]
    spans = only(SpanFold().feed([rec(i, e) for i, e in enumerate(events, 1)]))
    a = spans["transcription"].attributes  # the request span is named by its operation
    assert a["gen_ai.operation.name"] == "transcription" and a["gen_ai.request.model"] == "whisper-base"
    assert a["gen_ai.provider.name"] == "faster-whisper" and a["blazar.engine_kind"] == "whisper"
    assert a["blazar.audio.seconds"] == 6.5 and a["blazar.audio.real_time_factor"] == 0.1
    assert a["blazar.audio.format"] == "srt" and a["blazar.audio.language"] == "en"
