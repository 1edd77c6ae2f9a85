"""The hub adapter end to end: the real `huggingface_hub` client against a local server that speaks the hub's file
protocol (tests/support/hub_server.py), with faults injected: dropped connections, corrupt bytes, slow bodies."""

from __future__ import annotations

import hashlib
import random
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import HfApi, hf_hub_download

from blazar.adapters.hub import DEFAULT_ENDPOINT, Hub, RemoteFile, available_quants, hub_from_env
from blazar.errors import (
    ChecksumMismatch,
    DownloadCancelled,
    HubAccessDenied,
    HubError,
    HubUnavailable,
    NotFoundOnHub,
)
from tests.support.hub_server import COMMIT, HubServer

REPO = "org/multi"
GATED = "org/gated"
TOKEN = "hf_test_secret"
CHUNK = 16 * 1024


def payload(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


BIG = payload(1, 300_000)
FILES: dict[str, bytes] = {
    "model-Q4_K_M.gguf": BIG,
    "model-Q8_0.gguf": payload(2, 200_000),
    "model-Q4_K.gguf": payload(3, 1_000),
    "model-IQ4_XS.gguf": payload(4, 900),
    "split/model-Q5_K_M-00002-of-00003.gguf": payload(6, 700),
    "split/model-Q5_K_M-00001-of-00003.gguf": payload(5, 600),
    "split/model-Q5_K_M-00003-of-00003.gguf": payload(7, 800),
    "mmproj-model-F16.gguf": payload(8, 500),
    "README.md": b"# multi\n",
}


@pytest.fixture
def server() -> Iterator[HubServer]:
    repos = {
        REPO: FILES,
        GATED: {"gated-Q4_K_M.gguf": payload(9, 50_000)},
        "org/single": {"only-F16.gguf": payload(10, 2_000), "notes.txt": b"plain git file\n"},
    }
    with HubServer(repos, gated={GATED}, token=TOKEN) as srv:
        yield srv


@pytest.fixture
def hub(server: HubServer) -> Hub:
    return Hub(server.url, chunk_bytes=CHUNK, timeout_s=5)


def remote(server: HubServer, repo: str, path: str) -> RemoteFile:
    blob = server.blob(repo, path)
    return RemoteFile(path, blob.size, blob.sha256 if blob.lfs else None, blob.blob_id, COMMIT)


def gets(server: HubServer) -> list[tuple[str, str | None]]:
    """The body-bearing requests (GETs of files, on the hub or its CDN) with their Range headers."""
    return [(r.server, r.range) for r in server.requests if r.method == "GET" and not r.path.startswith("/api/")]


def dead_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # closed again: connections are refused


# -- listing and resolving -----------------------------------------------------------------------------------------


def test_lists_gguf_files_with_sizes_and_lfs_hashes_pinned_to_the_commit(hub: Hub, server: HubServer) -> None:
    files = hub.list_gguf_files(REPO)
    assert [f.path for f in files] == sorted(p for p in FILES if p.endswith(".gguf"))
    q4 = next(f for f in files if f.path == "model-Q4_K_M.gguf")
    assert (q4.size, q4.sha256, q4.revision) == (len(BIG), hashlib.sha256(BIG).hexdigest(), COMMIT)
    assert [r.path for r in server.requests] == [f"/api/models/{REPO}/revision/main"]


def test_resolve_defaults_to_q4_k_m(hub: Hub) -> None:
    assert [f.path for f in hub.resolve(REPO)] == ["model-Q4_K_M.gguf"]


def test_resolve_matches_a_quant_case_insensitively_and_as_a_whole_token(hub: Hub) -> None:
    assert [f.path for f in hub.resolve(REPO, "Q8_0")] == ["model-Q8_0.gguf"]
    assert [f.path for f in hub.resolve(REPO, "q4_k_m")] == ["model-Q4_K_M.gguf"]
    # "Q4_K" is its own quant: it must not also pick the Q4_K_M file, nor "Q4_XS" the IQ4_XS one.
    assert [f.path for f in hub.resolve(REPO, "Q4_K")] == ["model-Q4_K.gguf"]
    with pytest.raises(NotFoundOnHub):
        hub.resolve(REPO, "Q4_XS")


def test_resolve_returns_split_parts_together_in_order(hub: Hub) -> None:
    expected = [f"split/model-Q5_K_M-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert [f.path for f in hub.resolve(REPO, "Q5_K_M")] == expected
    # Naming any one part by file name brings the whole set.
    assert [f.path for f in hub.resolve(REPO, "model-Q5_K_M-00002-of-00003.gguf")] == expected
    assert [f.path for f in hub.resolve(REPO, "model-Q8_0.gguf")] == ["model-Q8_0.gguf"]


def test_resolve_unknown_quant_lists_the_quants_there_are(hub: Hub) -> None:
    with pytest.raises(NotFoundOnHub) as info:
        hub.resolve(REPO, "Q2_K")
    msg = info.value.message
    assert REPO in msg and "Q2_K" in msg
    for quant in ("IQ4_XS", "Q4_K", "Q4_K_M", "Q5_K_M", "Q8_0"):
        assert quant in msg
    assert "F16" not in available_quants(hub.list_gguf_files(REPO))  # the projector is not a model
    with pytest.raises(NotFoundOnHub, match=re.escape("no file 'nope.gguf'")):
        hub.resolve(REPO, "nope.gguf")


def test_resolve_without_a_spec_takes_a_repos_only_model(hub: Hub) -> None:
    assert [f.path for f in hub.resolve("org/single")] == ["only-F16.gguf"]


# -- downloading ---------------------------------------------------------------------------------------------------


def test_download_reports_monotone_progress_ending_at_the_size(hub: Hub, server: HubServer, tmp_path: Path) -> None:
    (file,) = hub.resolve(REPO)
    seen: list[tuple[int, int]] = []
    path = hub.download(REPO, file, tmp_path, progress=lambda done, total: seen.append((done, total)))
    assert path == tmp_path / "model-Q4_K_M.gguf"
    assert path.read_bytes() == BIG
    assert not list(tmp_path.glob("*.incomplete"))
    dones = [d for d, _ in seen]
    assert len(dones) > 3 and dones == sorted(dones) and dones[-1] == len(BIG)
    assert {t for _, t in seen} == {len(BIG)}
    # HEAD on the hub, then the bytes from the CDN it redirected to, without the token.
    resolves = [r for r in server.requests if "/resolve/" in r.path]
    assert [(r.method, r.path) for r in resolves] == [("HEAD", f"/{REPO}/resolve/{COMMIT}/model-Q4_K_M.gguf")]
    assert gets(server) == [("cdn", None)]


def test_download_of_a_present_file_makes_no_request(hub: Hub, server: HubServer, tmp_path: Path) -> None:
    file = remote(server, REPO, "model-Q8_0.gguf")
    hub.download(REPO, file, tmp_path)
    server.clear_log()
    seen: list[tuple[int, int]] = []
    path = hub.download(REPO, file, tmp_path, progress=lambda d, t: seen.append((d, t)))
    assert path.read_bytes() == FILES["model-Q8_0.gguf"]
    assert server.requests == []
    assert seen == [(file.size, file.size)]


def test_download_keeps_the_repos_folders_and_checks_git_files_by_blob_id(hub: Hub, server: HubServer,
                                                                          tmp_path: Path) -> None:
    part = remote(server, REPO, "split/model-Q5_K_M-00001-of-00003.gguf")
    assert hub.download(REPO, part, tmp_path) == tmp_path / "split" / "model-Q5_K_M-00001-of-00003.gguf"
    notes = remote(server, "org/single", "notes.txt")
    assert notes.sha256 is None
    assert hub.download("org/single", notes, tmp_path).read_bytes() == b"plain git file\n"


def test_interrupted_download_resumes_with_a_range_request(hub: Hub, server: HubServer, tmp_path: Path) -> None:
    (file,) = hub.resolve(REPO)
    server.fail_after_bytes = 100_000
    with pytest.raises(HubUnavailable) as info:
        hub.download(REPO, file, tmp_path)
    partial = tmp_path / "model-Q4_K_M.gguf.incomplete"
    kept = partial.stat().st_size
    assert 0 < kept <= 100_000 and info.value.partial_bytes == kept
    assert "model-Q4_K_M.gguf" in info.value.message and not (tmp_path / "model-Q4_K_M.gguf").exists()

    server.clear_log()
    seen: list[int] = []
    path = hub.download(REPO, file, tmp_path, progress=lambda d, t: seen.append(d))
    assert path.read_bytes() == BIG and not partial.exists()
    assert gets(server) == [("cdn", f"bytes={kept}-")]
    assert seen[0] == kept and seen[-1] == len(BIG)


def test_corrupted_payload_raises_checksum_mismatch_and_leaves_no_file(hub: Hub, server: HubServer,
                                                                       tmp_path: Path) -> None:
    (file,) = hub.resolve(REPO)
    server.corrupt = True
    with pytest.raises(ChecksumMismatch) as info:
        hub.download(REPO, file, tmp_path)
    assert f"{REPO}/model-Q4_K_M.gguf" in info.value.message and file.sha256 in info.value.message
    assert info.value.partial_bytes == 0
    assert list(tmp_path.iterdir()) == []
    server.corrupt = False
    assert hub.download(REPO, file, tmp_path).read_bytes() == BIG


def test_cancel_raises_download_cancelled_keeps_the_partial_and_resumes(hub: Hub, server: HubServer,
                                                                        tmp_path: Path) -> None:
    (file,) = hub.resolve(REPO)
    cancel = threading.Event()

    def stop_midway(done: int, total: int) -> None:
        if done >= 50_000:
            cancel.set()

    with pytest.raises(DownloadCancelled) as info:
        hub.download(REPO, file, tmp_path, progress=stop_midway, cancel=cancel)
    partial = tmp_path / "model-Q4_K_M.gguf.incomplete"
    kept = partial.stat().st_size
    assert 50_000 <= kept < len(BIG) and info.value.partial_bytes == kept
    assert not (tmp_path / "model-Q4_K_M.gguf").exists()

    server.clear_log()
    with pytest.raises(DownloadCancelled):  # already cancelled: nothing is asked of the hub
        hub.download(REPO, file, tmp_path, cancel=cancel)
    assert server.requests == [] and partial.stat().st_size == kept

    server.clear_log()
    assert hub.download(REPO, file, tmp_path).read_bytes() == BIG
    assert gets(server) == [("cdn", f"bytes={kept}-")]


def test_a_server_that_ignores_range_restarts_the_file_from_zero(hub: Hub, server: HubServer,
                                                                 tmp_path: Path) -> None:
    (file,) = hub.resolve(REPO)
    cancel = threading.Event()
    with pytest.raises(DownloadCancelled):
        hub.download(REPO, file, tmp_path, progress=lambda d, t: d >= 40_000 and cancel.set(), cancel=cancel)
    kept = (tmp_path / "model-Q4_K_M.gguf.incomplete").stat().st_size
    server.honour_range = False
    server.clear_log()
    seen: list[int] = []
    assert hub.download(REPO, file, tmp_path, progress=lambda d, t: seen.append(d)).read_bytes() == BIG
    assert gets(server) == [("cdn", f"bytes={kept}-")]  # asked to resume, sent everything
    assert seen[0] == 0 and seen == sorted(seen) and seen[-1] == len(BIG)


def test_a_second_download_of_the_same_file_is_refused_while_one_runs(hub: Hub, tmp_path: Path) -> None:
    (file,) = hub.resolve(REPO)
    refused: list[HubError] = []

    def start_another(done: int, total: int) -> None:
        if done and not refused:
            with pytest.raises(HubError, match="already being downloaded") as info:
                hub.download(REPO, file, tmp_path)
            refused.append(info.value)

    assert hub.download(REPO, file, tmp_path, progress=start_another).read_bytes() == BIG
    assert len(refused) == 1 and refused[0].partial_bytes > 0


def test_gated_repo_needs_a_token_with_access(server: HubServer, tmp_path: Path) -> None:
    anonymous = Hub(server.url, chunk_bytes=CHUNK)
    (file,) = anonymous.resolve(GATED)  # the listing of a gated repo is public, as on the hub
    with pytest.raises(HubAccessDenied, match="set HF_TOKEN") as info:
        anonymous.download(GATED, file, tmp_path)
    assert GATED in info.value.message
    with pytest.raises(HubAccessDenied, match="no access"):
        Hub(server.url, token="hf_wrong").download(GATED, file, tmp_path)
    assert list(tmp_path.iterdir()) == []

    server.clear_log()
    authorized = Hub(server.url, token=TOKEN, chunk_bytes=CHUNK)
    assert authorized.download(GATED, file, tmp_path).read_bytes() == server.blob(GATED, file.path).read(0, file.size)
    assert authorized.fetch_range(GATED, file.path, 0, 4) == server.blob(GATED, file.path).read(0, 4)
    assert all(r.authorized for r in server.requests if r.server == "hub")
    assert not any(r.authorized for r in server.requests if r.server == "cdn")  # the token stays on the hub


def test_missing_repo_revision_and_file_raise_not_found_on_hub(hub: Hub, server: HubServer, tmp_path: Path) -> None:
    with pytest.raises(NotFoundOnHub, match="no repository 'org/nope'"):
        hub.list_gguf_files("org/nope")
    with pytest.raises(NotFoundOnHub, match="no revision 'v9'"):
        hub.list_gguf_files(REPO, revision="v9")
    ghost = RemoteFile("ghost-Q4_K_M.gguf", 10, "0" * 64, None, COMMIT)
    with pytest.raises(NotFoundOnHub, match=re.escape("no file 'ghost-Q4_K_M.gguf' in org/multi")) as info:
        hub.download(REPO, ghost, tmp_path)
    assert (info.value.repo, info.value.filename) == (REPO, "ghost-Q4_K_M.gguf")
    with pytest.raises(NotFoundOnHub):
        hub.file_size(REPO, "ghost-Q4_K_M.gguf")
    with pytest.raises(NotFoundOnHub):
        hub.fetch_range("org/nope", "x.gguf", 0, 8)


def test_an_endpoint_that_is_down_raises_hub_unavailable(server: HubServer, tmp_path: Path) -> None:
    down = Hub(dead_endpoint(), timeout_s=2)
    with pytest.raises(HubUnavailable, match="unreachable for org/multi"):
        down.list_gguf_files(REPO)
    file = remote(server, REPO, "model-Q8_0.gguf")
    with pytest.raises(HubUnavailable, match=re.escape("model-Q8_0.gguf")) as info:
        down.download(REPO, file, tmp_path)
    assert info.value.partial_bytes == 0
    with pytest.raises(HubUnavailable):
        down.fetch_range(REPO, file.path, 0, 8)


def test_a_stalled_body_times_out_as_hub_unavailable_with_the_partial_kept(server: HubServer,
                                                                            tmp_path: Path) -> None:
    hub = Hub(server.url, chunk_bytes=CHUNK, timeout_s=0.5)
    file = remote(server, REPO, "model-Q4_K_M.gguf")
    server.delay_per_chunk = 5.0  # the first chunk arrives, the second not within the timeout (cut short at exit)
    with pytest.raises(HubUnavailable, match="Timeout") as info:
        hub.download(REPO, file, tmp_path)
    partial = tmp_path / "model-Q4_K_M.gguf.incomplete"
    assert info.value.partial_bytes == (partial.stat().st_size if partial.exists() else 0) < file.size


# -- reading a header without downloading --------------------------------------------------------------------------


@pytest.mark.parametrize("redirect_lfs", [True, False])
def test_fetch_range_returns_exactly_the_requested_bytes(redirect_lfs: bool) -> None:
    with HubServer({REPO: FILES}, redirect_lfs=redirect_lfs) as srv:
        hub = Hub(srv.url, chunk_bytes=CHUNK)
        assert hub.fetch_range(REPO, "model-Q4_K_M.gguf", 0, 64) == BIG[:64]
        assert hub.fetch_range(REPO, "model-Q4_K_M.gguf", 12_345, 67_890) == BIG[12_345:67_890]
        assert hub.fetch_range(REPO, "model-Q4_K_M.gguf", len(BIG) - 10, len(BIG) + 100) == BIG[-10:]
        assert hub.fetch_range(REPO, "model-Q4_K_M.gguf", len(BIG), len(BIG) + 8) == b""
        assert hub.file_size(REPO, "model-Q4_K_M.gguf") == len(BIG)
        ranges = [r.range for r in srv.requests if r.method == "GET"]
        assert "bytes=0-63" in ranges and "bytes=12345-67889" in ranges
    with pytest.raises(ValueError):
        hub.fetch_range(REPO, "model-Q4_K_M.gguf", 10, 10)


# -- configuration and the server's own fidelity -------------------------------------------------------------------


def test_hub_from_env_reads_hf_endpoint_and_hf_token() -> None:
    hub = hub_from_env({"HF_ENDPOINT": "http://127.0.0.1:9/", "HF_TOKEN": "hf_x"})
    assert (hub.endpoint, hub.has_token) == ("http://127.0.0.1:9", True)
    default = hub_from_env({})
    assert (default.endpoint, default.has_token) == (DEFAULT_ENDPOINT, False)


def test_the_stand_in_serves_hf_hub_download_and_list_repo_tree(server: HubServer, tmp_path: Path) -> None:
    # The reference client's own download path and tree listing accept what the stand-in says.
    got = hf_hub_download(REPO, "model-Q8_0.gguf", cache_dir=tmp_path / "cache", endpoint=server.url, token=False)
    assert Path(got).read_bytes() == FILES["model-Q8_0.gguf"]
    api = HfApi(endpoint=server.url, token=False)
    tree = {e.path: e for e in api.list_repo_tree(REPO, recursive=True)}
    assert {p for p in tree if p.endswith(".gguf")} == {p for p in FILES if p.endswith(".gguf")}
    assert tree["model-Q4_K_M.gguf"].lfs.sha256 == hashlib.sha256(BIG).hexdigest()
    top = [e.path for e in api.list_repo_tree(REPO)]
    assert "split" in top and "split/model-Q5_K_M-00001-of-00003.gguf" not in top
    assert len(list(api.list_repo_tree(REPO, path_in_repo="split"))) == 3


def test_hub_errors_name_their_reason_for_the_pull_failed_event() -> None:
    assert [c.reason for c in (HubError, NotFoundOnHub, ChecksumMismatch, DownloadCancelled, HubUnavailable)] == [
        "error", "not_found", "checksum_mismatch", "cancelled", "network"]
