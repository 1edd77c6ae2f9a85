"""`blazar search` against a local hub (the real huggingface_hub client's requests, the hub's search API paged by
Link headers): each repo's models by quantization with their sizes, planned from their headers alone (range requests,
nothing downloaded), within a budget of header bytes; a repo or header that cannot be read says so in its row; an
unreachable hub is a one-line error."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from huggingface_hub import HfApi

from blazar.adapters.hub import Hub
from blazar.errors import HubError
from blazar.queries.hub_search import SearchBudget, search_hub
from tests.conftest import Cli
from tests.support.fit_models import GiB, MiB, host, host_for_budget
from tests.support.gguf_factory import write_plain, write_split
from tests.support.hub_server import HubServer

TINY, BROKEN, MISSING, PLAIN = "org/tiny-GGUF", "org/tiny-broken-GGUF", "org/tiny-missing-GGUF", "org/tiny-readme"


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes | Path]]:
    d = tmp_path_factory.mktemp("hub")
    write_plain(d / "q8.gguf")
    write_plain(d / "q4.gguf", blocks=2)
    parts, _ = write_split(d / "tiny-F16.gguf", parts=2)
    return {
        TINY: {"tiny-Q8_0.gguf": d / "q8.gguf", "tiny-Q4_K_M.gguf": d / "q4.gguf",
               **{f"F16/{p.name}": p for p in parts}, "mmproj-tiny-F16.gguf": d / "q4.gguf", "README.md": b"hi"},
        BROKEN: {"broken-Q4_K_M.gguf": b"GGUF" + b"\x00" * 60},
        MISSING: {"m-Q8_0-00001-of-00002.gguf": parts[0]},
        PLAIN: {"README.md": b"no model here"},
    }


def _rows(result) -> dict[str, object]:
    return {m.target: m for r in result.repos for m in r.models}


def _downloads(hub: HubServer) -> list[str]:
    return [r.path for r in hub.requests if r.method == "GET" and r.path.endswith(".gguf") and not r.range]


def test_search_lists_each_quant_with_its_size_and_plan(repos: dict[str, dict[str, bytes | Path]]) -> None:
    with HubServer(repos, downloads={TINY: 50, BROKEN: 10, MISSING: 5}) as hub:
        result = search_hub(Hub(hub.url), [host(64 * GiB)], "tiny")
        assert not _downloads(hub)  # headers only, by range
    assert [r.repo for r in result.repos] == [TINY, BROKEN, MISSING]  # gguf repos only, most downloaded first
    rows = _rows(result)
    q8, q4, f16 = rows[f"{TINY}:Q8_0"], rows[f"{TINY}:Q4_K_M"], rows[f"{TINY}:F16"]
    tiny = repos[TINY]
    assert q8.size_bytes == Path(tiny["tiny-Q8_0.gguf"]).stat().st_size
    assert f16.files == ["F16/tiny-F16-00001-of-00002.gguf", "F16/tiny-F16-00002-of-00002.gguf"]
    assert f16.size_bytes == sum(Path(tiny[p]).stat().st_size for p in f16.files)
    for m in (q8, q4, f16):
        assert m.verdict.fits is True and m.verdict.where == "CPU" and m.verdict.ctx == 2048, m
    assert not any("mmproj" in t for t in rows)  # a projector is not a model
    broken = rows[f"{BROKEN}:Q4_K_M"].verdict
    assert broken.fits is None and broken.detail.startswith("header unreadable:")
    missing = rows[f"{MISSING}:Q8_0"].verdict
    assert missing.fits is None and "split parts are missing" in missing.detail
    assert 0 < result.header_bytes_read < 2 * MiB


def test_a_machine_too_small_gets_the_planners_reason(repos: dict[str, dict[str, bytes | Path]]) -> None:
    with HubServer({TINY: repos[TINY]}) as hub:
        result = search_hub(Hub(hub.url), [host_for_budget(64 << 10)], "tiny", quant="Q8_0")
    (row,) = result.repos[0].models  # --quant: that quantization only
    assert row.verdict.fits is False and "but its budget is 0.1 MiB" in row.verdict.detail


def test_the_header_budget_plans_each_repos_first_model_first(repos: dict[str, dict[str, bytes | Path]]) -> None:
    with HubServer({TINY: repos[TINY], "org/tiny-other-GGUF": {"o-Q6_K.gguf": repos[TINY]["tiny-Q8_0.gguf"]}}) as hub:
        one = Path(repos[TINY]["tiny-Q4_K_M.gguf"]).stat().st_size
        budget = SearchBudget(header_bytes=2 * one + 1024, first_bytes=one + 512, workers=1)
        result = search_hub(Hub(hub.url), [host(64 * GiB)], "tiny", budget)
    rows = _rows(result)
    assert rows[f"{TINY}:Q4_K_M"].verdict.fits is True and rows["org/tiny-other-GGUF:Q6_K"].verdict.fits is True
    spent = [t for t, m in rows.items() if m.verdict.detail == "not planned: the search's header budget is spent"]
    assert sorted(spent) == [f"{TINY}:F16", f"{TINY}:Q8_0"]
    assert result.header_bytes_read <= budget.header_bytes


def test_the_time_budget_stops_the_listings_and_the_headers(repos: dict[str, dict[str, bytes | Path]]) -> None:
    ticks = itertools.count()  # a clock that moves one second each time it is read
    with HubServer({TINY: repos[TINY], MISSING: repos[MISSING]}) as hub:
        result = search_hub(Hub(hub.url), [host(64 * GiB)], "tiny", SearchBudget(seconds=1.5),
                            clock=lambda: float(next(ticks)))
    errors = sorted(str(r.error) for r in result.repos)
    assert errors[0] == "None" and errors[1] == "not listed: the search's time budget is spent"
    (listed,) = [r for r in result.repos if r.error is None]
    assert listed.models and all(m.verdict.fits is None for m in listed.models)
    assert result.header_bytes_read == 0


def test_search_follows_the_hubs_pages_up_to_the_limit(repos: dict[str, dict[str, bytes | Path]]) -> None:
    many = {f"org/r{i}-GGUF": {"r-Q8_0.gguf": repos[TINY]["tiny-Q8_0.gguf"]} for i in range(5)}
    with HubServer(many, downloads={"org/r3-GGUF": 9, "org/r1-GGUF": 5}, page_size=2) as hub:
        found = Hub(hub.url).search("r", limit=4)
        pages = [r for r in hub.requests if r.path == "/api/models"]
        # the request is the one huggingface_hub's own list_models makes: the same answer through it
        listed = HfApi(endpoint=hub.url).list_models(search="r", filter="gguf", sort="downloads", limit=4)
        assert [m.id for m in listed] == [r.repo for r in found]
    assert [r.repo for r in found] == ["org/r3-GGUF", "org/r1-GGUF", "org/r0-GGUF", "org/r2-GGUF"]
    assert found[0].downloads == 9 and len(pages) == 2


def test_search_cli_shows_quants_sizes_and_fit_without_downloading(
        cli: Cli, gemma_path: Path, repos: dict[str, dict[str, bytes | Path]]) -> None:
    gemma_repo = "google-test/gemma-3-270m-it-GGUF"
    with HubServer({**repos, gemma_repo: {"gemma-3-270m-it-Q4_K_M.gguf": gemma_path}},
                   downloads={gemma_repo: 100}) as hub:
        cli.env["HF_ENDPOINT"] = hub.url
        text = cli("search", "tiny", "--limit", "2").stdout
        hub.clear_log()
        data = cli("search", "gemma", "--json").json()
        fetched = sum(int(m[2]) - int(m[1]) + 1 for r in hub.requests if r.range and r.server == "cdn"
                      for m in [re.match(r"bytes=(\d+)-(\d+)", r.range)] if m)
        assert not _downloads(hub)
    lines = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    assert f"{TINY}:Q8_0" in lines and f"{BROKEN}:Q4_K_M" in lines and MISSING not in text  # --limit 2
    assert "yes: CPU, ctx 2048" in lines[f"{TINY}:Q8_0"]
    assert "header unreadable" in lines[f"{BROKEN}:Q4_K_M"] and gemma_repo not in text
    (repo,) = data["repos"]
    (row,) = repo["models"]
    assert repo["repo"] == gemma_repo and row["size_bytes"] == gemma_path.stat().st_size
    assert row["verdict"]["fits"] is True and row["verdict"]["ctx"] == 32768
    assert fetched == data["header_bytes_read"] == 8 * MiB  # one range for its 6.2 MiB header, not its 241 MiB
    assert not list((cli.home / "models").glob("**/*.gguf"))


def test_search_of_an_unreachable_hub_is_a_one_line_error(cli: Cli) -> None:
    with HubServer({}) as hub:
        dead = hub.url  # closed when the block ends: nothing listens there any more
    cli.env["HF_ENDPOINT"] = dead
    res = cli("search", "gemma", check=False)
    assert res.code != 0 and res.stdout == ""
    assert res.stderr.strip().count("\n") == 0 and "unreachable" in res.stderr and dead in res.stderr


def test_search_that_finds_nothing_says_so(cli: Cli, repos: dict[str, dict[str, bytes | Path]]) -> None:
    with HubServer({PLAIN: repos[PLAIN]}) as hub:
        cli.env["HF_ENDPOINT"] = hub.url
        res = cli("search", "tiny")
    assert res.stdout.strip() == f"no GGUF repos on {hub.url} match 'tiny'"


def test_an_endpoint_that_refuses_the_search_is_named_with_its_status() -> None:
    refused = r"refused the search 'x' \(404\); is it a Hugging Face hub endpoint"
    with HubServer({}) as hub, pytest.raises(HubError, match=refused):
        Hub(hub.cdn_url).search("x", limit=3)  # the "CDN" answers every other path with the hub's 404


def test_a_repo_that_cannot_be_listed_says_so_in_its_row_as_text(cli: Cli) -> None:
    odd = "org/[bold]odd-GGUF"  # not a valid repo id to the client; and markup to rich, unless printed as text
    with HubServer({odd: {"o-Q8_0.gguf": b"GGUF"}}) as hub:
        cli.env["HF_ENDPOINT"] = hub.url
        res = cli("search", "odd")
    (row,) = [line for line in res.stdout.splitlines() if line.strip().startswith(odd)]
    assert "cannot list:" in row and "not a valid hub repo id" in row
