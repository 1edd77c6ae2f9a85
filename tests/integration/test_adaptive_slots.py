"""Slots that follow the load, end to end: `blazar serve` with the real llama-server and Gemma 3 270M loaded at one
slot, adaptive slots on with a short look (fit.adaptive_tick_s). Eight concurrent requests through the openai SDK
queue behind the one slot; the governor grows the instance (instance.reshape_planned with the numbers, the old one
evicted for `reshape`, a new one started with more slots at the same context per slot, instance.reshaped), and every
request completes with its whole answer. Once the burst is over the queue stays empty and it shrinks back to one
slot, its memory returned. A reshape is driven by what admission sees (requests queued behind busy slots), not by
the clock; nothing here asserts a rate, and every wait is bounded."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.blazar_home import read_events
from tests.support.daemon import wait_for
from tests.support.serving import serving_gemma

MODEL = "gemma"
BURST = 8
MAX_TOKENS = 16
SETTINGS = {"fit.ctx": 512, "fit.slots": 1, "queue.queue_depth": 32, "queue.queue_timeout_s": 300,
            "fit.adaptive_slots": "true", "fit.adaptive_tick_s": 0.05, "fit.adaptive_grow_after": 3,
            "fit.adaptive_shrink_after": 40, "fit.adaptive_slots_max": 8, "fit.adaptive_drain_s": 600}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path) -> Iterator[tuple[Path, str]]:
    home = tmp_path_factory.mktemp("slots-home")
    with serving_gemma(home, engine_binary, gemma_path, MODEL, SETTINGS) as (port, _):
        yield home, f"http://127.0.0.1:{port}"


def _of(home: Path, kind: str, **match: Any) -> list[dict[str, Any]]:
    return [e["data"] for e in read_events(home, kind) if all(e["data"].get(k) == v for k, v in match.items())]


def test_a_reshape_under_load_keeps_every_request_and_shrinks_back_when_quiet(home: tuple[Path, str]) -> None:
    path, base = home

    async def burst() -> list[Any]:
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=300)
        async with client:
            await client.completions.create(model=MODEL, prompt="Warm up", max_tokens=2)  # loaded at one slot
            # Each a different prompt (identical deterministic requests would share one generation); ignore_eos
            # (llama-server's) makes every whole answer exactly MAX_TOKENS long.
            return list(await asyncio.gather(*(client.completions.create(
                model=MODEL, prompt=f"Item {n}: the weather in town number {n} is", max_tokens=MAX_TOKENS,
                temperature=0, extra_body={"ignore_eos": True}) for n in range(BURST))))

    answers = asyncio.run(asyncio.wait_for(burst(), 300))
    assert len(answers) == BURST
    for a in answers:
        assert a.choices[0].finish_reason == "length" and a.usage.completion_tokens == MAX_TOKENS, a
        assert a.choices[0].text
    [first] = _of(path, "instance.started", reason="request")
    assert first["slots"] == 1
    [grow] = _of(path, "instance.reshape_planned", direction="grow")
    assert grow["instance_id"] == first["instance_id"] and grow["from_slots"] == 1 and grow["to_slots"] > 1
    assert grow["queued"] > 0 and grow["busy"] == 1 and grow["looks"] == 3
    assert grow["planned_bytes"] > grow["had_bytes"] and grow["ctx_tokens"] == first["ctx_tokens"]
    [evicted] = _of(path, "instance.evicted", instance_id=first["instance_id"])
    assert evicted["reason"] == "reshape"
    [grown] = _of(path, "instance.started", reason="reshape", slots=grow["to_slots"])
    assert grown["ctx_tokens"] == first["ctx_tokens"] and grown["planned_bytes"] == grow["planned_bytes"]
    [done] = _of(path, "instance.reshaped", instance_id=first["instance_id"])
    assert done["new_instance_id"] == grown["instance_id"] and done["to_slots"] == grow["to_slots"]
    assert _of(path, "request.rejected") == [] and _of(path, "request.failed") == []
    # The queue stays empty now: it shrinks back to its first shape, its memory returned.
    shrink = wait_for(lambda: next(iter(_of(path, "instance.reshaped", instance_id=grown["instance_id"])), None),
                      "the shrink back", timeout=120)
    assert shrink["to_slots"] == 1
    [back] = _of(path, "instance.started", reason="reshape", instance_id=shrink["new_instance_id"])
    assert back["slots"] == 1 and back["planned_bytes"] < grown["planned_bytes"]
    assert _of(path, "instance.reshape_refused") == []
