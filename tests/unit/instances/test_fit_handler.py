"""The fit handler: plans a stored model on given devices and applies the calibration the log has recorded."""

from __future__ import annotations

from pathlib import Path

from blazar.context import Blazar
from blazar.fit import Device, FitRequest
from blazar.instances.calibration import record_measurement
from blazar.instances.planning import fit_model
from blazar.store.models import import_model
from tests.support.gguf_factory import write_gqa

HOST = [Device(kind="host", index=0, name="host", total_bytes=16 * 2**30, free_bytes=12 * 2**30)]
MIB = 2**20


async def test_fit_applies_the_recorded_calibration_to_the_next_estimate(app: Blazar, tmp_path: Path) -> None:
    src = tmp_path / "tiny.gguf"
    write_gqa(src)
    await import_model(app, src, "tiny")
    request = FitRequest(ctx=1024, slots=1)
    before = await fit_model(app, "tiny", request, HOST)
    assert before.fits and before.correction_bytes == 0 and before.model == "tiny"
    log_text = "\n".join([
        f"load_tensors:   CPU_Mapped model buffer size = {before.estimate_bytes / MIB + 100:.2f} MiB",
        "llama_kv_cache:        CPU KV buffer size =     1.00 MiB",
    ])
    rec = await record_measurement(app, model="tiny", ctx_tokens=before.ctx_per_slot, slots=before.slots,
                                   cache_type_k=before.cache_type_k, cache_type_v=before.cache_type_v,
                                   planned_bytes=before.estimate_bytes, log_text=log_text, rss_bytes=None)
    measured = rec.event.measured_bytes
    after = await fit_model(app, "tiny", request, HOST)
    assert after.correction_bytes == measured - before.estimate_bytes > 0
    assert after.total_bytes == before.total_bytes + after.correction_bytes
    assert after.estimate_bytes == before.estimate_bytes  # the uncorrected estimate stays what calibration compares


async def test_fit_of_a_store_model_needs_no_network(app: Blazar, tmp_path: Path) -> None:
    src = tmp_path / "tiny.gguf"
    write_gqa(src)
    await import_model(app, src, "tiny:q4")
    app.env = {"HF_ENDPOINT": "http://127.0.0.1:9"}  # a dead endpoint: any hub call would fail
    p = await fit_model(app, "tiny:q4", FitRequest(ctx=512), HOST)
    assert p.fits and p.ctx_per_slot == 512
