"""One model across hosts, by its decisions: the planner spilling layers to RPC workers (fewest first, llama.cpp's
device order, each worker's share named), the argv that carries the split, the lever a refusal names, the workers
projection fed events, the worker's refusals to listen where it should not, and what an RPC build installs."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path
from typing import cast

import pytest

from blazar.adapters.engines.build import RPC_OPTIONS, build_options, targets_of
from blazar.adapters.engines.llama_server import Capabilities, build_argv, parse_help
from blazar.adapters.engines.package import RPC_SERVER, from_binary
from blazar.addresses import is_loopback, is_unspecified
from blazar.errors import WorkerError
from blazar.events.instances import InstanceStarting
from blazar.events.workers import WorkerStarted, WorkerStopped
from blazar.fit.devices import gpus_of, rpc_of
from blazar.fit.planner import FitRequest, plan
from blazar.instances.budget import budget_devices, worker_bytes_needed, worker_devices
from blazar.instances.worker import run_worker
from blazar.projections.base import fold
from blazar.projections.residency import ResidencyProjection, instances
from blazar.projections.workers import WorkersProjection, workers
from tests.support.events import rec
from tests.support.fit_models import GiB, MiB, gemma3_270m, gpu, host
from tests.support.states import through_checkpoint

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "llama_server"
BIN, MODEL = Path("/opt/llama-server"), Path("/models/gemma.gguf")
W1, W2 = "127.0.0.1:50061", "127.0.0.1:50062"


def limited_host(limit_mib: int) -> list:
    """This machine's host with Blazar's memory_limit_mib at `limit_mib`: the budget a plan may spend."""
    return budget_devices([host(20 * GiB, 24 * GiB)], [], memory_limit_bytes=limit_mib * MiB)


def _value_of(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.fixture(scope="module")
def caps() -> Capabilities:
    return parse_help((FIXTURES / "help.txt").read_text())


def test_workers_come_first_in_llama_cpps_device_order() -> None:
    devices = [gpu(8 * GiB, 1), *worker_devices([(W1, GiB), (W2, GiB)]), gpu(8 * GiB, 0), host(GiB)]
    assert [d.key for d in gpus_of(devices)] == ["rpc:0", "rpc:1", "cuda:0", "cuda:1"]
    assert [d.name for d in rpc_of(devices)] == [W1, W2]


def test_a_model_too_large_for_the_host_spills_the_fewest_layers_across_both_workers() -> None:
    meta = gemma3_270m()
    budget = limited_host(300)
    alone = plan(meta, budget, FitRequest())
    assert not alone.fits
    spread = plan(meta, [*budget, *worker_devices([(W1, 300 * MiB), (W2, 300 * MiB)])], FitRequest(offload="fewest"))
    assert spread.fits and spread.ctx_per_slot >= 4096
    uses = {u.key: u for u in spread.devices}
    # Both workers hold blocks; the last one also holds the output layer (with its copy of the tied embeddings).
    assert uses["rpc:0"].layers > 0 and uses["rpc:1"].layers > 0 and uses["rpc:1"].holds_output
    assert uses["host"].layers > 0  # only what the host cannot hold went away
    assert sum(uses[k].offloaded for k in ("rpc:0", "rpc:1")) == spread.gpu_layers
    # The fewest: one layer fewer away and the host no longer fits.
    fewer = plan(meta, [*budget, *worker_devices([(W1, 300 * MiB), (W2, 300 * MiB)])],
                 FitRequest(ctx=spread.ctx_per_slot, gpu_layers=spread.gpu_layers - 1,
                            cache_type_k=spread.cache_type_k, cache_type_v=spread.cache_type_v))
    assert not fewer.fits and next(u for u in fewer.devices if u.kind == "host").free_bytes < 0
    # "most" (the GPU policy) would have sent every layer over the network.
    most = plan(meta, [*budget, *worker_devices([(W1, 300 * MiB), (W2, 300 * MiB)])], FitRequest())
    assert most.gpu_layers > spread.gpu_layers
    # The plan names each host's share.
    assert f"{W1}: {uses['rpc:0'].offloaded}" in spread.summary and W2 in spread.summary


def test_the_argv_names_the_workers_and_the_planned_split(caps: Capabilities) -> None:
    meta = gemma3_270m()
    spread = plan(meta, [*limited_host(300), *worker_devices([(W1, 300 * MiB), (W2, 300 * MiB)])],
                  FitRequest(offload="fewest"))
    argv = build_argv(BIN, MODEL, spread, caps, port=1)
    assert _value_of(argv, "--rpc") == f"{W1},{W2}"
    shares = [u.offloaded for u in spread.devices if u.kind == "rpc"]
    assert _value_of(argv, "-ts") == ",".join(map(str, shares))
    assert _value_of(argv, "-ngl") == str(sum(shares))
    # No worker in the plan: neither flag.
    local = plan(meta, [host(20 * GiB)], FitRequest())
    assert "--rpc" not in build_argv(BIN, MODEL, local, caps, port=1)


def test_a_worker_the_plan_leaves_empty_is_not_named(caps: Capabilities) -> None:
    meta = gemma3_270m()
    # The second worker is too small to hold even one layer with its fixed cost: all goes to the first.
    spread = plan(meta, [*limited_host(300), *worker_devices([(W1, 400 * MiB), (W2, 1 * MiB)])],
                  FitRequest(offload="fewest"))
    assert spread.fits
    argv = build_argv(BIN, MODEL, spread, caps, port=1)
    assert _value_of(argv, "--rpc") == W1 and _value_of(argv, "-ts") == str(spread.gpu_layers)


def test_a_refusal_names_what_workers_would_have_to_offer() -> None:
    meta = gemma3_270m()
    need = worker_bytes_needed(meta, limited_host(300), FitRequest())
    assert need is not None and 100 * MiB < need < 600 * MiB
    # Offered exactly that much by one worker, it fits.
    assert plan(meta, [*limited_host(300), *worker_devices([(W1, need)])], FitRequest(offload="fewest")).fits
    # A host that cannot even hold the input embeddings is not helped by workers.
    assert worker_bytes_needed(meta, limited_host(100), FitRequest()) is None


def test_the_workers_projection_follows_starts_crashes_and_stops() -> None:
    p = WorkersProjection()
    state = fold(p, [
        rec(1, WorkerStarted(name="w1", host="127.0.0.1", port=50061, mem_bytes=GiB, pid=10, engine_tag="t")),
        rec(2, WorkerStarted(name="w2", host="10.0.0.2", port=50052, mem_bytes=2 * GiB, pid=11, engine_tag="t",
                             network=True)),
        rec(3, WorkerStopped(name="w1", reason="crashed", exit_code=-9)),
    ])
    assert [w.name for w in workers(state, up_only=True)] == ["w2"]
    w1 = next(w for w in workers(state) if w.name == "w1")
    assert not w1.up and w1.crashes == 1 and w1.stop_reason == "crashed"
    state = fold(p, [rec(4, WorkerStarted(name="w1", host="127.0.0.1", port=50061, mem_bytes=GiB, pid=12,
                                          engine_tag="t"))], state)
    w1 = next(w for w in workers(state) if w.name == "w1")
    assert w1.up and w1.pid == 12 and w1.crashes == 1 and w1.address == "127.0.0.1:50061"
    state = fold(p, [rec(5, WorkerStopped(name="w2", reason="stopped"))], state)
    assert [w.name for w in workers(state, up_only=True)] == ["w1"]
    assert through_checkpoint(p, state) == state


def test_residency_records_the_workers_an_instance_uses() -> None:
    ev = InstanceStarting(instance_id="i1", model="m", engine_tag="t", port=1, argv=["x"], log_path="i1.log",
                          ctx_tokens=4096, engine_ctx=4096, slots=1, planned_bytes=1, estimate_bytes=1,
                          workers={W1: 6, W2: 5})
    state = fold(ResidencyProjection(), [rec(1, ev)])
    (inst,) = instances(state)
    assert inst.workers == {W1: 6, W2: 5}


@pytest.mark.parametrize(("host_", "allow", "match"), [
    ("0.0.0.0", True, "every interface"),
    ("::", True, "every interface"),
    ("192.168.1.20", False, "no authentication"),
])
def test_a_worker_refuses_to_listen_where_it_should_not(host_: str, allow: bool, match: str) -> None:
    with pytest.raises(WorkerError, match=match):
        asyncio.run(run_worker(None, host=host_, port=1, mem_bytes=GiB, name="w",  # type: ignore[arg-type]
                               stop=asyncio.Event(), allow_network=allow))


def test_address_kinds() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("10.0.0.1")
    assert is_unspecified("0.0.0.0") and is_unspecified("::") and not is_unspecified("127.0.0.1")
    assert not is_unspecified("worker.lan")


def test_an_rpc_build_makes_both_programs_and_installs_both(tmp_path: Path) -> None:
    assert targets_of(build_options(cuda=False)) == ["llama-server"]
    rpc = build_options(cuda=False, rpc=True)
    assert set(RPC_OPTIONS) <= set(rpc) and targets_of(rpc) == ["llama-server", RPC_SERVER]
    for name in ("llama-server", RPC_SERVER):
        f = tmp_path / name
        f.write_text("#!/bin/sh\n")
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    assert set(from_binary(tmp_path / "llama-server").files) == {"llama-server", RPC_SERVER}
    (tmp_path / RPC_SERVER).unlink()
    assert set(from_binary(tmp_path / "llama-server").files) == {"llama-server"}


def test_a_passed_through_stream_that_breaks_ends_with_an_error_event_in_its_routes_shape() -> None:
    import orjson

    from blazar.dialects.stream import SseEvents
    from blazar.serving.call import Call, Desk
    from blazar.serving.relay import broken_event
    from blazar.serving.request import Request

    no_desk = cast(Desk, object())
    chat = Call(Request(model="m", engine_path="/v1/chat/completions", body=None, stream=True,
                        path="/v1/chat/completions", trace_id="t"), no_desk)
    (event,) = SseEvents().feed(b'data: {"choices": [{"delta": {"content": "par' + broken_event(chat, "gone"))
    assert event["error"]["message"] == "gone" and event["error"]["code"] == "engine_crashed"
    messages = Call(Request(model="m", engine_path="/v1/messages", body=None, stream=True, path="/v1/messages",
                            trace_id="t"), no_desk)
    raw = broken_event(messages, "gone")
    assert raw.startswith(b"event: error\n")
    assert orjson.loads(raw.split(b"data: ", 1)[1])["error"] == {"type": "api_error", "message": "gone"}
