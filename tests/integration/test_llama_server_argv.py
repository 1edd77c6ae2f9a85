"""The argv built from a probe of the real llama-server starts it on the real Gemma at the planned context."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from blazar.adapters.engines.llama_server import build_argv, probe
from blazar.adapters.gguf_inspect import inspect_gguf
from blazar.fit.devices import Device
from blazar.fit.planner import FitRequest, plan

HEALTH_TIMEOUT_S = 60
STOP_TIMEOUT_S = 10
GiB = 1 << 30


def _engine() -> Path:
    explicit = os.environ.get("BLAZAR_TEST_ENGINE")
    if explicit:
        if not Path(explicit).is_file():
            pytest.fail(f"BLAZAR_TEST_ENGINE={explicit}: no such file")
        return Path(explicit)
    default = Path.home() / ".cache" / "blazar-dev" / "llama-server-avx2"
    if not default.is_file():
        pytest.skip(f"no llama-server binary: set BLAZAR_TEST_ENGINE or build one at {default}")
    return default


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(STOP_TIMEOUT_S)
    if proc.poll() is None:
        proc.kill()
        proc.wait(STOP_TIMEOUT_S)


def test_the_real_engine_starts_at_the_planned_context(gemma_path: Path, tmp_path: Path) -> None:
    engine = _engine()
    version, caps = probe(engine)
    assert version.version and caps.has("--ctx-size")
    host = Device(kind="host", name="host", total_bytes=64 * GiB, free_bytes=64 * GiB)
    p = plan(inspect_gguf(gemma_path), [host], FitRequest(ctx=2048, slots=1, gpu_layers=0))
    assert p.fits and p.engine_ctx == 2048
    port = _free_port()
    argv = build_argv(engine, gemma_path, p, caps, port=port, threads=2)
    log_path = tmp_path / "engine.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while True:
            assert proc.poll() is None, f"engine exited {proc.returncode}:\n{log_path.read_text()[-3000:]}"
            with contextlib.suppress(OSError):
                if _get(port, "/health")[0] == 200:
                    break
            assert time.monotonic() < deadline, f"no /health in {HEALTH_TIMEOUT_S} s:\n{log_path.read_text()[-3000:]}"
            time.sleep(0.2)
        status, body = _get(port, "/props")
        assert status == 200
        assert json.loads(body)["default_generation_settings"]["n_ctx"] == p.ctx_per_slot
        status, body = _get(port, "/slots")
        assert status == 200 and [s["n_ctx"] for s in json.loads(body)] == [p.ctx_per_slot]
    finally:
        _stop(proc)
    assert "buffer size =" in log_path.read_text()  # -lv 4 made the engine log what calibration reads
