"""`blazar tune` end to end on the real llama-server and the real Gemma 3 270M: n-gram speculation wins the
code-editing workload and is adopted with every candidate's numbers; the model drafting for itself (the same GGUF
imported a second time: the same tokenizer) is not; the guards' decisions are the real engine's; `--reset` records
profile.reset. The machine is shared and timing is noisy: the candidates are few, the requests short, and the margins
wide (n-gram speculation echoes a copied file at several times the defaults' rate; the rule asks 1.03x)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from blazar.adapters.machine import this_machine
from blazar.bootstrap import bootstrap
from blazar.context import Blazar
from blazar.events.tuning import Posture, ProfileAdopted
from blazar.paths import Paths
from blazar.projections.profiles import profile
from blazar.store.engines import active_engine
from blazar.tuning.drafts import drafts_for
from blazar.tuning.tune import _Guard, guard_prompts, tune
from tests.conftest import Cli

MODEL, DRAFT = "gemma", "gemma-twin"
NGRAM = Posture(spec_type="ngram-simple")
SELF_DRAFT = Posture(spec_type="draft-simple", draft_model=DRAFT)


async def read_events(app: Blazar, kind: str) -> list[dict[str, Any]]:
    return [rec.to_json() async for rec in app.log.read(types=[kind])]


@pytest.fixture
async def tuned_home(cli: Cli, home: Path, engine_binary: Path, gemma_path: Path) -> AsyncIterator[Blazar]:
    cli("engine", "install", "--path", str(engine_binary))
    cli("import", str(gemma_path), "--name", MODEL)
    cli("import", str(gemma_path), "--name", DRAFT)  # the same file under another name: it shares the tokenizer
    app = await bootstrap(paths=Paths.from_env({"BLAZAR_HOME": str(home)}), actor="test:pytest")
    try:
        yield app
    finally:
        await app.close()


@pytest.mark.slow(reason="three postures measured on the real engine (the defaults, n-gram, a second model drafting) "
                         "with a parity guard each: the adoption rule needs real decode rates")
async def test_tune_adopts_ngram_speculation_for_code_and_not_the_self_draft(tuned_home: Blazar, cli: Cli,
                                                                               home: Path) -> None:
    app = tuned_home
    assert await drafts_for(app, MODEL) == [(DRAFT, "")]  # the twin qualifies as a draft: same tokenizer, fits
    result = await tune(app, MODEL, budget_s=900, apply=True, workloads=("code",), max_tokens=64, requests=1,
                        postures=[NGRAM, SELF_DRAFT])
    assert result.winner == NGRAM, result.to_json()
    assert result.recorded == "profile.adopted"
    by = {v.posture: v for v in result.verdicts}
    base, ngram, twin = by[Posture()], by[NGRAM], by[SELF_DRAFT]
    assert base.outcome == "baseline" and base.decode_tps["code"] > 0
    assert ngram.outcome == "adopted" and ngram.ratio["code"] >= 1.03
    # greedy parity holds for the adopted posture, checked on the real engine by its guard
    assert ngram.guard == "passed" and ngram.guard_detail and "token-identical" in ngram.guard_detail
    assert twin.outcome in ("rejected", "pruned") and twin.reason and twin.decode_tps["code"] > 0

    [adopted] = await read_events(app, "profile.adopted")
    data = adopted["data"]
    assert data["model"] == MODEL and data["posture"]["spec_type"] == "ngram-simple"
    assert data["engine_tag"] == active_engine(app).tag and data["bench_id"] == ngram.bench_id
    assert "1.03" in data["rule"] and "0.97" in data["rule"]
    recorded = {(c["posture"]["spec_type"], c["outcome"]) for c in data["candidates"]}
    assert (None, "baseline") in recorded and ("ngram-simple", "adopted") in recorded
    assert ("draft-simple", twin.outcome) in recorded
    assert all(c["decode_tps"] for c in data["candidates"])  # every candidate with its numbers
    benches = await read_events(app, "bench.recorded")
    assert benches and all(b["data"]["purpose"] == "tune" for b in benches)
    assert ngram.bench_id in {b["data"]["bench_id"] for b in benches}

    got = profile(app.runner.state("profiles"), MODEL)
    assert got is not None and got.posture == NGRAM

    res = cli("tune", MODEL, "--reset", "--json")
    assert res.json()["recorded"] == "profile.reset"
    [reset] = await read_events(app, "profile.reset")
    assert reset["data"]["model"] == MODEL
    await app.runner.catch_up()
    assert profile(app.runner.state("profiles"), MODEL) is None


async def test_the_guards_refuse_what_the_real_engine_changes(tuned_home: Blazar) -> None:
    """The lossless guard on the real engine: n-gram speculation keeps greedy output token-identical; the model
    drafting for itself does not (llama.cpp verifies the drafted batch in one pass: on this build the chat text's
    greedy continuation changes at its 7th token), so it is refused whatever its speed."""
    app = tuned_home
    guard = _Guard(app, MODEL, active_engine(app), guard_prompts(("chat",)))
    ok = await guard.check(NGRAM)
    assert ok.passed, ok.detail
    bad = await guard.check(SELF_DRAFT)
    assert not bad.passed and "differs from the defaults'" in bad.detail


def test_tune_refuses_bad_input(cli: Cli) -> None:
    res = cli("tune", MODEL, "--only", "gpu", check=False)
    assert res.code == 2 and "unknown --only gpu" in res.stderr
    res = cli("tune", MODEL, "--workload", "poetry", check=False)
    assert res.code == 2 and "unknown workload" in res.stderr
    res = cli("tune", "nosuch", "--budget", "1s", check=False)
    assert res.code != 0 and "nosuch" in res.stderr


async def test_tune_cli_within_a_spent_budget_measures_the_defaults_and_adopts_nothing(tuned_home: Blazar,
                                                                                        cli: Cli) -> None:
    """The budget bounds the run: past it, every candidate is reported as pruned and the defaults stay (an adopted
    profile is reset). The candidates are the build's own n-gram types and the twin as a draft."""
    app = tuned_home
    await app.record(ProfileAdopted(model=MODEL, posture=NGRAM, engine_tag=active_engine(app).tag,
                                    machine=this_machine(), rule="test: adopted before"))
    res = cli("tune", MODEL, "--only", "spec", "--workload", "code", "--max-tokens", "4", "--requests", "1",
              "--budget", "1s", "--apply", "--json", timeout=600)
    out = res.json()
    assert out["winner"] is None and out["recorded"] == "profile.reset"
    outcomes = [(c["posture"].get("spec_type"), c["outcome"]) for c in out["candidates"]]
    assert outcomes[0] == (None, "baseline")
    assert ("ngram-simple", "pruned") in outcomes and ("draft-simple", "pruned") in outcomes
    assert all("budget" in c["reason"] for c in out["candidates"][1:])
    [reset] = await read_events(app, "profile.reset")
    assert "the defaults won" in reset["data"]["reason"]
    await app.runner.catch_up()
    assert profile(app.runner.state("profiles"), MODEL) is None
    table = cli("tune", MODEL, "--only", "spec", "--workload", "code", "--max-tokens", "4", "--requests", "1",
                "--budget", "1s", timeout=600)
    assert "spec=ngram-simple" in table.stdout and "pruned" in table.stdout
    assert "the defaults won: nothing to adopt" in table.stdout
