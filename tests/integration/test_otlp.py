"""OpenTelemetry export end to end: the real `blazar serve` with the real llama-server and Gemma 3 270M, driven by the
official `openai` SDK, exporting to a real OTLP/HTTP receiver on 127.0.0.1 (protobuf decoded with
opentelemetry-proto): the span tree, the GenAI attributes, the trace id rules (x-blazar-trace-id, traceparent),
spans agreeing with the log, no text content, the counters in /metrics; /metrics' families exported as OTLP metrics
with the values /metrics shows, and their last values at stop; and a collector that hangs costing requests
nothing."""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx2
import openai
import pytest

from blazar import config as settings
from tests.conftest import Cli
from tests.support import cli_zygote
from tests.support.blazar_home import read_events
from tests.support.daemon import free_port, healthy, start_serve, wait_for
from tests.support.homes import configure_all, model_home
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.serving import serving_gemma, stop_daemon
from tests.unit.projections.test_metrics import parse

MODEL = "gemma"
CHILDREN = {"blazar.prefill", "blazar.decode"}
PROMPT = "Describe the quokka-zebra-7731 in one line."


class Served:
    def __init__(self, home: Path, port: int, receiver: OtlpReceiver) -> None:
        self.home, self.port, self.receiver = home, port, receiver
        self.base = f"http://127.0.0.1:{port}"

    def client(self, **headers: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key="unused", max_retries=0, timeout=120,
                             default_headers=headers)

    def scrape(self) -> str:
        return httpx2.get(f"{self.base}/metrics", timeout=10, trust_env=False).text

    def metric(self, name: str) -> float:
        text = self.scrape()
        line = next(ln for ln in text.splitlines() if ln.startswith(name + " "))
        return float(line.split()[1])

    def events(self, trace_id: str) -> list[dict]:
        def ended() -> list[dict] | None:
            evs = [e for e in read_events(self.home) if e["trace_id"] == trace_id]
            ends = ("request.completed", "request.failed", "request.rejected")
            return evs if evs and evs[-1]["type"] in ends else None

        return wait_for(ended, f"the end of {trace_id} in the log", timeout=30)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path) -> Iterator[Served]:
    receiver = OtlpReceiver()
    home = tmp_path_factory.mktemp("otlp-home")
    # A bare host: /v1/traces (and /v1/metrics) is added. The header goes with every export. Metrics every 0.5 s.
    settings = {"ctx": 1024, "slots": 2, "otlp_endpoint": receiver.url, "otlp_headers": "x-team=ml",
                "telemetry.otlp_metrics_interval_s": 0.5}
    try:
        with serving_gemma(home, engine_binary, gemma_path, MODEL, settings) as (port, _proc):
            yield Served(home, port, receiver)
    finally:
        receiver.close()


def by_name(spans: list[dict]) -> dict[str, dict]:
    return {s["name"].split(" ")[0]: s for s in spans}


def has_tree(*names: str):
    return lambda spans: {s["name"].split(" ")[0] for s in spans} >= {*names}


def test_a_streamed_chat_is_one_server_span_with_its_children_and_genai_attributes(served: Served) -> None:
    trace = secrets.token_hex(16)
    stream = served.client(**{"x-blazar-trace-id": trace}).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=8, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None
    spans = served.receiver.wait_spans(has_tree("chat", *CHILDREN), trace)
    named = by_name(spans)
    root = named["chat"]
    assert root["name"] == f"chat {MODEL}" and root["kind"] == "server" and root["parent_span_id"] is None
    assert root["status"] == "unset"
    for s in spans:
        if s is not root:
            assert s["parent_span_id"] == root["span_id"] and s["kind"] == "internal"
            assert root["start_ns"] <= s["start_ns"] <= s["end_ns"] <= root["end_ns"]
    a = root["attributes"]
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == MODEL
    assert a["gen_ai.response.model"] == MODEL and a["gen_ai.request.max_tokens"] == 8
    assert a["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    assert a["gen_ai.usage.output_tokens"] == usage.completion_tokens
    assert a["blazar.dialect"] == "openai" and a["blazar.status"] == 200 and a["blazar.trace_id"] == trace
    assert a["blazar.admission.decision"] in ("admitted", "queued") and a["blazar.instance_id"]
    assert root["resource"]["service.name"] == "blazar" and root["scope"] == "blazar"
    assert served.receiver.trace_paths()[0] == "/v1/traces" and served.receiver.headers[0]["x-team"] == "ml"

    # The spans are the log's events: the same instants, the same decisions.
    events = {e["type"]: e for e in served.events(trace)}
    assert root["start_ns"] == round(events["request.received"]["ts"] * 1e9)
    assert root["end_ns"] == round(events["request.completed"]["ts"] * 1e9)
    assert named["blazar.decode"]["start_ns"] == round(events["request.first_token"]["ts"] * 1e9)
    assert a["blazar.instance_id"] == events["request.routed"]["data"]["instance_id"]
    if events["request.routed"]["data"]["cold"]:  # the first request of the module loaded the model
        assert named["blazar.load"]["attributes"]["blazar.load_ms"] == events["request.routed"]["data"]["load_ms"]


def test_no_prompt_or_completion_text_is_exported(served: Served) -> None:
    trace = secrets.token_hex(16)
    chat = served.client(**{"x-blazar-trace-id": trace}).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=8)
    served.receiver.wait_spans(has_tree("chat", *CHILDREN), trace)
    words = [w for w in (chat.choices[0].message.content or "").split() if len(w) >= 6]
    bodies = b"".join(served.receiver.bodies)
    assert b"quokka-zebra-7731" not in bodies
    assert not [w for w in words if w.encode() in bodies]


def test_a_traceparent_makes_the_request_span_a_child_in_the_clients_trace(served: Served) -> None:
    w3c_trace, parent = secrets.token_hex(16), secrets.token_hex(8)
    mine = secrets.token_hex(16)
    raw = served.client(traceparent=f"00-{w3c_trace}-{parent}-01", **{"x-blazar-trace-id": mine}) \
        .completions.with_raw_response.create(model=MODEL, prompt="Once upon a time", max_tokens=4)
    # The traceparent's trace id wins: it is the request's trace id, in the response and in the log.
    assert raw.headers["x-blazar-trace-id"] == w3c_trace
    spans = served.receiver.wait_spans(has_tree("text_completion", *CHILDREN), w3c_trace)
    root = by_name(spans)["text_completion"]
    assert root["parent_span_id"] == parent and {s["trace_id"] for s in spans} == {w3c_trace}
    assert root["attributes"]["blazar.trace_id"] == w3c_trace
    assert root["attributes"]["blazar.client_trace_id"] == mine
    received = served.events(w3c_trace)[0]["data"]
    assert (received["parent_trace_id"], received["parent_span_id"], received["client_trace_id"]) == \
        (w3c_trace, parent, mine)


def test_a_refusal_is_an_error_span_with_its_reason(served: Served) -> None:
    trace = secrets.token_hex(16)
    with pytest.raises(openai.NotFoundError):
        served.client(**{"x-blazar-trace-id": trace}).chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    (root,) = served.receiver.wait_spans(lambda spans: len(spans) == 1, trace)
    assert root["status"] == "error" and "model_not_found" in root["status_message"]
    assert root["attributes"]["blazar.refusal.reason"] == "model_not_found"
    assert root["attributes"]["blazar.status"] == 404 and root["attributes"]["blazar.admission.decision"] == \
        "rejected"


def test_the_export_counters_are_in_metrics(served: Served) -> None:
    wait_for(lambda: served.metric("blazar_otlp_spans_exported_total") > 0, "exported spans", timeout=30)
    assert served.metric("blazar_otlp_spans_dropped_total") == 0
    assert served.metric("blazar_otlp_spans_failed_total") == 0


_OTLP_TYPES = {"counter": "sum", "gauge": "gauge", "histogram": "histogram"}


def _points(metric: dict) -> dict[frozenset, float]:
    return {frozenset(p["attributes"].items()): p.get("value", p.get("count")) for p in metric["points"]}


def test_the_metrics_families_reach_the_collector_with_the_values_metrics_shows(served: Served) -> None:
    chat = served.client().chat.completions.create(model=MODEL, max_tokens=4,
                                                   messages=[{"role": "user", "content": "Say hi"}])
    assert chat.choices[0].message.role == "assistant"

    def agreed() -> tuple[dict, dict] | None:
        """/metrics and the last export, once they show the same requests and the same families with values (the
        export comes every 0.5 s: the next one after the request has it)."""
        export, text = served.receiver.last_metrics(), parse(served.scrape())
        if export is None or "blazar_requests_total" not in export:
            return None
        requests = {frozenset(labels.items()): v for _, labels, v in text["blazar_requests_total"]["samples"]}
        sampled = {n for n, f in text.items() if f["samples"]}
        return (export, text) if _points(export["blazar_requests_total"]) == requests and set(export) == sampled \
            else None

    export, text = wait_for(agreed, "an OTLP metrics export agreeing with /metrics", timeout=30)
    ok = frozenset({"model": MODEL, "status": "200", "dialect": "openai"}.items())
    assert _points(export["blazar_requests_total"])[ok] >= 1
    for name, metric in export.items():
        assert metric["type"] == _OTLP_TYPES[text[name]["type"]], name
        assert metric["resource"]["service.name"] == "blazar" and metric["scope"] == "blazar"
    requests = export["blazar_requests_total"]
    assert requests["monotonic"] and requests["temporality"] == 2  # cumulative, as /metrics
    (ttft,) = [p for p in export["blazar_ttft_seconds"]["points"] if p["attributes"] == {"model": MODEL}]
    assert ttft["explicit_bounds"] and len(ttft["bucket_counts"]) == len(ttft["explicit_bounds"]) + 1
    assert sum(ttft["bucket_counts"]) == ttft["count"] >= 1
    sent = [h for p, h in zip(served.receiver.paths, served.receiver.headers, strict=False) if p == "/v1/metrics"]
    assert sent and all(h["x-team"] == "ml" for h in sent)
    assert served.metric("blazar_otlp_metric_exports_total") >= 1  # /metrics counts the export it feeds
    assert served.metric("blazar_otlp_metric_exports_failed_total") == 0


def test_a_collector_that_hangs_slows_and_fails_no_request(tmp_path: Path, engine_binary: Path,
                                                            gemma_path: Path) -> None:
    hanging = OtlpReceiver(hang=True)
    try:
        with serving_gemma(tmp_path / "home", engine_binary, gemma_path, MODEL,
                           {"ctx": 1024, "slots": 2, "otlp_endpoint": f"{hanging.url}/v1/traces"}) as (port, proc):
            served = Served(tmp_path / "home", port, hanging)
            client = served.client()
            for i in range(6):
                chat = client.chat.completions.create(model=MODEL, max_tokens=4,
                                                      messages=[{"role": "user", "content": f"Count to {i}"}])
                assert chat.choices[0].finish_reason in ("stop", "length")
            wait_for(lambda: hanging.requests > 0, "an export reaching the hanging collector", timeout=30)
            # The export hangs, the requests went on; once it times out, its spans count as failed.
            assert served.metric("blazar_otlp_spans_exported_total") == 0
            wait_for(lambda: served.metric("blazar_otlp_spans_failed_total") > 0, "a failed export", timeout=60)
            chat = client.chat.completions.create(model=MODEL, max_tokens=4,
                                                  messages=[{"role": "user", "content": "One more"}])
            assert chat.choices[0].message.role == "assistant"
            stop_daemon(proc)
            assert proc.returncode == 0  # a clean stop, the hanging export left behind
    finally:
        hanging.close()


@contextlib.contextmanager
def serving_with_env(home: Path, engine_binary: Path, gemma_path: Path,
                     env: dict[str, str]) -> Iterator[tuple[int, subprocess.Popen[bytes] | cli_zygote.Process]]:
    """serving_gemma, with the export named by the daemon's environment instead of its config."""
    model_home(home, engine_binary, gemma_path, MODEL)
    configure_all(home, {"ctx": 1024})
    port = free_port()
    log = home.parent / f"{home.name}-daemon.log"
    proc = start_serve(home, "--port", str(port), log=log, env=env)
    try:
        try:
            wait_for(lambda: healthy(port), "/health", proc=proc)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{log.read_text(errors='replace')[-8000:]}") from None
        yield port, proc
    finally:
        if proc.poll() is None:
            stop_daemon(proc)


def test_the_last_requests_spans_leave_when_the_daemon_stops(tmp_path: Path, engine_binary: Path,
                                                             gemma_path: Path) -> None:
    receiver = OtlpReceiver()
    home = tmp_path / "home"
    try:
        with serving_with_env(home, engine_binary, gemma_path,
                              {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}) as (port, proc):
            trace = secrets.token_hex(16)
            Served(home, port, receiver).client(**{"x-blazar-trace-id": trace}).embeddings.create(
                model=MODEL, input="a short text")
            stop_daemon(proc)  # at once: the spans may still be queued (the export sends once a second)
            assert proc.returncode == 0
        named = by_name(receiver.trace(trace))
        assert set(named) == {"embeddings", "blazar.load", "blazar.prefill"}  # the first request: a cold load
        assert named["embeddings"]["attributes"]["gen_ai.operation.name"] == "embeddings"
        assert receiver.trace_paths()[-1] == "/v1/traces"  # the environment's base got the signal's path
        # Metrics go every 60 s by default: the one export is the last values, sent at stop, the request in them.
        assert receiver.paths.count("/v1/metrics") == 1
        last = receiver.last_metrics()
        assert last is not None and _points(last["blazar_requests_total"]) == \
            {frozenset({"model": MODEL, "status": "200", "dialect": "openai"}.items()): 1}
    finally:
        receiver.close()


def test_the_otlp_keys_through_the_cli(cli: Cli) -> None:
    parsed = tomllib.loads(cli("config", "defaults").stdout)  # all of it is valid TOML, a [table] per section
    assert parsed["telemetry"]["otlp_headers"] == {} and settings.flatten(parsed) == settings.defaults()
    cli("config", "set", "telemetry.otlp_headers", "x-team=ml, x-env=dev")
    assert cli("config", "get", "telemetry.otlp_headers", "--json").json()["value"] == {"x-team": "ml", "x-env": "dev"}
    bad = cli("config", "set", "telemetry.otlp_endpoint", "localhost:4318", check=False)
    assert bad.code == 2 and "http(s)://host[:port][/path]" in bad.stderr
    bad = cli("config", "set", "telemetry.otlp_headers", "x-team", check=False)
    assert bad.code == 2 and "name=value" in bad.stderr
