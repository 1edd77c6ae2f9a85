"""Compute and output buffers against what llama-server logged for gemma-3-270m (build 11434, CPU backend)."""

from __future__ import annotations

import pytest

from blazar.fit.kv import layer_geometry
from blazar.fit.layout import Shape, price
from tests.support.fit_models import GiB, MiB, gemma3_270m, host

# (-c, -np, --kv-unified, -ub, cache type, flash attention, --swa-full, "CPU compute buffer size" in MiB)
GEMMA_COMPUTE_MEASURED = [
    (4096, 1, False, 512, "f16", True, False, 23.28),
    (8192, 1, False, 512, "f16", True, False, 27.28),
    (16384, 1, False, 512, "f16", True, False, 35.28),
    (32768, 1, False, 512, "f16", True, False, 51.28),
    (8192, 1, False, 256, "f16", True, False, 13.51),
    (8192, 1, False, 1024, "f16", True, False, 55.55),
    (8192, 2, False, 512, "f16", True, False, 23.28),
    (8192, 4, False, 512, "f16", True, False, 21.28),
    (8192, 4, True, 512, "f16", True, False, 28.78),
    (4096, 3, False, 512, "f16", True, False, 20.82),
    (8192, 1, False, 512, "q8_0", True, False, 27.81),
    (8192, 1, False, 512, "f16", True, True, 34.28),
    (1000, 4, True, 512, "f16", True, False, 20.28),
    (300, 4, True, 512, "f16", True, False, 11.30),
    (8192, 1, False, 512, "f16", False, False, 94.27),
    (16384, 1, False, 512, "f16", False, False, 174.27),
    (8192, 1, False, 1024, "f16", False, False, 190.54),
    (8192, 4, False, 512, "f16", False, False, 34.27),
    (8192, 4, True, 512, "f16", False, False, 97.27),
]


@pytest.mark.parametrize(("c", "np_", "unified", "ub", "ct", "fa", "swa_full", "mib"), GEMMA_COMPUTE_MEASURED)
def test_compute_estimate_covers_the_measurement_closely(
    c: int, np_: int, unified: bool, ub: int, ct: str, fa: bool, swa_full: bool, mib: float
) -> None:
    meta = gemma3_270m()
    geom = layer_geometry(meta)
    assert geom is not None
    (h,), _ = price(meta, geom, [host(64 * GiB)], Shape(c, np_, ct, ct, 0, ub, 2048, unified, fa, swa_full))
    measured = mib * MiB
    assert measured <= h.compute_bytes <= measured + max(16 * MiB, 0.1 * measured)  # never low, and close


@pytest.mark.parametrize("np_", [1, 2, 3, 4])
def test_output_buffer_is_vocab_floats_per_slot(np_: int) -> None:
    meta = gemma3_270m()
    geom = layer_geometry(meta)
    assert geom is not None
    (h,), _ = price(meta, geom, [host(64 * GiB)], Shape(4096, np_, "f16", "f16", 0))
    assert h.output_bytes == np_ * 262144 * 4  # measured: "CPU  output buffer size = N.00 MiB" for -np N


def test_embedding_models_size_outputs_by_batch_and_add_embeddings() -> None:
    meta = gemma3_270m().model_copy(update={"embedding_model": True})
    geom = layer_geometry(meta)
    assert geom is not None
    (h,), _ = price(meta, geom, [host(64 * GiB)], Shape(4096, 1, "f16", "f16", 0, n_ubatch=512, n_batch=2048))
    assert h.output_bytes == 512 * (262144 + 640) * 4
