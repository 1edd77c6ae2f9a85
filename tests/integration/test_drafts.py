"""`blazar drafts MODEL` end to end: the store's models that share MODEL's tokenizer and are smaller, by the gain the
tuning events recorded for them (then size), the others with why they cannot draft; a draft with no room beside the
model is shown as such; an unknown model is a one-line error."""

from __future__ import annotations

import asyncio

import pytest

from blazar.bootstrap import bootstrap
from blazar.events.tuning import BenchRecorded, Machine, Posture, WorkloadResult
from blazar.instances import planning
from blazar.paths import Paths
from blazar.tuning.drafts import draft_report
from tests.conftest import Cli
from tests.support.fit_models import MiB, host_for_budget
from tests.support.gguf_factory import write_plain

MACHINE = Machine(fingerprint="f" * 16, cpu="cpu", cores=2, memory_bytes=1 << 30)


def _bench(bench_id: str, posture: Posture, tps: float) -> BenchRecorded:
    result = WorkloadResult(workload="code", concurrency=1, requests=1, prompt_tokens=10, completion_tokens=20,
                            prefill_tps=100.0, decode_tps_stream=tps, decode_tps_system=tps, ttft_ms_p50=5.0,
                            ttft_ms_p95=6.0)
    return BenchRecorded(bench_id=bench_id, model="big", posture=posture, engine_tag="build-1", machine=MACHINE,
                         ctx=4096, results=[result], duration_s=1.0, purpose="tune")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Cli:
    """One store for the module: the tests only read it."""
    tmp_path = tmp_path_factory.mktemp("drafts")
    (tmp_path / "home").mkdir()
    cli = Cli(tmp_path / "home")
    shapes = {"big": {"blocks": 6}, "small": {"blocks": 1, "seed": 1}, "mid": {"blocks": 3, "seed": 2},
              "other-vocab": {"blocks": 1, "vocab": 48}, "larger": {"blocks": 8}}
    for name, shape in shapes.items():
        path = tmp_path / f"{name}.gguf"
        write_plain(path, **shape)
        cli("import", str(path), "--name", name)

    async def tuned() -> None:  # what `blazar tune big` records: the defaults, then the posture with a draft
        app = await bootstrap(paths=Paths.from_env({"BLAZAR_HOME": str(cli.home)}), actor="test:pytest")
        try:
            await app.record(_bench("base", Posture(), 50.0))
            await app.record(_bench("with-small", Posture(spec_type="draft-simple", draft_model="small"), 60.0))
        finally:
            await app.close()

    asyncio.run(tuned())
    return cli


def test_drafts_lists_same_tokenizer_smaller_models_by_gain_then_size(store: Cli) -> None:
    report = store("drafts", "big", "--json").json()
    assert report["model"] == "big"
    assert [d["name"] for d in report["drafts"]] == ["small", "mid"]  # measured first, then by size
    small, mid = report["drafts"]
    assert small["fits_beside"] is True and small["gain"]["ratio"] == pytest.approx(1.2)
    assert small["gain"]["bench_id"] == "with-small" and small["gain"]["engine_tag"] == "build-1"
    assert mid["gain"] is None and mid["bytes"] > small["bytes"]
    assert report["others"] == {"other-vocab": "another tokenizer", "larger": "larger than the model"}
    text = store("drafts", "big").stdout
    lines = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    assert "1.20x decode (code 1.20x; engine build-1)" in lines["small"] and "yes" in lines["small"]
    assert "not measured" in lines["mid"]
    assert "not a draft: larger (larger than the model)" in text


def test_a_draft_without_room_beside_the_model_says_so(store: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    # Room for one of these tiny models (each is charged the engine's fixed 64 MiB), not for two.
    monkeypatch.setattr(planning, "devices_now", lambda: [host_for_budget(100 * MiB)])

    async def report() -> object:
        app = await bootstrap(paths=Paths.from_env({"BLAZAR_HOME": str(store.home)}), actor="test:pytest")
        try:
            return await draft_report(app, "big")
        finally:
            await app.close()

    got = asyncio.run(report())
    small = next(d for d in got.drafts if d.name == "small")
    assert small.fits_beside is False and "host has" in small.fit_detail and "small needs" in small.fit_detail


def test_drafts_of_an_unknown_model_is_a_one_line_error(cli: Cli) -> None:
    res = cli("drafts", "nope", check=False)
    assert res.code != 0 and res.stderr.strip().count("\n") == 0 and "no model named 'nope'" in res.stderr
