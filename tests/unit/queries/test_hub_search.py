"""The decisions behind `blazar search`: a repo's GGUF files as models (split parts together, projectors left out),
the pull target each gets, the order headers are read in under a budget, and the planner's verdict made short."""

from __future__ import annotations

from blazar.adapters.hub import RemoteFile, gguf_models
from blazar.fit import FitRequest, plan
from blazar.queries.hub_search import planning_order, pull_target, verdict
from tests.support.fit_models import GiB, MiB, gpu, host, host_for_budget, transformer


def _f(path: str, size: int = 10) -> RemoteFile:
    return RemoteFile(path, size, None)


def test_models_group_split_parts_and_leave_projectors_out() -> None:
    files = [_f("m-Q4_K_M.gguf", 100), _f("Q8_0/m-Q8_0-00001-of-00002.gguf", 70),
             _f("Q8_0/m-Q8_0-00002-of-00002.gguf", 60), _f("mmproj-m-F16.gguf", 5), _f("m-F16-00001-of-00003.gguf")]
    got = {m.files[0].path: m for m in gguf_models(files)}
    assert set(got) == {"m-Q4_K_M.gguf", "Q8_0/m-Q8_0-00001-of-00002.gguf", "m-F16-00001-of-00003.gguf"}
    q8 = got["Q8_0/m-Q8_0-00001-of-00002.gguf"]
    assert q8.quant == "Q8_0" and q8.size == 130 and q8.complete and len(q8.files) == 2
    assert got["m-Q4_K_M.gguf"].quant == "Q4_K_M" and got["m-Q4_K_M.gguf"].complete
    assert not got["m-F16-00001-of-00003.gguf"].complete  # parts 2 and 3 are not in the repo


def test_a_file_that_names_no_quant_is_still_a_model() -> None:
    (m,) = gguf_models([_f("model.gguf")])
    assert m.quant is None and m.complete


def test_pull_target_is_the_quant_when_it_names_one_model_else_the_path() -> None:
    one = gguf_models([_f("a-Q4_K_M.gguf"), _f("a-Q8_0.gguf")])
    assert [pull_target("o/r", m, one) for m in one] == ["o/r:Q4_K_M", "o/r:Q8_0"]
    two = gguf_models([_f("small/a-Q4_K_M.gguf"), _f("big/b-Q4_K_M.gguf"), _f("plain.gguf")])
    assert sorted(pull_target("o/r", m, two) for m in two) == [
        "o/r/big/b-Q4_K_M.gguf", "o/r/plain.gguf", "o/r/small/a-Q4_K_M.gguf"]


def test_planning_order_is_round_robin_with_q4_k_m_first() -> None:
    a = gguf_models([_f("a-Q8_0.gguf", 8), _f("a-Q2_K.gguf", 2), _f("a-Q4_K_M.gguf", 4)])
    b = gguf_models([_f("b-Q6_K.gguf", 6)])
    order = [(repo, m.quant) for repo, m in planning_order([("o/a", a), ("o/b", b), ("o/none", [])])]
    assert order == [("o/a", "Q4_K_M"), ("o/b", "Q6_K"), ("o/a", "Q2_K"), ("o/a", "Q8_0")]


def test_verdict_on_the_host_gives_the_largest_context() -> None:
    v = verdict(plan(transformer(), [host(64 * GiB)], FitRequest()))
    assert v.fits is True and v.where == "CPU" and v.ctx == 32768 and v.detail == ""


def test_verdict_on_a_gpu_says_whether_every_layer_is_there() -> None:
    v = verdict(plan(transformer(), [gpu(80 * GiB), host(64 * GiB)], FitRequest()))
    assert v.fits is True and v.where == "GPU"
    meta = transformer()
    part = plan(meta, [gpu(meta.weights_bytes // 2), host(64 * GiB)], FitRequest(ctx=4096))
    v = verdict(part)
    assert v.fits is True and v.where == f"GPU {part.gpu_layers}/{part.offloadable_layers} layers + CPU"
    assert 0 < part.gpu_layers < part.offloadable_layers


def test_verdict_that_does_not_fit_carries_the_planners_reason() -> None:
    p = plan(transformer(), [host_for_budget(64 * MiB)], FitRequest())
    v = verdict(p)
    assert v.fits is False and v.ctx is None and p.refusal is not None and v.detail == p.refusal.detail

