"""The engine port's lock and the child's environment: a fresh key per child in a 0600 file (or, on a build
without the file flag, on the command line with the value redacted where it is recorded), only Blazar's own headers
to the child, and an allowlisted environment."""

from __future__ import annotations

import stat
from pathlib import Path

from blazar.adapters.engines.client import engine_headers
from blazar.adapters.engines.llama_server import Capabilities, engine_key, parse_help, redact_argv
from blazar.adapters.engines.process import child_env
from blazar.paths import Paths
from blazar.queries.file_modes import loose_modes

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "llama_server"


def test_a_child_gets_its_own_key_through_a_0600_file(tmp_path: Path) -> None:
    caps = parse_help((FIXTURES / "help.txt").read_text())
    keyfile = tmp_path / "run" / "abc.key"
    secret, flags = engine_key(caps, keyfile)
    assert secret and secret.startswith("eng_") and len(secret) > 40
    assert flags == ["--api-key-file", str(keyfile)]
    assert keyfile.read_text().strip() == secret
    assert stat.S_IMODE(keyfile.stat().st_mode) == 0o600
    again, _ = engine_key(caps, tmp_path / "other.key")
    assert again != secret


def test_without_the_file_flag_the_key_is_on_the_argv_and_redacted_in_the_record(tmp_path: Path) -> None:
    caps = Capabilities(flags=tuple(f for f in parse_help((FIXTURES / "help.txt").read_text()).flags
                                    if "--api-key-file" not in f.names))
    secret, flags = engine_key(caps, tmp_path / "k.key")
    assert flags == ["--api-key", secret]
    assert not (tmp_path / "k.key").exists()
    recorded = redact_argv(["llama-server", "--port", "1", *flags])
    assert secret not in recorded and recorded[-1] == "<redacted>"


def test_a_build_without_keys_gets_none(tmp_path: Path) -> None:
    assert engine_key(Capabilities(flags=()), tmp_path / "k.key") == (None, [])


def test_only_our_headers_go_to_the_child() -> None:
    assert engine_headers(None) == {"content-type": "application/json"}
    assert engine_headers("eng_x") == {"content-type": "application/json", "authorization": "Bearer eng_x"}


def test_the_child_environment_is_an_allowlist() -> None:
    env = {"PATH": "/bin", "HOME": "/h", "LANG": "C.UTF-8", "LC_ALL": "C", "CUDA_VISIBLE_DEVICES": "0",
           "OMP_NUM_THREADS": "2", "HF_TOKEN": "hf_secret", "OPENAI_API_KEY": "sk", "BLAZAR_HOME": "/b",
           "AWS_SECRET_ACCESS_KEY": "x", "GITHUB_TOKEN": "t"}
    assert child_env(env) == {"PATH": "/bin", "HOME": "/h", "LANG": "C.UTF-8", "LC_ALL": "C",
                              "CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "2"}


def test_loose_modes_names_what_others_can_read(tmp_path: Path) -> None:
    paths = Paths.from_env({"BLAZAR_HOME": str(tmp_path / "home")})
    paths.ensure()
    assert loose_modes(paths) == []
    paths.db.write_bytes(b"")
    paths.db.chmod(0o644)
    paths.run.chmod(0o755)
    found = loose_modes(paths)
    assert f"{paths.db} (0644)" in found and f"{paths.run} (0755)" in found
    assert len(found) == 2


def test_ensure_tightens_the_home_itself(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    Paths.from_env({"BLAZAR_HOME": str(home)}).ensure()
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
