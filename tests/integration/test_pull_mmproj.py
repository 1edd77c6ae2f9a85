"""`blazar pull` of a hub repo with projectors beside the model (mmproj-*.gguf), against the local stand-in hub
(tests/support/hub_server.py): the projector in the model's precision comes too (else F16, else the first), says
which, and is recorded as `model.projector_set` (sha256 from the hub, path confined to the store); `--no-mmproj`
leaves it out; one that belongs to another model (another embedding width) fails the pull naming the way out; `rm`
takes the projector with the model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cli
from tests.support.blazar_home import read_events
from tests.support.gguf_factory import write_plain
from tests.support.hub_server import HubServer
from tests.support.tiny_mmproj import write_tiny_mmproj

REPO, WIDE = "org/seeing-GGUF", "org/mismatched-GGUF"
Q8, Q4 = "seeing-Q8_0.gguf", "seeing-Q4_K_M.gguf"
P_Q8, P_F16, P_F32 = "mmproj-seeing-Q8_0.gguf", "mmproj-seeing-F16.gguf", "mmproj-seeing-F32.gguf"


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Path]]:
    d = tmp_path_factory.mktemp("repos")
    write_plain(d / Q8, seed=5)  # embedding width 64
    write_plain(d / Q4, seed=6)
    for name in (P_Q8, P_F16, P_F32):
        write_tiny_mmproj(d / name, n_embd=64)
    write_tiny_mmproj(d / "mmproj-wide-F16.gguf", n_embd=640)  # Gemma 3 270M's width: not this model's
    return {REPO: {n: d / n for n in (Q8, Q4, P_Q8, P_F16, P_F32)},
            WIDE: {Q8: d / Q8, "mmproj-wide-F16.gguf": d / "mmproj-wide-F16.gguf"}}


@pytest.fixture
def hub_cli(cli: Cli, repos: dict[str, dict[str, Path]]) -> Iterator[tuple[Cli, HubServer]]:
    with HubServer(repos) as server:
        for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "HUGGING_FACE_HUB_TOKEN"):
            cli.env.pop(var, None)
        cli.env["HF_ENDPOINT"] = server.url
        yield cli, server


def test_a_pull_takes_the_projector_in_the_models_precision_and_says_which(hub_cli: tuple[Cli, HubServer],
                                                                           home: Path) -> None:
    cli, server = hub_cli
    result = cli("pull", f"{REPO}:Q8_0", "--json").json()
    assert result["projector"] == P_Q8
    started, imported, proj_set, completed = read_events(home)
    assert [e["type"] for e in (started, imported, proj_set, completed)] == [
        "model.pull_started", "model.imported", "model.projector_set", "model.pull_completed"]
    assert started["data"]["files"] == [Q8, P_Q8]
    assert started["data"]["total_bytes"] == server.blob(REPO, Q8).size + server.blob(REPO, P_Q8).size
    data = proj_set["data"]
    assert (data["name"], data["source"], data["source_kind"]) == (result["name"], f"{REPO}/{P_Q8}", "hub")
    assert data["sha256"] == server.blob(REPO, P_Q8).sha256 and data["path"] == f"mmproj/{data['sha256']}.gguf"
    assert (home / "models" / data["path"]).is_file()
    shown = cli("show", result["name"], "--json").json()
    assert "vision" in shown["capabilities"] and shown["projector"]["source"] == f"{REPO}/{P_Q8}"
    said = cli("pull", f"{REPO}:Q4_K_M").stdout  # no Q4_K_M projector: F16
    assert f"with its projector {P_F16}" in said


def test_no_mmproj_leaves_the_projector_out(hub_cli: tuple[Cli, HubServer], home: Path) -> None:
    cli, _ = hub_cli
    result = cli("pull", f"{REPO}:Q8_0", "--no-mmproj", "--json").json()
    assert result["projector"] is None
    assert read_events(home, "model.projector_set") == []
    assert read_events(home, "model.pull_started")[0]["data"]["files"] == [Q8]
    assert "vision" not in cli("show", result["name"], "--json").json()["capabilities"]


def test_a_projector_of_another_width_fails_the_pull_naming_no_mmproj(hub_cli: tuple[Cli, HubServer],
                                                                       home: Path) -> None:
    cli, _ = hub_cli
    failed = cli("pull", WIDE, check=False)
    assert failed.code != 0
    message = " ".join(failed.stderr.split())
    assert "projects to 640 wide" in message and "embedding width is 64" in message and "--no-mmproj" in message
    (ev,) = read_events(home, "model.pull_failed")
    assert ev["data"]["reason"] == "invalid_file"
    assert read_events(home, "model.imported") == [] and read_events(home, "model.projector_set") == []
    assert cli("pull", WIDE, "--no-mmproj", "--json").json()["projector"] is None


def test_rm_takes_the_projector_with_the_model(hub_cli: tuple[Cli, HubServer], home: Path) -> None:
    cli, _ = hub_cli
    name = cli("pull", f"{REPO}:Q8_0", "--json").json()["name"]
    (proj,) = read_events(home, "model.projector_set")
    cli("rm", name)
    (removed,) = read_events(home, "model.projector_removed")
    assert removed["data"] == {"name": name, "path": proj["data"]["path"], "file_deleted": True}
    assert not (home / "models" / proj["data"]["path"]).exists()
    assert [e["type"] for e in read_events(home)][-2:] == ["model.projector_removed", "model.removed"]
