"""`blazar fit`, `blazar coreside` and the fit summary of `blazar show`, end to end through the real CLI, on the
real Gemma 3 270M, in the store and on a local hub (header only, before any download)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import Cli
from tests.support.gguf_factory import write_gqa
from tests.support.hub_server import HubServer

REPO = "google-test/gemma-3-270m-it-GGUF"
GEMMA_FILE = "gemma-3-270m-it-Q4_K_M.gguf"


@pytest.fixture
def stocked(cli: Cli, gemma_path: Path, tmp_path: Path) -> Cli:
    cli("import", str(gemma_path), "--name", "gemma")
    tiny = tmp_path / "tiny.gguf"
    write_gqa(tiny)
    cli("import", str(tiny), "--name", "tiny")
    return cli


def test_fit_plans_a_stored_model_at_its_trained_context(stocked: Cli) -> None:
    p = stocked("fit", "gemma", "--json").json()
    assert p["fits"] is True and p["model"] == "gemma" and p["architecture"] == "gemma3"
    assert p["ctx_per_slot"] == 32768 and p["slots"] == 1 and p["cache_type_k"] == "f16"
    (host,) = p["devices"]
    assert host["kind"] == "host" and 0 < host["total_bytes"] <= host["budget_bytes"]
    assert host["kv_bytes"] > 0 and host["weights_bytes"] > 200 * 2**20
    text = stocked("fit", "gemma", "--ctx", "4096", "--slots", "2").stdout
    assert "gemma fits: ctx 4096 x 2 slot(s)" in text and "largest ctx at 2 slot(s)" in text


def test_fit_refuses_with_the_reason_and_the_levers(stocked: Cli) -> None:
    res = stocked("fit", "gemma", "--ctx", "32768", "--slots", "256", "--cache-type", "f16", "--json", check=False)
    assert res.code == 6
    p = res.json()
    assert p["fits"] is False and p["refusal"]["reason"] == "over_budget"
    assert p["refusal"]["need_bytes"] > p["refusal"]["budget_bytes"]
    kinds = {lever["kind"] for lever in p["refusal"]["levers"]}
    assert {"ctx", "slots", "cache_type"} <= kinds
    human = stocked("fit", "gemma", "--ctx", "32768", "--slots", "256", "--cache-type", "f16", check=False)
    assert human.code == 6 and "does not fit" in human.stdout and "Would fit with" in human.stdout


def test_fit_rejects_an_unknown_cache_type_with_the_choices(stocked: Cli) -> None:
    res = stocked("fit", "gemma", "--cache-type", "q3_x", check=False)
    assert res.code == 2 and "q8_0" in res.stderr and "q4_0" in res.stderr


def test_fit_of_an_unknown_model_is_a_clear_error(cli: Cli) -> None:
    res = cli("fit", "nope", check=False)
    assert res.code != 0 and "no model named 'nope'" in res.stderr


def test_fit_on_a_hub_target_reads_only_the_header(cli: Cli, gemma_path: Path) -> None:
    local = None
    with HubServer({REPO: {GEMMA_FILE: gemma_path}}) as hub:
        cli.env["HF_ENDPOINT"] = hub.url
        remote = cli("fit", f"{REPO}:Q4_K_M", "--json").json()
        fetched = 0
        for r in hub.requests:
            if r.method == "GET" and r.range:
                m = re.match(r"bytes=(\d+)-(\d+)", r.range)
                assert m is not None
                fetched += int(m[2]) - int(m[1]) + 1
        assert not [r for r in hub.requests if r.method == "GET" and not r.range and GEMMA_FILE in r.path]
    size = gemma_path.stat().st_size
    assert 0 < fetched < size // 10  # the header, not the model
    assert not list((cli.home / "models").glob("*.gguf"))  # nothing was downloaded into the store
    cli("import", str(gemma_path), "--name", "gemma")
    local = cli("fit", "gemma", "--json").json()
    for key in ("fits", "ctx_per_slot", "slots", "cache_type_k", "kv_bytes", "estimate_bytes"):
        assert remote[key] == local[key], key
    assert remote["model"] == "gemma-3-270m-it:q4_k_m"


def test_coreside_lists_what_stays_resident_with_the_numbers(stocked: Cli) -> None:
    res = stocked("coreside", "gemma", "tiny", "--ctx", "4096", "--json").json()
    names = [r["name"] for r in res["coreside"]["resident"]]
    assert names == ["gemma", "tiny"] and res["coreside"]["deferred"] == []
    (host,) = res["coreside"]["devices"]
    total = sum(sum(r["bytes_by_device"].values()) for r in res["coreside"]["resident"])
    assert host["used_bytes"] == total and host["left_bytes"] == host["budget_bytes"] - total
    assert set(res["plans"]) == {"gemma", "tiny"}
    assert "resident" in stocked("coreside", "gemma", "tiny").stdout


def test_coreside_defers_what_does_not_fit_beside_the_first(stocked: Cli) -> None:
    res = stocked("coreside", "gemma", "gemma", "--ctx", "32768", "--slots", "150", "--cache-type", "f16",
                  "--json").json()
    assert [r["name"] for r in res["coreside"]["resident"]] == ["gemma"]
    (deferred,) = res["coreside"]["deferred"]
    assert deferred["name"] == "gemma" and deferred["need_bytes"] > deferred["left_bytes"]


def test_show_includes_the_fit_summary(stocked: Cli) -> None:
    info = stocked("show", "gemma", "--json").json()
    assert info["fit"]["fits"] is True and info["fit"]["summary"].startswith("gemma fits:")
    assert "fit here" in stocked("show", "gemma").stdout
