"""Preload and warm-on-pull end to end. On the real engine and the real Gemma 3 270M: a daemon started with an
`engine.preload` list has the model ready before any request, each entry's outcome an event in the list's order (an
unknown model and one that would evict the first are said, and the daemon serves anyway); and energy per request,
said as not measured where the machine reports no counter (this machine: no /sys/class/powercap, no GPU), in
`request.completed`, `blazar why` and `/metrics`. On the fake engine (the CLI's way to a load does not depend on the
model): `blazar import --load` starts a daemon and loads, `blazar pull --load` (from a local server speaking the hub's
file protocol) asks the running one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx2
import openai
import pytest

from blazar.adapters.energy import EnergyMeter
from blazar.adapters.engines.tiny_model import write_tiny_model
from blazar.serving.energy import EnergyLedger
from tests.conftest import Cli
from tests.support.blazar_home import read_events
from tests.support.daemon import free_port, stop_home_daemon, wait_for
from tests.support.fake_serving import fake_engine_binary
from tests.support.homes import configure_all, model_home, session_file
from tests.support.hub_server import HubServer
from tests.support.serving import blazar_cli, serving_gemma

MODEL = "gemma"
REPO = "google-test/gemma-3-270m-it-GGUF"
TINY_FILE = "tiny-Q4_K_M.gguf"


def tiny_model() -> Path:
    """The tiny GGUF the fake engine serves, made once per worker."""
    return session_file("tiny.gguf", write_tiny_model)


def _this_machine_measures() -> bool:
    """What the daemon will find: the same probe, in this process."""
    return EnergyLedger(EnergyMeter()).measuring


@pytest.fixture(scope="module")
def preloaded(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path
              ) -> Iterator[tuple[Path, int]]:
    """A daemon whose preload list names Gemma, a model not in the store, then a second model (the same file under
    another name) that only fits by evicting the first: max_loaded_models is 1."""
    home = tmp_path_factory.mktemp("preload")

    def second_model(h: Path) -> None:
        blazar_cli(h, "import", str(gemma_path), "--name", "gemma-b")

    settings = {"ctx": 512, "fit.max_loaded_models": 1, "engine.preload": f"{MODEL},nowhere,gemma-b"}
    with serving_gemma(home, engine_binary, gemma_path, MODEL, settings, before_serve=second_model) as (port, _):
        yield home, port


def test_a_daemon_started_with_a_preload_list_has_the_model_ready_before_any_request(
        preloaded: tuple[Path, int]) -> None:
    home, port = preloaded
    finished = wait_for(lambda: (e := read_events(home, "instance.preload_finished")) and len(e) == 3 and e,
                        "the preload list's three outcomes")
    got = [(e["data"]["position"], e["data"]["model"], e["data"]["outcome"], e["data"]["reason"]) for e in finished]
    # gemma-b would evict gemma: by max_loaded_models (no_room), or by memory first where the machine is short of it
    assert got[:2] == [(0, MODEL, "ready", ""), (1, "nowhere", "not_found", "model_not_found")]
    assert got[2][:3] == (2, "gemma-b", "refused") and got[2][3] in ("no_room", "insufficient_memory")
    refused = finished[2]["data"]["detail"]
    assert refused.endswith("a preload never evicts") and finished[0]["data"]["instance_id"] in refused
    # What this daemon recorded: after the settings the home was given before it started (a cloned home's own
    # history, its smoke test's instance among it, comes before those).
    everything = read_events(home)
    since = max(e["seq"] for e in everything if e["type"] == "config.changed")
    log = [e for e in everything if e["seq"] > since]
    types = [e["type"] for e in log]
    preload_id = finished[0]["data"]["instance_id"]
    started = [e["data"] for e in log if e["type"] == "instance.started"]
    assert [(d["model"], d["reason"], d["instance_id"]) for d in started] == [(MODEL, "preload", preload_id)]
    ready_at = next(i for i, e in enumerate(log) if e["type"] == "instance.ready")
    assert log[ready_at]["data"]["instance_id"] == preload_id and ready_at < types.index("instance.preload_finished")
    assert not [t for t in types if t.startswith("request.")]  # nothing was asked: the preload loaded it
    assert [e["data"]["model"] for e in log if e["type"] == "instance.load_refused"] == ["gemma-b"]
    assert "instance.evicted" not in types

    # The first request finds it warm, and says what its energy was (or that it was not measured).
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120,
                           http_client=openai.DefaultHttpxClient(trust_env=False))
    answer = client.chat.completions.with_raw_response.create(
        model=MODEL, max_tokens=4, temperature=0, messages=[{"role": "user", "content": "Hi"}])
    trace = answer.headers["x-blazar-trace-id"]
    done = wait_for(lambda: [e for e in read_events(home, "request.completed") if e["trace_id"] == trace],
                    "request.completed")[0]["data"]
    routed = next(e for e in read_events(home, "request.routed") if e["trace_id"] == trace)["data"]
    assert routed["cold"] is False and routed["instance_id"] == preload_id
    energy = done["energy"]
    why = blazar_cli(home, "why", trace).stdout
    metrics = httpx2.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    if _this_machine_measures():
        assert energy["source"] in ("rapl", "nvml", "rapl+nvml") and energy["joules"] is not None
        assert "J" in why and f'blazar_energy_requests_total{{model="{MODEL}",measured="true"}} 1' in metrics
    else:
        assert energy == {"source": "not_measured", "joules": None, "machine_joules": None, "tokens_per_joule": None,
                          "overlapped": None}
        assert "energy not measured" in why
        assert f'blazar_energy_requests_total{{model="{MODEL}",measured="false"}} 1' in metrics
        assert f'blazar_energy_joules_total{{model="{MODEL}"' not in metrics


@pytest.fixture
def stocked(tmp_path: Path) -> Iterator[Cli]:
    """A home with the fake engine (bench/fake_engine.py: what is proved here is the CLI's way to a load, not the
    model's output) and the tiny model, no daemon yet; the daemon a test starts is stopped at the end."""
    home = model_home(tmp_path / "home", fake_engine_binary(), tiny_model(), "tiny")
    configure_all(home, {"port": free_port()})
    try:
        yield Cli(home)
    finally:
        stop_home_daemon(home)


def test_import_load_starts_the_daemon_and_pull_load_asks_the_running_one(stocked: Cli) -> None:
    tiny = tiny_model()
    imported = stocked("import", str(tiny), "--name", "copy", "--load", "--json", timeout=120)
    assert "starting one in the background" in imported.stderr
    got = imported.json()
    assert got["data"]["name"] == "copy" and got["instance"]["model"] == "copy" and got["instance"]["port"] > 0
    with HubServer({REPO: {TINY_FILE: tiny}}) as hub:
        stocked.env["HF_ENDPOINT"] = hub.url
        pulled = stocked("pull", f"{REPO}/{TINY_FILE}", "--name", "pulled", "--load", timeout=120)
    assert "starting one" not in pulled.stderr  # the daemon import --load started serves it
    said = pulled.stdout
    assert "pulled is ready on port" in said and said.index("pulled") < said.index("is ready"), said
    ready = [e["data"]["model"] for e in read_events(stocked.home, "instance.ready")]
    assert ready == ["copy", "pulled"]
    ps = stocked("ps", "--json").json()
    assert {row["model"] for row in ps["instances"]} == {"copy", "pulled"}


def test_pull_load_into_another_nodes_store_is_refused_before_anything_is_asked(cli: Cli) -> None:
    res = cli("pull", "gemma3-270m", "--node", "other", "--load", check=False)
    assert res.code == 2 and "--load" in res.stderr and "blazar load" in res.stderr
