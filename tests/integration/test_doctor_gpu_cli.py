"""`blazar doctor` on a GPU machine, end to end: the real CLI in a subprocess whose `pynvml` is a fake H100
(tests/support/fake_pynvml), a home with the real CPU-only engine installed and a tiny GGUF preloaded: the
engine's backend warns naming `blazar engine build --cuda`, NVML's driver and CUDA are reported, and the model's plan
is weighed against the fake's free VRAM (--json; the table renders every check alike)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import Cli
from tests.support import gguf_factory

FAKE_PYNVML = Path(__file__).resolve().parents[1] / "support" / "fake_pynvml"
GIB = 1 << 30


def _doctor(cli: Cli, fake: dict, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**cli.env, "FAKE_NVML": json.dumps(fake),
           "PYTHONPATH": os.pathsep.join([str(FAKE_PYNVML), *filter(None, [cli.env.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-m", "blazar.cli.main", "doctor", *args], env=env, capture_output=True,
                          text=True, timeout=180)


def test_doctor_on_a_cuda_machine_with_a_cpu_build(cli: Cli, engine_binary: Path, tmp_path: Path) -> None:
    cli("engine", "install", "--path", str(engine_binary), timeout=120)
    gguf_factory.write_plain(tmp_path / "tiny.gguf")
    cli("import", str(tmp_path / "tiny.gguf"), "--name", "gemma")
    cli("config", "set", "engine.preload", "gemma")
    h100 = {"driver": "550.54.15", "cuda": 12040, "gpus": [{"cc": [9, 0], "total": 80 * GIB, "free": 1 * GIB}]}
    res = _doctor(cli, h100, "--json", "--quick")
    assert res.returncode == 1, res.stderr  # warnings, no failure
    checks = {c["check"]: c for c in json.loads(res.stdout)["checks"]}
    assert checks["machine.gpu"]["status"] == "ok"
    assert "NVIDIA driver 550.54.15, CUDA 12.4; cuda:0 NVIDIA H100 80GB HBM3 (sm 9.0" in checks["machine.gpu"][
        "observation"]
    backend = checks["engine.backend"]
    assert backend["status"] == "warn" and "lists no CUDA device" in backend["observation"]
    assert backend["fix"].startswith("blazar engine build --cuda")
    vram = checks["machine.vram"]  # 1 GiB free is under the GPU reserve alone: the preload cannot fit
    assert vram["status"] == "warn" and "pinned/preloaded gemma" in vram["observation"]
