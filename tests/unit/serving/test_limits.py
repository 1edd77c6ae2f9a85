"""Per-key limits with a fake clock: rpm over a sliding minute, tpm counted at completion, daily tokens and audio
seconds per UTC day, and the concurrency lease."""

from __future__ import annotations

import pytest

from blazar.clock import FakeClock
from blazar.serving.limits import DAY_S, KeyLimits, Limiter, LimitExceeded


def limiter(start: float = 10 * DAY_S, seed=None) -> tuple[Limiter, FakeClock]:
    clock = FakeClock(start=start)
    return Limiter(clock, seed=seed), clock


def test_rpm_refuses_the_request_past_the_limit_until_the_oldest_leaves_the_window() -> None:
    lim, clock = limiter()
    k = KeyLimits("a", rpm=2)
    lim.release(lim.acquire(k))
    clock.advance(10)
    lim.release(lim.acquire(k))
    with pytest.raises(LimitExceeded) as e:
        lim.acquire(k)
    assert e.value.limit == "rpm" and e.value.retry_after_s == 50.0
    clock.advance(50)
    lim.release(lim.acquire(k))  # the first one is 60 s old: out of the window


def test_a_refused_request_does_not_count_against_rpm() -> None:
    lim, clock = limiter()
    k = KeyLimits("a", rpm=1)
    lim.acquire(k)
    for _ in range(5):
        with pytest.raises(LimitExceeded):
            lim.acquire(k)
    clock.advance(60)
    lim.acquire(k)


def test_tpm_counts_tokens_at_completion_and_says_when_enough_have_aged_out() -> None:
    lim, clock = limiter()
    k = KeyLimits("a", tpm=100)
    lim.add_tokens("a", 60)
    clock.advance(20)
    lim.add_tokens("a", 50)
    with pytest.raises(LimitExceeded) as e:
        lim.acquire(k)
    assert e.value.limit == "tpm" and e.value.retry_after_s == 40.0  # then the 60 leave and 50 < 100
    clock.advance(40)
    lim.acquire(k)


def test_daily_tokens_reset_at_utc_midnight_and_start_from_the_seed() -> None:
    lim, clock = limiter(start=10 * DAY_S + DAY_S - 100, seed=lambda name, day: 900 if day == 10 else 0)
    k = KeyLimits("a", daily_tokens=1000)
    lim.acquire(k)
    lim.add_tokens("a", 100)  # 900 from the log + 100
    with pytest.raises(LimitExceeded) as e:
        lim.acquire(k)
    assert e.value.limit == "daily_tokens" and e.value.retry_after_s == 100.0
    clock.advance(100)
    lim.acquire(k)


def test_daily_audio_seconds_count_apart_from_tokens_reset_at_utc_midnight_and_start_from_the_seed() -> None:
    clock = FakeClock(start=10 * DAY_S + DAY_S - 100)
    lim = Limiter(clock, seed=lambda name, day: 0, audio_seed=lambda name, day: 50.0 if day == 10 else 0.0)
    k = KeyLimits("a", daily_tokens=1000, daily_audio_s=60)
    lim.acquire(k)
    lim.add_tokens("a", 10)  # tokens are not seconds: neither limit borrows from the other
    lim.add_audio("a", 9.5)  # 50 s from the log + 9.5 s: under 60
    lim.acquire(k)
    lim.add_audio("a", 0.5)
    with pytest.raises(LimitExceeded) as e:
        lim.acquire(k)
    assert e.value.limit == "daily_audio_s" and e.value.value == 60 and e.value.retry_after_s == 100.0
    assert "60.0 s of audio today" in e.value.message
    lim.acquire(KeyLimits("b", daily_audio_s=60))  # another key's audio is its own
    clock.advance(100)
    lim.acquire(k)  # a new UTC day


def test_max_concurrent_is_a_lease_given_back_once() -> None:
    lim, _ = limiter()
    k = KeyLimits("a", max_concurrent=1)
    lease = lim.acquire(k)
    with pytest.raises(LimitExceeded) as e:
        lim.acquire(k)
    assert e.value.limit == "max_concurrent" and lim.in_flight("a") == 1
    lim.release(lease)
    lim.release(lease)  # a second release changes nothing
    assert lim.in_flight("a") == 0
    second = lim.acquire(k)
    with pytest.raises(LimitExceeded):
        lim.acquire(k)
    lim.release(second)


def test_keys_do_not_share_limits_and_no_limit_means_none() -> None:
    lim, _ = limiter()
    lim.acquire(KeyLimits("a", rpm=1))
    lim.acquire(KeyLimits("b", rpm=1))
    for _ in range(100):
        lim.acquire(KeyLimits("c"))
