"""The planner: cache-type ladder, refusals with levers, largest ctx and slots, GPU offload, JSON output."""

from __future__ import annotations

from blazar.fit import FitPlan, FitRequest, budget_bytes, plan
from blazar.fit.layout import assign_layers
from tests.support.fit_models import GiB, MiB, gemma3_270m, gpu, gpu_for_budget, host, host_for_budget, transformer


def _cost(meta, devices, **req) -> int:
    p = plan(meta, devices, FitRequest(**req))
    return p.total_bytes


def test_ladder_takes_q8_0_when_f16_does_not_fit_then_q4_0() -> None:
    meta = transformer()
    big = [host(256 * GiB)]
    f16 = _cost(meta, big, ctx=32768, cache_type_k="f16", cache_type_v="f16")
    q8 = _cost(meta, big, ctx=32768, cache_type_k="q8_0", cache_type_v="q8_0")
    q4 = _cost(meta, big, ctx=32768, cache_type_k="q4_0", cache_type_v="q4_0")
    assert f16 > q8 > q4
    p = plan(meta, [host_for_budget((f16 + q8) // 2)], FitRequest(ctx=32768))
    assert p.fits and (p.cache_type_k, p.cache_type_v) == ("q8_0", "q8_0")
    assert any("f16 does not fit" in n for n in p.notes)
    p = plan(meta, [host_for_budget((q8 + q4) // 2)], FitRequest(ctx=32768))
    assert p.fits and (p.cache_type_k, p.cache_type_v) == ("q4_0", "q4_0")
    p = plan(meta, [host_for_budget(f16 + MiB)], FitRequest(ctx=32768))
    assert (p.cache_type_k, p.cache_type_v) == ("f16", "f16")


def test_ladder_keeps_v_f16_without_flash_attention() -> None:
    meta = transformer()
    f16 = _cost(meta, [host(256 * GiB)], ctx=32768, flash_attn=False, cache_type_k="f16", cache_type_v="f16")
    p = plan(meta, [host_for_budget(f16 - 256 * MiB)], FitRequest(ctx=32768, flash_attn=False))
    assert p.fits and (p.cache_type_k, p.cache_type_v) == ("q8_0", "f16")


def test_quantised_v_without_flash_attention_is_an_invalid_request() -> None:
    p = plan(transformer(), [host(64 * GiB)], FitRequest(ctx=4096, cache_type_v="q8_0", flash_attn=False))
    assert not p.fits and p.refusal is not None and p.refusal.reason == "invalid_request"


def test_refusal_carries_reason_numbers_and_checked_levers() -> None:
    meta = transformer()
    f16 = _cost(meta, [host(256 * GiB)], ctx=32768, cache_type_k="f16", cache_type_v="f16")
    budget = f16 - GiB
    p = plan(meta, [host_for_budget(budget)], FitRequest(ctx=32768, cache_type_k="f16", cache_type_v="f16"))
    assert not p.fits and p.refusal is not None
    r = p.refusal
    assert r.reason == "over_budget" and r.device == "host"
    assert r.need_bytes == f16 and abs(r.budget_bytes - budget) <= 1
    kinds = {lv.kind: lv.value for lv in r.levers}
    assert set(kinds) >= {"ctx", "cache_type", "quant"}
    assert kinds["cache_type"] == "q8_0"
    assert isinstance(kinds["ctx"], int) and kinds["ctx"] < 32768
    # each lever was checked: applying it alone makes the plan fit
    assert plan(meta, [host_for_budget(budget)], FitRequest(ctx=kinds["ctx"], cache_type_k="f16",
                                                            cache_type_v="f16")).fits
    assert "does not fit" in p.summary and "ctx" in p.summary and ("MiB" in p.summary or "GiB" in p.summary)


def test_fewer_slots_is_offered_when_slots_are_the_problem() -> None:
    meta = transformer()
    two = _cost(meta, [host(256 * GiB)], ctx=16384, slots=2, cache_type_k="f16", cache_type_v="f16")
    p = plan(meta, [host_for_budget(two - MiB)], FitRequest(ctx=16384, slots=4, cache_type_k="f16",
                                                           cache_type_v="f16"))
    assert p.refusal is not None
    assert {"kind": "slots", "value": 1} in [{"kind": lv.kind, "value": lv.value} for lv in p.refusal.levers]


def test_weights_larger_than_the_budget_point_at_a_smaller_quant() -> None:
    meta = transformer()
    p = plan(meta, [host_for_budget(2 * GiB)], FitRequest(ctx=4096))
    assert p.refusal is not None
    quant = [lv for lv in p.refusal.levers if lv.kind == "quant"]
    assert quant and isinstance(quant[0].value, int) and quant[0].value < meta.weights_bytes
    assert all(lv.kind == "quant" for lv in p.refusal.levers)


def test_largest_ctx_is_exact_and_monotone_in_slots() -> None:
    meta = transformer(ctx_train=131072)
    devs = [host_for_budget(12 * GiB)]
    fixed = {"cache_type_k": "f16", "cache_type_v": "f16"}
    p = plan(meta, devs, FitRequest(ctx=None, **fixed))
    m = p.ctx_per_slot
    assert p.fits and m % 256 == 0 and 4096 < m < 131072
    assert p.max_ctx_at_slots == m
    assert plan(meta, devs, FitRequest(ctx=m, **fixed)).fits
    assert not plan(meta, devs, FitRequest(ctx=m + 256, **fixed)).fits
    by_slots = [plan(meta, devs, FitRequest(ctx=None, slots=s, **fixed)).ctx_per_slot for s in (1, 2, 3, 4)]
    assert by_slots == sorted(by_slots, reverse=True)


def test_unpinned_ctx_stops_at_ctx_train_then_adds_slots() -> None:
    p = plan(gemma3_270m(), [host(64 * GiB)], FitRequest(ctx=None, slots=None))
    assert p.fits and p.ctx_per_slot == 32768 and p.slots == 4


def test_largest_slots_at_ctx_is_exact() -> None:
    meta = transformer()
    devs = [host_for_budget(9 * GiB)]
    p = plan(meta, devs, FitRequest(ctx=8192, slots=None, cache_type_k="f16", cache_type_v="f16"))
    assert p.fits and 1 <= p.slots <= 4
    s = p.max_slots_at_ctx
    assert s is not None and s >= p.slots
    assert plan(meta, devs, FitRequest(ctx=8192, slots=s, cache_type_k="f16", cache_type_v="f16")).fits
    assert not plan(meta, devs, FitRequest(ctx=8192, slots=s + 1, cache_type_k="f16", cache_type_v="f16")).fits


def test_pinned_ctx_above_ctx_train_is_clamped_with_a_note() -> None:
    p = plan(transformer(ctx_train=8192), [host(64 * GiB)], FitRequest(ctx=100_000))
    assert p.ctx_per_slot == 8192 and any("clamped" in n for n in p.notes)


def test_incomplete_metadata_is_refused_with_its_reason() -> None:
    meta = transformer(head_count=None, head_count_kv=None, key_length=None, value_length=None)
    p = plan(meta, [host(64 * GiB)], FitRequest(ctx=4096))
    assert not p.fits and p.refusal is not None and p.refusal.reason == "metadata_incomplete"


def test_partial_offload_puts_the_last_layers_and_their_kv_on_the_gpu() -> None:
    meta = transformer(n_layer=32, layer_bytes=120 * MiB)
    p = plan(meta, [gpu_for_budget(2 * GiB), host(64 * GiB)], FitRequest(ctx=4096, cache_type_k="f16",
                                                                        cache_type_v="f16"))
    assert p.fits
    g = p.gpu_layers
    assert 1 < g < 32
    cuda, h = p.devices
    # -ngl g offloads the output layer first, then the last g - 1 blocks (llama_model::load_tensors)
    assert cuda.key == "cuda:0" and cuda.layers == g - 1 and h.layers == 33 - g
    assert cuda.weights_bytes == (g - 1) * 120 * MiB + 70 * MiB
    per_layer_kv = 2 * 8 * 128 * 4096 * 2
    assert cuda.kv_bytes == (g - 1) * per_layer_kv and h.kv_bytes == (33 - g) * per_layer_kv
    assert h.weights_bytes == (33 - g) * 120 * MiB + 70 * MiB
    more = plan(meta, [gpu_for_budget(2 * GiB), host(64 * GiB)], FitRequest(ctx=4096, gpu_layers=g + 1,
                                                                           cache_type_k="f16", cache_type_v="f16"))
    assert not more.fits and more.refusal is not None and more.refusal.device == "cuda:0"
    assert any(lv.kind == "gpu_layers" and lv.value == g for lv in more.refusal.levers)


def test_full_offload_keeps_only_the_input_layer_on_the_host() -> None:
    meta = transformer(n_layer=32)
    p = plan(meta, [gpu(80 * GiB), host(64 * GiB)], FitRequest(ctx=8192))
    cuda, h = p.devices
    assert p.gpu_layers == 33 and cuda.layers == 32
    assert cuda.weights_bytes == 32 * 120 * MiB + 70 * MiB and h.weights_bytes == 70 * MiB
    assert h.kv_bytes == 0 and cuda.fixed_bytes > 0
    assert h.compute_bytes < cuda.compute_bytes  # the host only stages inputs


def test_tied_output_copies_the_token_embedding_to_the_gpu() -> None:
    meta = gemma3_270m()  # no output.weight: llama.cpp duplicates token_embd onto the output layer's device
    p = plan(meta, [gpu(16 * GiB), host(16 * GiB)], FitRequest(ctx=8192))
    cuda, h = p.devices
    assert cuda.weights_bytes == sum(meta.layer_bytes) + meta.output_bytes + meta.tied_output_bytes
    assert h.weights_bytes == meta.input_bytes
    older = meta.model_copy(update={"tied_output_bytes": 0})  # a summary without the field: inferred
    assert plan(older, [gpu(16 * GiB), host(16 * GiB)], FitRequest(ctx=8192)).devices[0].weights_bytes == (
        sum(meta.layer_bytes) + meta.output_bytes + meta.input_bytes)
    untied = transformer()
    assert plan(untied, [gpu(80 * GiB), host(16 * GiB)], FitRequest(ctx=8192)).devices[0].weights_bytes == (
        sum(untied.layer_bytes) + untied.output_bytes)


def test_layers_split_across_gpus_by_free_memory() -> None:
    devs = [gpu(40 * GiB, 0), gpu(40 * GiB, 1)]
    place = assign_layers(32, 33, devs)
    # layer il goes to the first GPU whose cumulative share exceeds il / 33: 0..16 -> cuda:0, 17..32 -> cuda:1
    assert place[:17] == ["cuda:0"] * 17 and place[17:] == ["cuda:1"] * 16
    lopsided = assign_layers(32, 33, [gpu(30 * GiB, 0), gpu(10 * GiB, 1)])
    assert lopsided.count("cuda:0") == 25 and lopsided.count("cuda:1") == 8
    assert assign_layers(32, 10, devs)[:23] == ["host"] * 23


def test_no_gpu_means_cpu_only_whatever_gpu_layers_says() -> None:
    p = plan(transformer(), [host(64 * GiB)], FitRequest(ctx=4096, gpu_layers=99))
    assert p.fits and p.gpu_layers == 0 and "CPU only" in p.summary


def test_correction_lands_on_the_device_holding_the_model() -> None:
    meta = transformer()
    devs = [gpu(80 * GiB), host(64 * GiB)]
    base = plan(meta, devs, FitRequest(ctx=4096))
    corr = plan(meta, devs, FitRequest(ctx=4096, correction=300 * MiB))
    assert corr.devices[0].total_bytes - base.devices[0].total_bytes == 300 * MiB
    assert corr.devices[1].total_bytes == base.devices[1].total_bytes
    assert corr.estimate_bytes == base.total_bytes == corr.total_bytes - 300 * MiB


def test_plan_is_json_and_budgets_follow_the_devices() -> None:
    devs = [host(32 * GiB)]
    p = plan(gemma3_270m(), devs, FitRequest(ctx=8192))
    again = FitPlan.model_validate_json(p.model_dump_json())
    assert again == p
    assert p.devices[0].budget_bytes == budget_bytes(devs[0])
    assert p.devices[0].free_bytes == p.devices[0].budget_bytes - p.devices[0].total_bytes
