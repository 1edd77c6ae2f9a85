"""Where a new instance goes, as tables: each row a situation (the model, the memory limit, the instances running,
the idle RPC workers) and the decision decide_load makes for it (start it here, on workers or at a fallback
shape; evict these first; probe the workers; refuse, with the levers). Then which running instances of the same
model give way to a new shape (decide_give_way). The real planner prices every row (Gemma 3 270M's header)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from blazar.errors import DoesNotFit, ModelPinned
from blazar.events.tuning import Posture
from blazar.instances.decide import Candidate
from blazar.instances.live import plan_workers
from blazar.instances.load_decision import (
    Busy,
    Evict,
    GiveWay,
    LoadDecision,
    ProbeWorkers,
    Refuse,
    Running,
    Shape,
    Situation,
    Start,
    carried_shape,
    decide_give_way,
    decide_load,
)
from blazar.projections.calibration import CalibrationState, Measurement, shape_key
from tests.support.fit_models import GiB, MiB, gemma3_270m, host

W1, W2 = "127.0.0.1:50061", "127.0.0.1:50062"
# Gemma 3 270M on this host: about 353 MiB at 4096 tokens and 1 slot, 465 MiB at its full 32768; under a 330 MiB
# limit it fits only at 256 tokens; under 300 MiB not at all, though two 300 MiB workers take what the host cannot.
BOTH_WORKERS = ((W1, 300 * MiB), (W2, 300 * MiB))


def run(iid: str, mib: int, *, idle_s: float = 0.0, state: str = "ready", in_flight: int = 0, pinned: bool = False,
        keep_alive_s: float | None = 300.0, load_ms: int | None = 2000) -> Running:
    """A running instance charged `mib` MiB."""
    return Running(state=state, candidate=Candidate(
        instance_id=iid, model=f"m-{iid}", bytes=mib * MiB, idle_s=idle_s, in_flight=in_flight, pinned=pinned,
        keep_alive_s=keep_alive_s, load_ms=load_ms))


def situation(*, limit_mib: int = 4000, ctx: int | None = None, default_ctx: int = 0, default_slots: int = 1,
              running: tuple[Running, ...] = (), max_loaded: int = 0, rpc: bool = False,
              workers: tuple[tuple[str, int], ...] | None = None, room_made: bool = False,
              calibration: CalibrationState | None = None, posture: Posture | None = None) -> Situation:
    """Gemma 3 270M asked for on a 24 GiB host (20 GiB free) whose instances may use `limit_mib` MiB in all."""
    return Situation(model="gemma", meta=gemma3_270m(), ctx=ctx, swa_full=False, default_ctx=default_ctx,
                     default_slots=default_slots, max_loaded_models=max_loaded, memory_limit_bytes=limit_mib * MiB,
                     devices=(host(20 * GiB, 24 * GiB),), running=running,
                     calibration=calibration or CalibrationState(), rpc_capable=rpc, workers=workers,
                     room_made=room_made, posture=posture)


def outline(d: LoadDecision) -> tuple[Any, ...]:
    """What a row expects of a decision: its kind and the facts that tell one outcome from another."""
    if isinstance(d, Start):
        return ("start", d.via, d.fit.ctx_per_slot, sum(plan_workers(d.fit).values()))  # layers spilled to workers
    if isinstance(d, Evict):
        return ("evict", d.reason, d.victims.ids)
    if isinstance(d, Refuse):
        return ("refuse", d.reason)
    return ("probe",)


ROWS: list[tuple[str, Situation, tuple[Any, ...]]] = [
    ("fits as is: the full training context", situation(), ("start", "here", 32768, 0)),
    ("the budget is what the running instances leave of the limit",
     situation(limit_mib=800, running=(run("a", 400, idle_s=10, pinned=True),)), ("start", "here", 15872, 0)),
    ("the settings' context and slots shape the plan", situation(default_ctx=1024), ("start", "here", 1024, 0)),
    # Memory: the cheapest to lose goes (reload seconds / (1 + idle seconds)), and only as many as needed.
    ("fits after evicting the least recently used idle one",
     situation(limit_mib=1000, running=(run("recent", 400, idle_s=5), run("old", 400, idle_s=600))),
     ("evict", "memory", ["old"])),
    ("pinned and busy instances are never chosen, however long idle",
     situation(limit_mib=1000, running=(run("pinned", 250, idle_s=9000, pinned=True),
                                        run("busy", 250, idle_s=9000, in_flight=1), run("idle", 400, idle_s=1))),
     ("evict", "memory", ["idle"])),
    ("a starting or stopping instance is never chosen",
     situation(limit_mib=1100, running=(run("loading", 300, state="starting"), run("going", 250, state="stopping"),
                                        run("idle", 400, idle_s=1))), ("evict", "memory", ["idle"])),
    ("keep-alive forever goes only when nothing else frees enough",
     situation(limit_mib=1000, running=(run("forever", 400, idle_s=600, keep_alive_s=None),
                                        run("small", 100, idle_s=1), run("big", 400, idle_s=1))),
     ("evict", "memory", ["big"])),
    # The count limit.
    ("max_loaded_models reached: the least recently used goes though memory is plenty",
     situation(max_loaded=2, running=(run("a", 300, idle_s=5), run("b", 300, idle_s=50))),
     ("evict", "max_loaded_models", ["b"])),
    ("instances on their way out do not count against max_loaded_models",
     situation(max_loaded=2, running=(run("a", 300, idle_s=5), run("b", 300, state="exiting"))),
     ("start", "here", 32768, 0)),
    ("max_loaded_models reached and every one busy or pinned: refused, no room",
     situation(max_loaded=2, running=(run("a", 300, in_flight=2), run("b", 300, pinned=True))),
     ("refuse", "no_room")),
    # RPC workers.
    ("it cannot fit and nothing can go: the engine can use workers, so they are probed first",
     situation(limit_mib=300, rpc=True), ("probe",)),
    ("it cannot fit and nothing can go: the layers the host cannot hold spill to the idle workers",
     situation(limit_mib=300, rpc=True, workers=BOTH_WORKERS), ("start", "workers", 4096, 11)),
    ("workers are not asked when the engine has no RPC backend", situation(limit_mib=300, rpc=False),
     ("refuse", "does_not_fit")),
    ("no idle workers: refused", situation(limit_mib=300, rpc=True, workers=()), ("refuse", "does_not_fit")),
    ("a default shape that fits only cramped takes workers for the context it would get anywhere",
     situation(limit_mib=330, rpc=True, workers=BOTH_WORKERS), ("start", "workers", 5632, 6)),
    ("a cramped default shape stays here when no worker is idle",
     situation(limit_mib=330, rpc=True, workers=()), ("start", "here", 256, 0)),
    ("a context the caller asked for is never widened on workers",
     situation(limit_mib=330, ctx=256, rpc=True), ("start", "here", 256, 0)),
    ("victims come before workers",
     situation(limit_mib=600, rpc=True, workers=BOTH_WORKERS, running=(run("idle", 300, idle_s=60),)),
     ("evict", "memory", ["idle"])),
    # The fallback shape.
    ("the settings' context does not fit and nothing can go: the largest context that fits in what is free",
     situation(limit_mib=330, default_ctx=4096), ("start", "fallback", 256, 0)),
    ("a context the caller asked for gets no fallback: refused",
     situation(limit_mib=330, ctx=4096), ("refuse", "does_not_fit")),
    ("calibration's measured correction is part of the plan",
     situation(limit_mib=345, ctx=1024, calibration=CalibrationState(models={"gemma": [
         Measurement(seq=1, shape=shape_key(1024, 1, "f16", "f16"), planned_bytes=0, measured_bytes=64 * MiB,
                     diff_bytes=64 * MiB)]})), ("refuse", "does_not_fit")),
    # After the victims are gone.
    ("room made: it fits now", situation(limit_mib=1000, room_made=True), ("start", "here", 32768, 0)),
    ("room made and still short: never another eviction, the workers then",
     situation(limit_mib=400, rpc=True, workers=BOTH_WORKERS, room_made=True,
               running=(run("pinned", 100, pinned=True),)), ("start", "workers", 4096, 11)),
    ("room made and still short with no workers: refused",
     situation(limit_mib=300, room_made=True, running=(run("idle", 100, idle_s=60),)), ("refuse", "does_not_fit")),
]


@pytest.mark.parametrize(("s", "want"), [(s, want) for _, s, want in ROWS], ids=[name for name, _, _ in ROWS])
def test_the_placement_for_each_situation(s: Situation, want: tuple[Any, ...]) -> None:
    assert outline(decide_load(s)) == want


@pytest.mark.parametrize("s", [s for _, s, _ in ROWS], ids=[name for name, _, _ in ROWS])
def test_the_decisions_end(s: Situation) -> None:
    """Carried out, every decision leads to a start or a refusal: workers are asked for at most once per
    observation, and once room was made nothing more is evicted."""
    probed = replace(s, workers=s.workers if s.workers is not None else ())
    assert not isinstance(decide_load(probed), ProbeWorkers)
    assert not isinstance(decide_load(replace(probed, room_made=True)), Evict)
    assert decide_load(s) == decide_load(s)  # the same situation, the same answer


def test_an_eviction_records_the_needs_the_scores_and_why() -> None:
    d = decide_load(situation(limit_mib=1500, running=(run("recent", 400, idle_s=5),
                                                            run("old", 400, idle_s=600, pinned=True),
                                                            run("older", 400, idle_s=900))))
    assert isinstance(d, Evict) and d.victims.ids == ["older"]
    obs = d.observations
    assert obs["need_bytes"] > 0 and obs["need_count"] == 0 and obs["loaded"] == 3
    assert set(obs["scores"]) == {"recent", "older"} and "older" in obs["why"] and "old (pinned)" in obs["why"]
    assert obs["host_free_bytes"] > 0 and obs["max_loaded_models"] == 0


def test_a_refusal_carries_the_plans_levers_and_what_workers_would_have_to_offer() -> None:
    d = decide_load(situation(limit_mib=330, ctx=4096, running=(run("busy", 10, in_flight=1),)))
    assert isinstance(d, Refuse) and d.error is DoesNotFit and d.fit is not None and not d.fit.fits
    assert [lv.kind for lv in d.levers][:1] == ["ctx"]  # a smaller context would fit
    assert d.worker_bytes is not None and 100 * MiB < d.worker_bytes < 600 * MiB
    assert d.detail.startswith(d.fit.summary)
    assert f"idle workers offering {d.worker_bytes / MiB:.0f} MiB" in d.detail
    assert "blazar engine build --target rpc-server" in d.detail  # this engine cannot use workers yet
    assert d.observations["busy_or_pinned"] == ["busy"] and d.observations["need_bytes"] > 0
    # An engine with the RPC backend is told only to start workers.
    rpc = decide_load(situation(limit_mib=330, ctx=4096, rpc=True, workers=()))
    assert isinstance(rpc, Refuse) and "--target rpc-server" not in rpc.detail and "blazar worker --mem" in rpc.detail


def test_a_host_too_small_even_for_the_embeddings_names_no_worker_lever() -> None:
    d = decide_load(situation(limit_mib=200, rpc=True, workers=BOTH_WORKERS))
    assert isinstance(d, Refuse) and d.reason == "does_not_fit" and d.worker_bytes is None
    assert "RPC workers" not in d.detail


def test_the_count_refusal_names_the_limit_and_what_holds_it() -> None:
    d = decide_load(situation(max_loaded=1, running=(run("a", 300, pinned=True),)))
    assert isinstance(d, Refuse) and d.reason == "no_room" and d.fit is None and d.levers == []
    assert d.detail == ("1 instances loaded (max_loaded_models 1) and none can be evicted: every one is busy or "
                        "pinned")
    assert d.observations == {"need_bytes": 0, "need_count": 1, "loaded": 1, "max_loaded_models": 1,
                              "host_free_bytes": d.observations["host_free_bytes"], "busy_or_pinned": ["a"]}


def test_a_spread_start_names_each_workers_layers_and_the_free_memory_it_saw() -> None:
    d = decide_load(situation(limit_mib=300, rpc=True, workers=BOTH_WORKERS))
    assert isinstance(d, Start) and d.fit.fits
    spilled = plan_workers(d.fit)
    assert set(spilled) == {W1, W2} and all(n > 0 for n in spilled.values())
    assert d.host_free_bytes > 0


# -- an adopted posture (instances/posture_choice.py) ----------------------------------------------------------------

Q8 = Posture(spec_type="ngram-simple", cache_type_k="q8_0", cache_type_v="q8_0", flash_attn=True, threads=1)
FOUR = Posture(slots=4)

POSTURE_ROWS: list[tuple[str, Situation, tuple[Any, ...]]] = [
    ("no posture: the fit's own choices", situation(), ("start", "here", 32768, 1, "f16", "defaults")),
    ("the posture pins the cache types and flash attention; speculation and threads are the argv's",
     situation(posture=Q8), ("start", "here", 32768, 1, "q8_0", Q8.label())),
    ("the posture's slots win over the settings'", situation(posture=FOUR, default_slots=2),
     ("start", "here", 32768, 4, "f16", "np=4")),
    ("four slots fit at the asked context by quantising the cache", situation(ctx=4096, limit_mib=400, posture=FOUR),
     ("start", "here", 4096, 4, "q8_0", "np=4")),
    ("the posture does not fit at the asked context: the defaults do, and go",
     situation(ctx=4096, limit_mib=360, posture=FOUR), ("start", "here", 4096, 1, "f16", "defaults")),
    ("the posture fits only cramped at the default shape: the defaults fit it, and go",
     situation(default_ctx=4096, limit_mib=360, posture=FOUR), ("start", "here", 4096, 1, "f16", "defaults")),
    ("a posture pinning f16 that does not fit: the defaults quantise the cache and go",
     situation(ctx=8192, limit_mib=360, posture=Posture(cache_type_k="f16", cache_type_v="f16")),
     ("start", "here", 8192, 1, "q8_0", "defaults")),
    ("neither the posture nor the defaults fit: the posture's refusal, with its plan",
     situation(ctx=4096, limit_mib=300, posture=FOUR), ("refuse", "does_not_fit", 4)),
]


def posture_outline(d: LoadDecision) -> tuple[Any, ...]:
    if isinstance(d, Start):
        return ("start", d.via, d.fit.ctx_per_slot, d.fit.slots, d.fit.cache_type_k,
                d.posture.label() if d.posture else "defaults")
    if isinstance(d, Refuse):
        return ("refuse", d.reason, d.fit.slots if d.fit else None)
    return outline(d)


@pytest.mark.parametrize(("s", "want"), [(s, want) for _, s, want in POSTURE_ROWS],
                         ids=[name for name, _, _ in POSTURE_ROWS])
def test_the_placement_at_an_adopted_posture(s: Situation, want: tuple[Any, ...]) -> None:
    assert posture_outline(decide_load(s)) == want


def test_a_posture_keeps_evictions_as_they_are() -> None:
    d = decide_load(situation(limit_mib=1000, posture=Q8,
                              running=(run("recent", 400, idle_s=5), run("old", 400, idle_s=600))))
    assert isinstance(d, Evict) and d.victims.ids == ["old"]
    after = decide_load(situation(limit_mib=1000, posture=Q8, room_made=True, running=(run("recent", 400),)))
    assert isinstance(after, Start) and after.posture == Q8 and after.fit.cache_type_v == "q8_0"


# -- a new shape of a running model ---------------------------------------------------------------------------------

def shape(*, ctx_tokens: int = 512, template: str = "", pinned: bool = False, in_flight: int = 0) -> Shape:
    return Shape(instance_id="i1", ctx_tokens=ctx_tokens, template=template, pinned=pinned, in_flight=in_flight)


@pytest.mark.parametrize(("running", "ctx", "embeddings", "want"), [
    # Another template (the model was changed): it gives way once idle, pinned or not.
    (shape(template="old"), 1024, False, GiveWay({"template_wanted": "", "template_had": "old"})),
    (shape(template="old", pinned=True), 1024, False, GiveWay({"template_wanted": "", "template_had": "old"})),
    (shape(template="old", in_flight=1), 1024, False, None),
    # The same template, a larger context or the embeddings endpoint wanted: an idle one gives way, a busy one stays.
    (shape(), 1024, False, GiveWay({"ctx_wanted": 1024, "ctx_had": 512, "embeddings_wanted": False})),
    (shape(), None, True, GiveWay({"ctx_wanted": None, "ctx_had": 512, "embeddings_wanted": True})),
    (shape(in_flight=2), 1024, False, None),
])
def test_which_running_instance_gives_way_to_a_new_shape(running: Shape, ctx: int | None, embeddings: bool,
                                                          want: GiveWay | None) -> None:
    assert decide_give_way("gemma", running, ctx=ctx, embeddings=embeddings, template="") == want


@pytest.mark.parametrize(("ctx", "embeddings", "why"), [
    (2048, False, "gemma is pinned at 512 tokens per slot and 2048 were asked for"),
    (None, True, "gemma is pinned at 512 tokens per slot and this request needs the embeddings endpoint"),
])
def test_a_pinned_instance_refuses_a_new_shape_with_the_way_out(ctx: int | None, embeddings: bool, why: str) -> None:
    d = decide_give_way("gemma", shape(pinned=True, in_flight=1), ctx=ctx, embeddings=embeddings, template="")
    assert isinstance(d, Refuse) and d.reason == "no_room" and d.error is ModelPinned
    assert d.detail.startswith(why) and "blazar load gemma --unpin" in d.detail
    assert d.observations == {"ctx_wanted": ctx, "ctx_had": 512, "embeddings_wanted": embeddings, "pinned": "i1"}


@pytest.mark.parametrize("pinned", [False, True])
def test_an_instance_in_the_other_mode_stays_whatever_it_is(pinned: bool) -> None:
    """A rerank instance serves what a chat or embeddings one does not, and the other way round: neither gives way to
    the other (memory decides whether one goes), and a pinned one refuses nothing."""
    rerank = Shape(instance_id="r", ctx_tokens=512, template="", pinned=pinned, in_flight=0, rerank=True)
    assert decide_give_way("gemma", rerank, ctx=1024, embeddings=False, template="") is None
    assert decide_give_way("gemma", rerank, ctx=None, embeddings=True, template="") is None
    chat = shape(pinned=pinned)
    assert decide_give_way("gemma", chat, ctx=None, embeddings=False, template="", rerank=True) is None
    # In its own mode, a rerank instance with a smaller context gives way like any other.
    assert isinstance(decide_give_way("gemma", Shape(instance_id="r", ctx_tokens=512, template="", pinned=False,
                                                     in_flight=0, rerank=True),
                                      ctx=1024, embeddings=False, template="", rerank=True), GiveWay)


def gone(ctx_tokens: int, *, embeddings: bool = False, rerank: bool = False) -> Shape:
    return Shape(instance_id="g", ctx_tokens=ctx_tokens, template="", pinned=False, in_flight=0,
                 embeddings=embeddings, rerank=rerank)


@pytest.mark.parametrize(("ctx", "embeddings", "gave_way", "want"), [
    # Nothing gave way: the request's own shape (None: the default context).
    (None, True, [], (None, True)),
    (4096, False, [], (4096, False)),
    # Embeddings at the default context after chat at 4096: the new instance keeps the 4096 (the next chat turn
    # needs it) and turns embeddings on.
    (None, True, [gone(4096)], (4096, True)),
    # Chat at 8192 after an instance that served embeddings at 4096: the larger context, embeddings kept.
    (8192, False, [gone(4096, embeddings=True)], (8192, True)),
    # A request for more than what gave way: its own context wins.
    (2048, False, [gone(1024)], (2048, False)),
    # Several gave way: the largest context, and embeddings if any served them.
    (None, False, [gone(1024, embeddings=True), gone(4096)], (4096, True)),
    # A rerank instance hands nothing on: it serves one kind of request.
    (None, True, [gone(8192, rerank=True)], (None, True)),
])
def test_a_new_shape_carries_what_the_instances_that_gave_way_served(
        ctx: int | None, embeddings: bool, gave_way: list[Shape], want: tuple[int | None, bool]) -> None:
    assert carried_shape(ctx, embeddings, gave_way) == want


# -- a model that is no GGUF: its kind's memory model, on the host alone ------------------------------------------

def whisper(**kw: Any) -> Situation:
    """A whisper model charged 461 MiB (its memory model) instead of a GGUF plan; workers are never its answer."""
    return replace(situation(rpc=True, **kw), model="whisper-base", fixed_bytes=461 * MiB, kind="whisper")


def test_a_whisper_model_is_charged_its_memory_model_on_the_host() -> None:
    d = decide_load(whisper())
    assert isinstance(d, Start) and d.via == "here" and d.fit.fits
    assert d.fit.local_bytes == 461 * MiB and d.fit.architecture == "whisper" and d.fit.ctx_per_slot == 0
    assert [u.kind for u in d.fit.devices] == ["host"]


def test_a_whisper_model_evicts_the_idle_instance_its_charge_needs_room_from() -> None:
    d = decide_load(whisper(limit_mib=1000, running=(run("recent", 400, idle_s=5), run("old", 400, idle_s=600))))
    assert outline(d) == ("evict", "memory", ["old"])
    assert d.observations["need_bytes"] == (461 + 800 - 1000) * MiB  # type: ignore[union-attr]


def test_a_whisper_model_that_cannot_fit_is_refused_without_a_workers_lever_or_a_probe() -> None:
    d = decide_load(whisper(limit_mib=300))
    assert isinstance(d, Refuse) and d.reason == "does_not_fit" and d.worker_bytes is None
    assert "whisper-base (whisper, charged by its memory model) does not fit" in d.detail
    assert "RPC workers" not in d.detail


def test_a_load_that_may_not_evict_is_refused_where_it_would_and_started_where_it_need_not() -> None:
    """A preload (instances/preload.py) never evicts: a victim chosen is a refusal naming it, by count or by memory;
    one that fits beside what runs starts as any load would."""
    by_count = decide_load(replace(situation(max_loaded=1, running=(run("a", 300, idle_s=60),)), may_evict=False))
    assert isinstance(by_count, Refuse) and by_count.reason == "no_room"
    assert by_count.detail == "it would evict m-a (a) (max_loaded_models 1), and a preload never evicts"
    assert by_count.observations["would_evict"] == ["a"] and by_count.observations["may_evict"] is False
    crowded = situation(limit_mib=1500, running=(run("recent", 400, idle_s=5), run("older", 400, idle_s=900),
                                                 run("old", 400, idle_s=600, pinned=True)))
    assert isinstance(decide_load(crowded), Evict)  # any other load makes its room
    by_memory = decide_load(replace(crowded, may_evict=False))
    assert isinstance(by_memory, Refuse) and by_memory.reason == "does_not_fit"
    assert by_memory.detail.startswith("it would evict m-older (older) (") and "MiB short" in by_memory.detail
    beside = decide_load(replace(situation(running=(run("a", 300),)), may_evict=False))
    assert isinstance(beside, Start) and beside.via == "here"
# -- a request's load that only busy instances have room for (`may_wait`: the swap order, serving/swaps.py) -----------
# Without waiting it is refused (`no_room`: victims are never busy); a caller that waits is told which busy instances
# to wait for. A pinned instance is never waited for: it never goes.


def test_without_waiting_a_load_that_only_a_busy_instance_has_room_for_is_refused() -> None:
    d = decide_load(situation(max_loaded=1, running=(run("a", 300, in_flight=1),)))
    assert isinstance(d, Refuse) and d.reason == "no_room"


def test_a_caller_that_waits_is_told_the_busy_instances_for_the_count_limit() -> None:
    s = replace(situation(max_loaded=1, running=(run("a", 300, in_flight=2),)), may_wait=True)
    assert decide_load(s) == Busy(victims=("a",), models=("m-a",), reason="max_loaded_models")


def test_a_caller_that_waits_is_told_the_busy_instances_for_memory() -> None:
    s = replace(situation(limit_mib=500, running=(run("a", 400, in_flight=1),)), may_wait=True)
    d = decide_load(s)
    assert isinstance(d, Busy) and d.victims == ("a",) and d.reason == "memory"


def test_an_idle_victim_is_still_evicted_at_once_when_waiting_is_allowed() -> None:
    s = replace(situation(max_loaded=1, running=(run("a", 300),)), may_wait=True)
    d = decide_load(s)
    assert isinstance(d, Evict) and d.victims.ids == ["a"]


def test_a_pinned_instance_is_never_waited_for() -> None:
    s = replace(situation(max_loaded=1, running=(run("a", 300, in_flight=1, pinned=True),)), may_wait=True)
    d = decide_load(s)
    assert isinstance(d, Refuse) and d.reason == "no_room"


def test_only_the_busy_ones_of_the_victims_are_named() -> None:
    s = replace(situation(max_loaded=2, running=(run("a", 300, in_flight=1), run("b", 300, in_flight=3))),
                may_wait=True)
    d = decide_load(s)
    assert isinstance(d, Busy) and len(d.victims) == 1 and d.reason == "max_loaded_models"


def test_a_loading_instance_is_waited_for_like_a_busy_one() -> None:
    s = replace(situation(max_loaded=1, running=(run("a", 300, state="starting"),)), may_wait=True)
    assert decide_load(s) == Busy(victims=("a",), models=("m-a",), reason="max_loaded_models")
