"""`explain`: one trace's records (and the instance events it points at) told as a timeline with a verdict."""

from __future__ import annotations

import orjson
import pytest

from blazar.events import Event, Recorded
from blazar.events.instances import InstanceEvicted, InstanceExited, InstanceReady, InstanceStarted
from blazar.events.requests import (
    Evicted,
    MediaFacts,
    ReasoningFacts,
    RequestAdmitted,
    RequestCacheHit,
    RequestCompleted,
    RequestEnergy,
    RequestFailed,
    RequestFirstToken,
    RequestPrefixCompared,
    RequestQueued,
    RequestReceived,
    RequestRejected,
    RequestRerouted,
    RequestRouted,
    ShareWait,
)
from blazar.events.swaps import RequestServedAhead, RequestSwapHeld, RequestSwapReleased, RequestSwapWaited
from blazar.events.tuning import Posture
from blazar.queries.why import explain, fmt_ms
from tests.support.events import rec

T = "0123456789abcdef0123456789abcdef"
T0 = 1_700_000_000.0
MiB = 1 << 20


class Log:
    """Records with increasing seq at chosen offsets (seconds) from T0."""

    def __init__(self) -> None:
        self.records: list[Recorded] = []

    def at(self, offset_s: float, event: Event) -> Log:
        self.records.append(rec(len(self.records) + 1, event, ts=T0 + offset_s))
        return self


def received(trace: str = T) -> RequestReceived:
    return RequestReceived(trace_id=trace, dialect="openai", route="/v1/chat/completions", model="gemma",
                           stream=True, body_bytes=1200, max_tokens=64)


def started(iid: str, model: str) -> InstanceStarted:
    return InstanceStarted(instance_id=iid, model=model, engine_tag="b1", pid=77, port=40002, argv=["llama-server"],
                           log_path=f"instances/{iid}.log", ctx_tokens=4096, engine_ctx=16384, slots=4,
                           planned_bytes=600 * MiB, estimate_bytes=580 * MiB)


def texts(records: list[Recorded]) -> list[tuple[float, str, str]]:
    return [(s.offset_ms, s.type, s.text) for s in explain(records).steps]


def test_a_warm_completed_request() -> None:
    log = (Log()
           .at(-3600, started("i1", "gemma"))  # an hour before: not part of this story
           .at(-3599, InstanceReady(instance_id="i1", model="gemma", load_ms=900))
           .at(0.0, received())
           .at(0.001, RequestAdmitted(trace_id=T, model="gemma", instance_id="i1", slots=4, busy=1))
           .at(0.002, RequestRouted(trace_id=T, model="gemma", instance_id="i1", port=40002, cold=False))
           .at(0.18, RequestFirstToken(trace_id=T, model="gemma", ttft_ms=180.0))
           .at(1.206, RequestCompleted(trace_id=T, model="gemma", instance_id="i1", duration_ms=1206.0,
                                       prompt_tokens=12, completion_tokens=40, finish_reason="stop")))
    ex = explain(log.records)
    assert (ex.trace_id, ex.outcome, ex.status, ex.model, ex.dialect) == (T, "completed", 200, "gemma", "openai")
    assert ex.received_ts == T0
    assert [s.type for s in ex.steps] == ["request.received", "request.admitted", "request.routed",
                                          "request.first_token", "request.completed"]
    assert texts(log.records) == [
        (0.0, "request.received", "received /v1/chat/completions (openai) for gemma: streaming, 1200 B body, "
                                  "max_tokens 64"),
        (1.0, "request.admitted", "admitted at once (1 of 4 slots busy now)"),
        (2.0, "request.routed", "routed to warm instance i1 of gemma (port 40002)"),
        (180.0, "request.first_token", "first token at 180 ms"),
        (1206.0, "request.completed", "completed 200 in 1.2 s: 12 in / 40 out, 38 tok/s, finish: stop"),
    ]
    assert ex.verdict == "completed 200 in 1.2 s: no wait, warm instance; first token at 180 ms; 40 tokens out at " \
                         "38 tok/s"
    assert ex.figures == {"queue_wait_ms": 0.0, "load_ms": None, "ttft_ms": 180.0, "duration_ms": 1206.0,
                          "tokens_in": 12, "tokens_out": 40, "tokens_per_s": pytest.approx(39 / 1.026)}


def test_a_thinking_budget_says_its_size_effort_who_held_it_and_what_was_streamed() -> None:
    held = ReasoningFacts(budget=12, effort="low", enforced_by="engine", reasoning_tokens=11)
    log = Log().at(0.0, received()).at(0.5, RequestCompleted(
        trace_id=T, model="gemma", duration_ms=500.0, completion_tokens=20, finish_reason="stop", reasoning=held))
    assert explain(log.records).steps[-1].text.endswith(
        "finish: stop, thinking budget 12 tokens (effort low), held by the engine, 11 tokens of thinking streamed")
    loose = ReasoningFacts(budget=64, enforced_by="none")
    log = Log().at(0.0, received()).at(0.5, RequestCompleted(
        trace_id=T, model="gemma", duration_ms=500.0, completion_tokens=20, reasoning=loose))
    assert explain(log.records).steps[-1].text.endswith(
        "thinking budget 64 tokens, not enforced (this engine build has no per-request budget)")
    flag = ReasoningFacts(budget=64, enforced_by="load_flag", requested=16)
    log = Log().at(0.0, received()).at(0.5, RequestCompleted(
        trace_id=T, model="gemma", duration_ms=500.0, completion_tokens=20, reasoning=flag))
    assert explain(log.records).steps[-1].text.endswith(
        "thinking budget 64 tokens (the request asked 16 tokens): this engine build ignores the request's thinking "
        "budget; the model's load flag (64 tokens) held it")


def test_a_forced_tool_call_cut_by_max_tokens_says_so_in_its_step_and_verdict() -> None:
    log = (Log()
           .at(0.0, received())
           .at(0.5, RequestCompleted(trace_id=T, model="gemma", instance_id="i1", duration_ms=500.0, prompt_tokens=30,
                                     completion_tokens=3, finish_reason="length", forced_call="cut")))
    ex = explain(log.records)
    cut = "the forced tool call was cut at 3 tokens by max_tokens: no call, no text"
    assert ex.steps[-1].text.endswith(f"finish: length, {cut}")
    assert ex.outcome == "completed" and ex.verdict.endswith(f"3 tokens out at 6 tok/s; {cut}")
    made = Log().at(0.0, received()).at(0.5, RequestCompleted(
        trace_id=T, model="gemma", duration_ms=500.0, completion_tokens=20, finish_reason="stop", forced_call="made"))
    ex = explain(made.records)
    assert ex.steps[-1].text.endswith("finish: stop, the forced tool call made") and "cut" not in ex.verdict


def test_why_says_whether_the_request_could_draft_and_what_an_ignored_off_did() -> None:
    log = (Log()
           .at(0.0, received())
           .at(0.001, RequestAdmitted(trace_id=T, model="gemma", instance_id="i1", slots=2, busy=1,
                                      spec="off_client"))
           .at(1.0, RequestCompleted(trace_id=T, model="gemma", instance_id="i1", duration_ms=1000.0,
                                     prompt_tokens=12, completion_tokens=40,
                                     engine_timings={"draft_n": 30, "draft_n_accepted": 28})))
    steps = {s.type: s.text for s in explain(log.records).steps}
    assert steps["request.admitted"] == ("admitted at once (1 of 2 slots busy now; speculative decoding off (the "
                                         "client asked))")
    assert steps["request.completed"].endswith("30 tokens drafted, 28 accepted although speculation was off (this "
                                               "engine build ignores speculative.n_max per request)")


def test_a_queued_request_that_waited_for_a_cold_load_which_evicted_another_model() -> None:
    log = (Log()
           .at(0.0, received())
           .at(0.002, RequestQueued(trace_id=T, model="gemma", position=3, depth=3, slots=4, busy=4))
           .at(3.2, RequestAdmitted(trace_id=T, model="gemma", waited_ms=3200.0, slots=4, busy=4, queued_behind=2))
           .at(3.21, InstanceEvicted(instance_id="q1", model="qwen", reason="memory", for_model="gemma", idle_s=40.0,
                                     bytes_freed=512 * MiB))
           .at(3.3, started("g2", "gemma"))
           .at(5.3, InstanceReady(instance_id="g2", model="gemma", load_ms=2000))
           .at(5.31, RequestRouted(trace_id=T, model="gemma", instance_id="g2", port=40002, cold=True, load_ms=2100,
                                   evicted=[Evicted(model="qwen", instance_id="q1", reason="memory")]))
           .at(5.5, RequestFirstToken(trace_id=T, model="gemma", ttft_ms=5500.0))
           .at(6.5, RequestCompleted(trace_id=T, model="gemma", duration_ms=6500.0, prompt_tokens=12,
                                     completion_tokens=41)))
    ex = explain(reversed(log.records))  # any order; told in seq order
    steps = {s.type: s for s in ex.steps}
    assert steps["request.queued"].text == "queued at position 3 behind 2 (4 of 4 slots busy, 3 waiting)"
    assert steps["request.admitted"].text == "admitted after 3.2 s (4 of 4 slots busy now)"
    assert steps["request.admitted"].offset_ms == 3200.0
    assert steps["instance.evicted"].text == ("evicted qwen instance q1: reason memory, idle 40 s, for gemma, "
                                              "frees 512 MiB")
    assert steps["instance.started"].text == ("instance g2 of gemma spawned (pid 77, port 40002, 4 slots of 4096 "
                                              "ctx, planned 600 MiB)")
    assert steps["instance.ready"].text == "instance g2 of gemma ready after 2.0 s"
    assert steps["request.routed"].text == "cold load of gemma on instance g2: 2.1 s, evicted qwen (idle 40 s)"
    assert ex.verdict == ("completed 200 in 6.5 s: waited 3.2 s behind 2 requests; cold load 2.1 s, evicted qwen "
                          "(idle 40 s); first token at 5.5 s; 41 tokens out at 40 tok/s")
    assert ex.figures["queue_wait_ms"] == 3200.0 and ex.figures["load_ms"] == 2100


def test_a_request_that_waited_for_other_keys_share_says_so() -> None:
    log = (Log()
           .at(0.0, received())
           .at(0.002, RequestQueued(trace_id=T, model="gemma", position=4, depth=9, slots=1, busy=1))
           .at(2.0, RequestAdmitted(trace_id=T, model="gemma", waited_ms=2000.0, slots=1, busy=1, queued_behind=3,
                                    share_wait=ShareWait(ahead_other_tenants=2, tenant_weight=1)))
           .at(2.5, RequestCompleted(trace_id=T, model="gemma", duration_ms=2500.0, prompt_tokens=5,
                                     completion_tokens=4)))
    ex = explain(log.records)
    steps = {s.type: s for s in ex.steps}
    assert steps["request.admitted"].text == (
        "admitted after 2.0 s (1 of 1 slots busy now); it waited for other keys' fair share of the slots: 2 requests "
        "of other keys, queued after it, went first (its key's weight 1; `blazar keys limits --weight` sets it)")
    assert ex.verdict.startswith("completed 200 in 2.5 s: waited 2.0 s behind 3 requests (2 requests of other keys "
                                 "went first by fair share)")
    assert steps["request.admitted"].data["share_wait"] == {"ahead_other_tenants": 2, "tenant_weight": 1}


def test_a_whole_answer_is_ready_not_first_and_its_rate_is_the_engines() -> None:
    log = (Log().at(0.0, RequestReceived(trace_id=T, dialect="ollama", route="/api/chat", model="gemma"))
           .at(0.9, RequestFirstToken(trace_id=T, model="gemma", ttft_ms=900.0))
           .at(0.9, RequestCompleted(trace_id=T, model="gemma", duration_ms=901.0, prompt_tokens=5,
                                     completion_tokens=40, engine_timings={"predicted_per_second": 52.5})))
    ex = explain(log.records)
    assert ex.steps[1].text == "whole answer ready at 900 ms (not streamed)"
    assert ex.verdict == "completed 200 in 901 ms: no wait, warm instance; 40 tokens out at 52 tok/s"
    assert ex.figures["ttft_ms"] is None and ex.figures["tokens_per_s"] == 52.5


def test_a_victim_without_its_eviction_event_is_named_as_the_routed_event_names_it() -> None:
    log = (Log().at(0.0, received())
           .at(2.0, RequestRouted(trace_id=T, model="gemma", instance_id="g2", port=40002, cold=True, load_ms=2000,
                                  evicted=[Evicted(model="qwen", instance_id="q1", reason="max_loaded_models")])))
    assert explain(log.records).steps[-1].text == ("cold load of gemma on instance g2: 2.0 s, evicted "
                                                   "qwen (q1, max_loaded_models)")


def test_a_rejected_request() -> None:
    log = (Log().at(0.0, received())
           .at(0.0004, RequestRejected(trace_id=T, model="gemma", status=429, reason="queue_full",
                                       detail="64 waiting", retry_after_s=4.0,
                                       observations={"depth": 64, "max_queue": 64})))
    ex = explain(log.records)
    assert (ex.outcome, ex.status) == ("rejected", 429)
    assert ex.steps[-1].text == ("rejected 429: queue full: 64 waiting; retry after 4 s [depth=64, max_queue=64]")
    assert ex.steps[-1].offset_ms == pytest.approx(0.4, abs=1e-3)
    assert ex.verdict == "rejected 429: queue full (64 waiting), retry after 4 s"
    assert ex.figures["duration_ms"] == pytest.approx(0.4, abs=1e-3)


def test_an_upload_refused_by_its_keys_rpm_names_no_model() -> None:
    log = (Log().at(0.0, RequestReceived(trace_id=T, dialect="openai", route="/v1/files", model=""))
           .at(0.001, RequestRejected(trace_id=T, model="", status=429, reason="rate_limit_exceeded",
                                      detail="rpm 2 reached", retry_after_s=30.0)))
    first = explain(log.records).steps[0].text
    assert first == "received /v1/files (openai)"


def test_a_request_that_failed_when_its_engine_crashed_shows_the_exit() -> None:
    log = (Log().at(0.0, received())
           .at(0.001, RequestAdmitted(trace_id=T, model="gemma", instance_id="i1", slots=4, busy=1))
           .at(0.002, RequestRouted(trace_id=T, model="gemma", instance_id="i1", port=40002, cold=False))
           .at(1.3, RequestFailed(trace_id=T, model="gemma", instance_id="i1", status=502, reason="engine_crashed",
                                  detail="connection reset", duration_ms=1300.0))
           .at(1.4, InstanceExited(instance_id="i1", model="gemma", reason="crashed", exit_code=-11))
           .at(900.0, InstanceExited(instance_id="i9", model="gemma", reason="stopped")))  # long after: not shown
    ex = explain(log.records)
    assert ex.outcome == "failed" and ex.steps[-1].text == "instance i1 of gemma exited: crashed (exit code -11)"
    assert ex.verdict == "failed 502 after 1.3 s: the engine crashed: connection reset"


def test_a_request_with_no_outcome_says_so() -> None:
    ex = explain(Log().at(0.0, received()).records)
    assert ex.outcome == "in_progress" and ex.status is None
    assert ex.verdict.startswith("no outcome recorded: last request.received")


def test_the_json_form_carries_the_same_data() -> None:
    log = Log().at(0.0, received()).at(0.5, RequestCompleted(trace_id=T, model="gemma", duration_ms=500.0))
    data = orjson.loads(orjson.dumps(explain(log.records).to_json()))
    assert data["trace_id"] == T and data["outcome"] == "completed" and data["verdict"].startswith("completed 200")
    assert [s["type"] for s in data["steps"]] == ["request.received", "request.completed"]
    assert data["steps"][1]["data"]["duration_ms"] == 500.0 and data["steps"][1]["offset_ms"] == 500.0


def test_no_records_is_an_error() -> None:
    with pytest.raises(ValueError):
        explain([])


@pytest.mark.parametrize(("ms", "text"), [(180.0, "180 ms"), (3200.0, "3.2 s"), (40_000.0, "40 s"),
                                          (125_000.0, "2 min 5 s"), (120_000.0, "2 min"), (None, "?")])


def test_durations_read_naturally(ms: float | None, text: str) -> None:
    assert fmt_ms(ms) == text


def test_a_request_routed_again_after_its_instance_was_gone() -> None:
    log = (Log()
           .at(0.0, received())
           .at(0.001, RequestRouted(trace_id=T, model="gemma", instance_id="i1", port=40002, cold=False))
           .at(0.002, RequestAdmitted(trace_id=T, model="gemma", instance_id="i1", slots=4, busy=1))
           .at(0.010, InstanceExited(instance_id="i1", model="gemma", reason="crashed", exit_code=-9))
           .at(0.011, RequestRerouted(trace_id=T, model="gemma", instance_id="i1",
                                      detail="Cannot connect to host 127.0.0.1:40002"))
           .at(0.9, RequestRouted(trace_id=T, model="gemma", instance_id="i2", port=40003, cold=True, load_ms=880))
           .at(0.901, RequestAdmitted(trace_id=T, model="gemma", instance_id="i2", slots=4, busy=1))
           .at(1.2, RequestFirstToken(trace_id=T, model="gemma", ttft_ms=1200.0))
           .at(1.5, RequestCompleted(trace_id=T, model="gemma", instance_id="i2", duration_ms=1500.0,
                                     completion_tokens=8)))
    ex = explain(log.records)
    assert ex.outcome == "completed"
    step = next(s for s in ex.steps if s.type == "request.rerouted")
    assert step.text == ("instance i1 of gemma was gone before it took the request (Cannot connect to host "
                         "127.0.0.1:40002): its slot given back, routed again")
    assert ex.verdict.startswith("completed 200 in 1.5 s: routed again: instance i1 of gemma was gone; "
                                 "cold load 880 ms")


def test_a_requests_images_and_audio_are_told_by_their_facts() -> None:
    media = MediaFacts(images=2, image_types=["image/png", "image/jpeg"], image_bytes=5000, image_pixels=1_500_000,
                       images_fetched=1, image_tokens=512, audio_clips=1, audio_formats=["wav"], audio_bytes=900)
    ev = RequestReceived(trace_id=T, dialect="anthropic", route="/v1/messages", model="seer", media=media)
    assert texts(Log().at(0.0, ev).records)[0][2] == (
        "received /v1/messages (anthropic) for seer: 2 images (image/png, image/jpeg; 5000 B, 1.50 Mpx, "
        "512 prompt tokens, 1 fetched) and 1 audio clip (wav; 900 B)")


def test_an_audio_request_tells_its_audio_and_real_time_factor() -> None:
    from blazar.events.audio import RequestAudio
    from blazar.events.requests import RequestAdmitted, RequestCompleted, RequestReceived, RequestRouted

    t = "t-audio"
    events: list[Event] = [
        RequestReceived(trace_id=t, dialect="openai", route="/v1/audio/speech", model="joe", stream=True),
        RequestRouted(trace_id=t, model="joe", instance_id="p1", port=1, cold=False),
        RequestAdmitted(trace_id=t, model="joe", instance_id="p1", waited_ms=0.0, slots=1, busy=1),
        RequestAudio(trace_id=t, model="joe", kind="piper", route="speech", audio_seconds=4.0, response_format="mp3",
                     processing_ms=800.0, real_time_factor=0.2, input_chars=60, voice="alloy", streamed=True),
        RequestCompleted(trace_id=t, model="joe", duration_ms=820.0, status=200),
    ]
    ex = explain([rec(i, e) for i, e in enumerate(events, 1)])
    assert "piper spoke 4.00 s of audio from 60 characters as mp3, real-time factor 0.200" in ex.verdict
    assert ex.steps[3].text.startswith("joe: piper spoke 4.00 s") and "voice alloy" in ex.steps[3].text
    assert ex.figures["audio_seconds"] == 4.0 and ex.figures["real_time_factor"] == 0.2


def test_the_posture_of_the_instance_that_served_it_and_the_profile_that_chose_it() -> None:
    tuned = Posture(spec_type="ngram-simple", cache_type_k="q8_0", cache_type_v="q8_0", flash_attn=True, threads=1)
    log = (Log()
           .at(-3600, started("i1", "gemma").model_copy(update={"posture": tuned, "profile_seq": 42}))
           .at(0.0, received())
           .at(0.002, RequestRouted(trace_id=T, model="gemma", instance_id="i1", port=40002, cold=False))
           .at(1.0, RequestCompleted(trace_id=T, model="gemma", duration_ms=1000.0, completion_tokens=4)))
    ex = explain(log.records)
    assert ex.posture is not None and ex.posture.text() == (
        "instance i1 ran at spec=ngram-simple kv=q8_0/q8_0 fa=on t=1: chosen by profile.adopted seq 42")
    got = ex.to_json()["posture"]
    assert (got["posture"], got["profile_seq"], got["posture_fields"]["spec_type"]) == (tuned.label(), 42,
                                                                                      "ngram-simple")
    assert "instance.started" not in [s.type for s in ex.steps]  # an hour before: still not part of the story
    stale = (Log()
             .at(-10, started("i2", "gemma").model_copy(update={"profile_stale_seq": 7}))
             .at(0.0, received())
             .at(0.002, RequestRouted(trace_id=T, model="gemma", instance_id="i2", port=40002, cold=False)))
    ex = explain(stale.records)
    assert ex.posture is not None and ex.posture.text() == (
        "instance i2 ran at defaults: profile.adopted seq 7 was stale (measured on another engine build) and not "
        "applied")
    rejected = Log().at(0.0, received()).at(0.1, RequestRejected(trace_id=T, model="gemma", status=429,
                                                                 reason="queue_full", detail="full"))
    assert explain(rejected.records).posture is None  # never routed: no instance served it


def _prefix(**kw: object) -> RequestPrefixCompared:
    fields: dict[str, object] = {
        "trace_id": T, "model": "gemma", "instance_id": "i1", "slot_id": 1, "previous_trace_id": "p" * 32,
        "previous_prompt_tokens": 2950, "previous_messages": 2, "messages": 4, "prompt_tokens": 3010,
        "reused_tokens": 98, "missed": True, "part": "system", "message_index": 0, "reprocessed_tokens": 2912,
        "prefill_ms": 4100.0}
    return RequestPrefixCompared(**{**fields, **kw})  # type: ignore[arg-type]


def test_a_prefix_miss_names_the_message_the_part_and_the_prefill_cost() -> None:
    log = (Log().at(0, RequestReceived(trace_id=T, dialect="openai", route="/v1/chat/completions", model="gemma"))
           .at(4.2, _prefix())
           .at(4.3, RequestCompleted(trace_id=T, model="gemma", duration_ms=4300, prompt_tokens=3010,
                                     completion_tokens=5, cached_tokens=98)))
    e = explain(log.records)
    step = next(s for s in e.steps if s.type == "request.prefix_compared")
    assert step.text.startswith("prefix cache missed: the prompt first differed at message 0 (system) from this "
                                f"client's previous request on slot 1 ({'p' * 32}); 2,912 tokens prefilled again, "
                                "4.1 s")
    assert "the prompt first differed at message 0 (system) from the previous request on slot 1: 2,912 tokens " \
           "prefilled again, 4.1 s" in e.verdict


@pytest.mark.parametrize(("kw", "said"), [
    ({"part": "tools", "message_index": None}, "differed at the tool list (rendered before the messages)"),
    ({"part": "message", "message_index": 3}, "differed at message 3 (an earlier turn)"),
    ({"part": "role", "message_index": 0}, "differed at message 0 (a different role)"),
    ({"part": "message", "message_index": 4, "messages": 4, "previous_messages": 6},
     "message 4 (gone: 4 messages where the previous prompt had 6)"),
    ({"part": None, "message_index": None}, "extended this client's previous request on slot 1"),
    ({"session": "key:a/chat"}, "on session key:a/chat"),
])


def test_each_part_of_a_prefix_miss_is_said_in_words(kw: dict[str, object], said: str) -> None:
    e = explain(Log().at(0, _prefix(**kw)).records)
    assert said in e.steps[0].text


def test_a_reused_prefix_is_a_step_but_not_part_of_the_verdict() -> None:
    log = (Log().at(0, RequestReceived(trace_id=T, dialect="openai", route="/v1/chat/completions", model="gemma"))
           .at(0.2, _prefix(missed=False, part=None, message_index=None, reused_tokens=2950, reprocessed_tokens=60))
           .at(0.3, RequestCompleted(trace_id=T, model="gemma", duration_ms=300, prompt_tokens=3010)))
    e = explain(log.records)
    assert "prefix cache: reused 2,950 of 3,010 prompt tokens" in e.steps[1].text
    assert "prefill" not in e.verdict


def test_a_requests_energy_is_told_as_its_share_or_as_not_measured() -> None:
    def told(energy: RequestEnergy) -> tuple[str, str]:
        ex = explain(Log().at(0.0, received()).at(0.5, RequestCompleted(
            trace_id=T, model="gemma", duration_ms=500.0, completion_tokens=20, energy=energy)).records)
        return ex.steps[-1].text, ex.verdict

    step, verdict = told(RequestEnergy(source="rapl", joules=4.0, machine_joules=4.0, tokens_per_joule=5.0,
                                       overlapped=1))
    assert step.endswith("energy 4 J, 5 tokens/J by RAPL (the machine's, over its span)") and "energy 4 J" in verdict
    step, _ = told(RequestEnergy(source="rapl+nvml", joules=2.0, machine_joules=6.0, tokens_per_joule=10.0,
                                 overlapped=3))
    assert step.endswith("energy 2 J, 10 tokens/J by RAPL + NVML (its share of the machine's 6 J, 3 requests in "
                         "flight over its span)")
    step, verdict = told(RequestEnergy(source="not_measured"))
    assert step.endswith("energy not measured (this machine reports no readable RAPL or NVML counter)")
    assert "energy" not in verdict  # said once, in its step


def test_the_swap_orders_decisions_are_told_in_words() -> None:
    held = (Log()
            .at(0.0, received())
            .at(0.001, RequestSwapHeld(trace_id=T, model="b", evicting=["a"], position=0, hold_s=10.0, in_flight=1,
                                       queued=2))
            .at(4.0, RequestSwapReleased(trace_id=T, model="b", reason="expired", held_ms=10000.0, hold_s=10.0,
                                         served_ahead=3)))
    assert [t for _, _, t in texts(held.records)][1:] == [
        "b is not loaded and its room is a's, busy (1 running, 2 queued there): the swap's turn; a's requests may be "
        "served ahead of it for at most 10 s (swap_hold_s)",
        "the swap's hold ran out 10.0 s after its turn (swap_hold_s 10 s; 3 requests served ahead of it): nothing "
        "more is served ahead of it, it goes once what runs now is done"]
    ahead = (Log()
             .at(0.0, received())
             .at(0.001, RequestServedAhead(trace_id=T, model="a", swap_model="b", since_turn_ms=2500.0, hold_s=10.0))
             .at(0.002, RequestRerouted(trace_id=T, model="a", instance_id="i1", reason="swap_recalled",
                                        detail="a: the hold it was served ahead in ran out before a slot came"))
             .at(0.003, RequestSwapWaited(trace_id=T, model="a", swap_model="b")))
    assert [t for _, _, t in texts(ahead.records)][1:] == [
        "served ahead of the swap to b, 2.5 s into its hold of 10 s: a is loaded, so no swap for this request",
        "recalled from a's queue: a: the hold it was served ahead in ran out before a slot came; routed again, "
        "behind the swap",
        "a is loaded but a swap to b has had its turn: this request waits behind it, and a is loaded again in its "
        "own turn"]


def test_a_cache_hit_says_its_answer_came_from_the_cache_and_no_engine_was_asked() -> None:
    log = (Log().at(0.0, received())
           .at(0.001, RequestCacheHit(trace_id=T, model="gemma", source="exact", entry="ab" * 32, age_s=42.0))
           .at(0.002, RequestFirstToken(trace_id=T, model="gemma", ttft_ms=2.0))
           .at(0.003, RequestCompleted(trace_id=T, model="gemma", duration_ms=3.0, prompt_tokens=5,
                                       completion_tokens=8)))
    ex = explain(log.records)
    assert ex.steps[1].text == ("answered from the response cache (exact): entry abababababababab, stored 42 s "
                                "before; played back in the caller's dialect, no engine asked")
    assert ex.verdict.startswith("completed 200 in 3 ms: answered from the response cache (exact), no engine asked")
