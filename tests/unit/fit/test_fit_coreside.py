"""Co-residency: greedy in the order given, the reserve counted once per device, deferrals with reasons."""

from __future__ import annotations

from blazar.fit import FitRequest, coreside, plan
from blazar.fit.devices import budget_bytes
from tests.support.fit_models import GiB, MiB, gemma3_270m, host, host_for_budget, transformer


def test_coreside_keeps_what_fits_in_priority_order_and_defers_the_rest() -> None:
    big, small = transformer(name="big"), gemma3_270m()
    roomy = [host(256 * GiB)]
    p_big = plan(big, roomy, FitRequest(ctx=4096))
    p_small = plan(small, roomy, FitRequest(ctx=4096))
    p_big2 = plan(big, roomy, FitRequest(ctx=8192))
    # room for big + small, not for a second big
    devs = [host_for_budget(p_big.total_bytes + p_small.total_bytes + 100 * MiB)]
    out = coreside([("big", p_big), ("big-8k", p_big2), ("small", p_small)], devs)
    assert [r.name for r in out.resident] == ["big", "small"]
    assert [d.name for d in out.deferred] == ["big-8k"]
    d = out.deferred[0]
    assert d.device == "host" and d.need_bytes == p_big2.total_bytes
    assert d.left_bytes == budget_bytes(devs[0]) - p_big.total_bytes
    tally = out.devices[0]
    assert tally.used_bytes == p_big.total_bytes + p_small.total_bytes
    assert tally.left_bytes == tally.budget_bytes - tally.used_bytes
    assert "deferred: big-8k" in out.summary


def test_order_is_the_priority() -> None:
    a, b = gemma3_270m(), gemma3_270m()
    roomy = [host(256 * GiB)]
    pa = plan(a, roomy, FitRequest(ctx=32768))
    pb = plan(b, roomy, FitRequest(ctx=4096))
    devs = [host_for_budget(pa.total_bytes + MiB)]
    assert [r.name for r in coreside([("a", pa), ("b", pb)], devs).resident] == ["a"]
    assert [r.name for r in coreside([("b", pb), ("a", pa)], devs).resident] == ["b"]


def test_reserve_is_counted_once_not_per_model() -> None:
    m = gemma3_270m()
    p = plan(m, [host(256 * GiB)], FitRequest(ctx=4096))
    devs = [host_for_budget(3 * p.total_bytes)]
    assert len(coreside([("a", p), ("b", p), ("c", p)], devs).resident) == 3


def test_a_model_that_does_not_fit_alone_is_deferred_with_its_own_reason() -> None:
    p = plan(transformer(), [host_for_budget(GiB)], FitRequest(ctx=4096))
    out = coreside([("huge", p)], [host(64 * GiB)])
    assert not out.resident and "does not fit on its own" in out.deferred[0].reason
