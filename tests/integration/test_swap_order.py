"""The swap-aware order end to end: the real daemon and engine, two stored models from the demo GGUF and room for one
(`max_loaded_models` 1), a burst of chat requests alternating between them through the openai SDK. Every request is
answered (today a request for the other model while one serves was refused), the swaps are fewer than the model
changes in the burst, and what the events say each request waited stays within `swap_hold_s` of its turn. How many
fewer is the benchmark's (bench/swap_order.py); this checks the behaviour."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.sdk_daemons import OpenAIDaemon
from tests.support.serving import CHATML, blazar_cli, serving_gemma

A, B = "gemma-a", "gemma-b"
HOLD_S = 30.0  # long enough that the burst is served in runs, whatever the machine's speed
BURST = [A, B] * 3  # 5 model changes
PROMPT = [{"role": "user", "content": "Count: one, two,"}]


def _second_model(home: Path, gemma: Path) -> None:
    """gemma-b: the same file stored again under another name, with the template gemma-a is served with."""
    blazar_cli(home, "import", str(gemma), "--name", B)
    (home / "b-template.jinja").write_text(CHATML)
    blazar_cli(home, "model", "set", B, "--template", str(home / "b-template.jinja"))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path
           ) -> Iterator[OpenAIDaemon]:
    home = tmp_path_factory.mktemp("swap-home")
    settings = {"fit.ctx": 512, "fit.slots": 2, "fit.max_loaded_models": 1, "queue.swap_hold_s": HOLD_S,
                "queue.queue_timeout_s": 120}
    with serving_gemma(home, engine_binary, gemma_path, A, settings,
                       before_serve=lambda h: _second_model(h, gemma_path)) as (port, proc):
        yield OpenAIDaemon(home, port, proc)


async def _burst(daemon: OpenAIDaemon) -> list[tuple[str, str | None]]:
    """The burst sent at once: each answer's trace id and finish reason."""
    client = daemon.aclient()

    async def one(model: str) -> tuple[str, str | None]:
        raw = await client.chat.completions.with_raw_response.create(model=model, messages=PROMPT, max_tokens=2)
        return raw.headers["x-blazar-trace-id"], raw.parse().choices[0].finish_reason

    try:
        return await asyncio.gather(*(one(m) for m in BURST))
    finally:
        await client.close()


def test_alternating_requests_with_room_for_one_are_all_answered_with_fewer_swaps(daemon: OpenAIDaemon) -> None:
    answered = asyncio.run(_burst(daemon))
    assert len(answered) == len(BURST) and all(reason in ("length", "stop") for _, reason in answered)
    traces = [t for t, _ in answered]
    for trace in traces:
        daemon.wait_trace(trace, "request.completed")
    changes = sum(1 for x, y in itertools.pairwise(BURST) if x != y)
    evicted = [e for e in daemon.events("instance.evicted") if e["data"]["reason"] == "max_loaded_models"]
    assert 1 <= len(evicted) < changes  # each eviction is a swap; strict order would swap at every change
    mine = set(traces)
    held = [e for e in daemon.events("request.swap_held") if e["trace_id"] in mine]
    assert held and all(e["data"]["evicting"] for e in held if e["data"]["position"] == 0)
    for e in daemon.events("request.served_ahead"):
        assert e["data"]["since_turn_ms"] < HOLD_S * 1000  # served ahead only while the hold ran
    released = daemon.events("request.swap_released")
    assert released and all(e["data"]["held_ms"] <= HOLD_S * 1000 for e in released)
    why = blazar_cli(daemon.home, "why", held[0]["trace_id"]).stdout
    assert "not loaded and its room is" in why and "swap" in why
