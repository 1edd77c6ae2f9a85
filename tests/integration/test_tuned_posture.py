"""Loads run at the adopted profile, end to end: a profile.adopted for the demo model on the active engine build makes
its next load carry the posture's flags (n-gram speculation, a q8_0 KV cache, flash attention, one thread), and
`blazar ps`, `blazar show` and `blazar why` say which posture the instance runs and which profile chose it; a profile
measured on another engine build is stale (shown, not applied); a profile.reset returns the next load to the
defaults. The real llama-server and Gemma 3 270M, through the official openai SDK."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from blazar.adapters.machine import this_machine
from blazar.bootstrap import bootstrap
from blazar.cli.daemon_client import tell_daemon
from blazar.events import Event
from blazar.events.tuning import Posture, ProfileAdopted, ProfileReset
from blazar.paths import Paths
from blazar.queries.engines import active_tag
from tests.support.blazar_home import read_events
from tests.support.daemon import wait_for
from tests.support.serving import blazar_cli, serving_gemma

MODEL = "gemma"
TUNED = Posture(spec_type="ngram-simple", cache_type_k="q8_0", cache_type_v="q8_0", flash_attn=True, threads=1)
MACHINE = this_machine()  # a profile applies only on the machine it was measured on


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path,
           gemma_path: Path) -> Iterator[tuple[Path, int]]:
    home = tmp_path_factory.mktemp("tuned-home")
    with serving_gemma(home, engine_binary, gemma_path, MODEL, {"ctx": 1024, "slots": 1}) as (port, _):
        yield home, port


def record(home: Path, make: Any) -> tuple[int, str]:
    """Record the event `make(active engine tag)` gives into `home`'s log, as `blazar tune` would, and tell the daemon;
    returns its seq and the active tag."""
    paths = Paths.from_env({"BLAZAR_HOME": str(home)})

    async def go() -> tuple[int, str]:
        app = await bootstrap(paths=paths, actor="test:tune")
        try:
            tag = active_tag(app)
            assert tag is not None
            ev: Event = make(tag)
            (rec,) = await app.record(ev)
            return rec.seq, tag
        finally:
            await app.close()

    got = asyncio.run(go())
    tell_daemon(paths)
    return got


def ask(port: int) -> str:
    """One chat request through the openai SDK (loading the model when it is not loaded); its trace id."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "def add(a, b):\n    return a + b\n"}], max_tokens=8)
    chat = raw.parse()
    assert chat.usage is not None and chat.usage.completion_tokens > 0
    return raw.headers["x-blazar-trace-id"]


def cli_json(home: Path, *args: str) -> Any:
    return json.loads(blazar_cli(home, *args, "--json").stdout)


def last_start(home: Path) -> dict[str, Any]:
    data: dict[str, Any] = read_events(home, "instance.starting")[-1]["data"]
    return data


def flag(argv: list[str], *names: str) -> str | None:
    """The value after the first of `names` in `argv`, or None when none is there."""
    for i, a in enumerate(argv[:-1]):
        if a in names:
            return argv[i + 1]
    return None


def why_posture(home: Path, trace: str) -> dict[str, Any]:
    def done() -> bool:
        return any(e["trace_id"] == trace for e in read_events(home, "request.completed"))

    wait_for(done, f"request.completed of {trace}", timeout=20)  # request events are group-committed
    got: dict[str, Any] = cli_json(home, "why", trace)["posture"]
    return got


def reload(home: Path, port: int) -> str:
    """Stop the model, so the next request loads it again (a profile applies from the next load)."""
    blazar_cli(home, "stop", MODEL)
    return ask(port)


def test_loads_run_at_the_adopted_profile_and_say_so_and_a_stale_or_reset_one_is_not_applied(
        served: tuple[Path, int]) -> None:
    home, port = served
    seq, tag = record(home, lambda t: ProfileAdopted(model=MODEL, posture=TUNED, engine_tag=t, machine=MACHINE,
                                                   rule="code decode 1.4x the defaults' (test)", bench_id="bench-1"))
    whole = cli_json(home, "show", MODEL)
    shown = whole["profile"]
    assert (shown["status"], shown["profile"]["seq"], shown["profile"]["posture"]) == ("applied", seq, TUNED.label())
    assert (whole["fit"]["cache_type_k"], whole["fit"]["cache_type_v"]) == ("q8_0", "q8_0")  # the fit a load makes
    assert shown["active_engine_tag"] == tag and "rule: code decode 1.4x" in shown["summary"]

    # Applied: the argv carries the posture's flags, and ps, why and the live instance say which profile chose it.
    trace = ask(port)
    start = last_start(home)
    argv = start["argv"]
    assert flag(argv, "--spec-type") == "ngram-simple"
    assert flag(argv, "-ctk", "--cache-type-k") == "q8_0" and flag(argv, "-ctv", "--cache-type-v") == "q8_0"
    assert flag(argv, "-fa", "--flash-attn") in ("on", "1", "true") and flag(argv, "-t", "--threads") == "1"
    assert start["posture"] == TUNED.model_dump(mode="json") and start["profile_seq"] == seq
    (row,) = cli_json(home, "ps")["instances"]
    assert (row["posture"], row["profile_seq"]) == (TUNED.label(), seq)
    assert f"{TUNED.label()} (profile {seq})" in " ".join(blazar_cli(home, "ps").stdout.split())
    said = why_posture(home, trace)
    assert (said["posture"], said["profile_seq"]) == (TUNED.label(), seq)
    assert f"chosen by profile.adopted seq {seq}" in blazar_cli(home, "why", trace).stdout

    # Stale: measured on another engine build, it is shown and passed by; the load goes at the defaults.
    stale_seq, _ = record(home, lambda t: ProfileAdopted(model=MODEL, posture=TUNED, engine_tag=f"{t}-older",
                                                         machine=MACHINE, rule="an older build's"))
    shown = cli_json(home, "show", MODEL)["profile"]
    assert shown["status"] == "stale" and shown["stale"] == f"measured on engine {tag}-older, active is {tag}"
    assert "run blazar tune gemma again" in " ".join(blazar_cli(home, "show", MODEL).stdout.split())
    trace = reload(home, port)
    start = last_start(home)
    assert flag(start["argv"], "--spec-type") is None and flag(start["argv"], "-t", "--threads") is None
    assert (start["posture"], start["profile_seq"], start["profile_stale_seq"]) == (None, None, stale_seq)
    (row,) = cli_json(home, "ps")["instances"]
    assert (row["posture"], row["profile_stale_seq"]) == ("defaults", stale_seq)
    assert why_posture(home, trace)["profile_stale_seq"] == stale_seq

    # Reset: an applicable profile adopted again, then reset: the next load is at the defaults, no profile named.
    record(home, lambda t: ProfileAdopted(model=MODEL, posture=TUNED, engine_tag=t, machine=MACHINE, rule="again"))
    reset_seq, _ = record(home, lambda t: ProfileReset(model=MODEL, reason="tune --reset"))
    shown = cli_json(home, "show", MODEL)["profile"]
    assert (shown["status"], shown["profile"], shown["reset"]["seq"]) == ("none", None, reset_seq)
    reload(home, port)
    start = last_start(home)
    assert flag(start["argv"], "--spec-type") is None
    assert (start["posture"], start["profile_seq"], start["profile_stale_seq"]) == (None, None, None)


def test_a_posture_the_engine_cannot_run_refuses_the_load_naming_the_flag(served: tuple[Path, int]) -> None:
    home, port = served
    blazar_cli(home, "stop", MODEL, check=False)  # whatever the test before left loaded
    record(home, lambda t: ProfileAdopted(model=MODEL, posture=Posture(spec_type="ngram-nonesuch"), engine_tag=t,
                                          machine=MACHINE, rule="a type this build does not list"))
    try:
        with pytest.raises(openai.APIStatusError) as caught:
            ask(port)
        assert caught.value.status_code == 503 and "--spec-type ngram-nonesuch" in caught.value.message
        refused = read_events(home, "instance.load_refused")[-1]["data"]
        assert refused["reason"] == "engine_incompatible" and "--spec-type ngram-nonesuch" in refused["detail"]
        assert "ngram-simple" in refused["detail"]  # what this build offers instead
    finally:
        record(home, lambda t: ProfileReset(model=MODEL))
    ask(port)  # reset: loads again, at the defaults
    assert last_start(home)["posture"] is None
