"""The log is not trusted with paths or programs, end to end with the real `blazar` command, the real daemon and the
real llama-server: a crafted snapshot (an engine binary outside the home, activated; a model file, a session save and
a split model's directory outside it) is refused whole by `blazar restore`, naming the event, and nothing changes;
the same events appended straight to a log make `rm`, `session rm`, the bank's trim and a load touch no outside file
and run no outside program; an engine changed after install is refused at the next load; restored files are 0600;
a KV-bank save a crash left unrecorded is found by `doctor`, removed by `doctor --fix` and at start-up."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest

from blazar.events import Event
from blazar.events.engines import EngineActivated, EngineFile, EngineInstalled
from blazar.events.models import ModelImported, ModelMetadata, ShardFile
from blazar.events.sessions import KvIdentity, SessionSaved
from blazar.instances.kv_bank import bank_file_name
from blazar.paths import Paths
from tests.conftest import Cli
from tests.support.blazar_home import read_events
from tests.support.crafted import append, seal
from tests.support.daemon import free_port, healthy, serving, wait_for
from tests.support.homes import record_probe
from tests.support.serving import stop_daemon
from tests.support.snapshots import EXIT_SNAPSHOT_REFUSED, fingerprint, seed_and_snapshot

SHA = "ab" * 32
IDENT = KvIdentity(engine="x", model_sha256=SHA, ctx_tokens=1024, cache_type_k="f16", cache_type_v="f16")
EXIT_ENGINE_UNUSABLE = 6
EXIT_NOT_FOUND = 2


class Outside:
    """Files outside the home: a program that leaves a marker if anyone runs it, and files that must survive."""

    def __init__(self, root: Path) -> None:
        root.mkdir()
        self.root = root
        self.marker = root / "ran"
        self.program = root / "evil.sh"
        self.program.write_text(f"#!/bin/sh\necho ran >> {self.marker}\n")
        self.program.chmod(0o700)
        self.precious = root / "precious.txt"
        self.precious.write_text("keep me")
        self.shards = root / "shards"
        self.shards.mkdir()
        (self.shards / "big-00001-of-00002.gguf").write_text("part 1")
        self.save = root / "save.bin"
        self.save.write_text("someone's KV cache")

    def untouched(self) -> None:
        assert not self.marker.exists(), "the outside program ran"
        assert self.precious.read_text() == "keep me" and self.program.exists()
        assert (self.shards / "big-00001-of-00002.gguf").read_text() == "part 1"
        assert self.save.read_text() == "someone's KV cache"


@pytest.fixture
def outside(tmp_path: Path) -> Outside:
    return Outside(tmp_path / "outside")


def crafted_events(out: Outside, manifest: dict[str, Any] | None = None,
                   version: dict[str, Any] | None = None) -> list[Event]:
    """What a hostile snapshot holds: each names a path outside the home."""
    program = str(out.program)
    part = str(out.shards / "big-00001-of-00002.gguf")
    return [
        EngineInstalled(tag="evil", source_kind="path", source=program, binary=program,
                        files=[EngineFile(path=program, bytes=out.program.stat().st_size,
                                          sha256=hashlib.sha256(out.program.read_bytes()).hexdigest())],
                        version=version or {}, manifest=manifest or {}),
        EngineActivated(tag="evil", reason="use"),
        ModelImported(name="victim", path=str(out.precious), source="x", bytes=7, sha256=SHA, linked=True,
                      metadata=ModelMetadata(architecture="llama")),
        ModelImported(name="big", path=part, source="x", bytes=6, sha256=SHA, linked=True,
                      metadata=ModelMetadata(architecture="llama"),
                      shards=[ShardFile(path=part, bytes=6, sha256=SHA)]),
        SessionSaved(session="stolen", model="gemma", instance_id="i1", slot_id=0, file=str(out.save), bytes=18,
                     tokens=4, duration_ms=1.0, identity=IDENT, reason="stopped"),
    ]


# -- restore -----------------------------------------------------------------------------------------------------


def test_a_crafted_snapshot_is_refused_whole_naming_each_event_and_nothing_changes(
        cli: Cli, paths: Paths, tmp_path: Path, outside: Outside) -> None:
    attacker = Paths.from_env({"BLAZAR_HOME": str(tmp_path / "attacker")})
    seqs = append(attacker, crafted_events(outside))
    snap = seal(attacker, tmp_path / "gift")
    seed_and_snapshot(paths, None)  # the victim's own home, with a log of its own
    before, before_state = fingerprint(paths), cli("state", "--json").json()

    for args in (("restore", str(snap)), ("restore", str(snap), "--force")):
        res = cli(*args, check=False)
        assert res.code == EXIT_SNAPSHOT_REFUSED, res.stderr
        message = " ".join(res.stderr.split())  # the CLI wraps long lines
        assert "names paths outside the home" in message
        assert f"seq {seqs[0]} engine.installed: binary '{outside.program}' is absolute" in message
        assert f"seq {seqs[2]} model.imported: path '{outside.precious}' is absolute" in message
        assert f"seq {seqs[3]} model.imported" in message and f"seq {seqs[4]} session.saved" in message
    assert fingerprint(paths) == before
    assert cli("state", "--json").json() == before_state
    outside.untouched()
    # And `blazar snapshot` of a log that holds such events says so, instead of writing a backup no restore takes.
    res = Cli(attacker.data_dir)("snapshot", str(tmp_path / "again"), check=False)
    assert res.code == EXIT_SNAPSHOT_REFUSED and "names paths outside the home" in res.stderr
    assert not (tmp_path / "again").exists()


def test_restored_files_and_the_replaced_log_kept_beside_them_are_the_owners_alone(
        cli: Cli, paths: Paths, tmp_path: Path) -> None:
    snap = tmp_path / "snap"
    seed_and_snapshot(paths, snap)
    cli("config", "set", "telemetry.log_level", "debug")
    os.chmod(paths.db, 0o644)
    os.chmod(paths.config_file, 0o644)
    # A umask that would leave new files readable by all: restore must not rely on the caller's.
    proc = subprocess.run([sys.executable, "-m", "blazar.cli.main", "restore", str(snap), "--json"], env=cli.env,
                          capture_output=True, text=True, timeout=120, umask=0o022)
    assert proc.returncode == 0, proc.stderr
    kept = list(paths.data_dir.glob("blazar.db.replaced-*"))
    assert kept
    for p in [paths.db, *kept, paths.config_file, paths.config_file.with_name("config.toml.bak")]:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p


# -- a log that got such events anyway -----------------------------------------------------------------------------


def _engine_record(home: Path) -> dict[str, Any]:
    (installed,) = read_events(home, "engine.installed")
    return installed["data"]


@pytest.fixture
def home_with_engine(cli: Cli, home: Path, engine_binary: Path, gemma_path: Path) -> int:
    cli("engine", "install", "--path", str(engine_binary), timeout=120)
    cli("import", str(gemma_path), "--name", "gemma")
    record_probe(home, engine_binary, gemma_path, "gemma")  # its first load is no probe's (test_template_probe.py)
    for key, value in {"ctx": "2048", "slots": "1", "keep_alive": "10m", "session_bank_mib": "1"}.items():
        cli("config", "set", key, value)
    port = free_port()
    cli("config", "set", "server.port", str(port))
    return port


@pytest.fixture
def daemon(cli: Cli, home_with_engine: int) -> Iterator[int]:
    with serving(cli) as proc:
        wait_for(lambda: healthy(home_with_engine), "/health", proc=proc)
        yield home_with_engine
        stop_daemon(proc)


def _chat(port: int, session: str, text: str) -> None:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=180)
    client.chat.completions.create(model="gemma", messages=[{"role": "user", "content": text}], max_tokens=2,
                                   temperature=0, extra_headers={"X-Blazar-Session": session})


def test_appended_events_never_run_the_outside_program_nor_remove_outside_files(
        cli: Cli, home: Path, paths: Paths, home_with_engine: int, outside: Outside) -> None:
    real = _engine_record(home)
    seqs = append(paths, crafted_events(outside, real["manifest"], real["version"]))
    # Without a daemon: rm and session rm run in this command.
    for args in (("rm", "victim"), ("rm", "big"), ("session", "rm", "stolen")):
        res = cli(*args, check=False)
        assert res.code != 0 and "no " in res.stderr, (args, res.stderr)
    outside.untouched()
    report = cli("doctor", "--json", check=False, timeout=180).json()
    (untrusted,) = [c for c in report["checks"] if c["check"] == "log.untrusted_paths"]
    assert untrusted["status"] == "fail" and all(f"seq {s} " in untrusted["observation"] for s in seqs)
    assert cli("engine", "show", "--json").json()["tag"] == real["tag"]

    port = home_with_engine
    with serving(cli) as proc:
        wait_for(lambda: healthy(port), "/health", proc=proc)
        # A load runs the engine the log legitimately activated, never the program the appended events name.
        _chat(port, "s1", "Say hi.")
        (started,) = read_events(home, "instance.started")
        assert started["data"]["engine_tag"] == real["tag"]
        assert Path(started["data"]["argv"][0]).is_relative_to(paths.engines)
        cli("stop", "gemma")
        (first,) = wait_for(lambda: [e for e in read_events(home, "session.saved") if e["data"]["session"] == "s1"],
                            "the save of s1")
        # A recorded save whose file was swapped for a link out of the bank: `session rm` refuses it whole, and
        # the bank's trim (a bigger save of another session pushes the bank past 1 MiB) drops it, file left alone.
        saved_file = home / first["data"]["file"]
        saved_file.unlink()
        saved_file.symlink_to(outside.save)
        res = cli("session", "rm", "s1", check=False)
        assert res.code != 0 and "outside" in res.stderr and "session.saved" in res.stderr
        _chat(port, "s2", "The sea is wide and the tide comes in twice a day. " * 80)
        cli("stop", "gemma")
        dropped = wait_for(lambda: read_events(home, "session.dropped"), "the bank's trim")
        assert dropped[0]["data"]["session"] == "s1"  # the oldest first (then s2 itself, when it alone is over)
        stop_daemon(proc)
    outside.untouched()
    assert saved_file.is_symlink()


def test_an_engine_changed_after_install_is_refused_at_the_next_load(
        cli: Cli, home: Path, paths: Paths, daemon: int) -> None:
    cli("load", "gemma", timeout=180)
    cli("stop", "gemma")
    tag = _engine_record(home)["tag"]
    installed = paths.engines / tag / "llama-server"
    with installed.open("ab") as fh:
        fh.write(b"\0")
    res = cli("load", "gemma", check=False, timeout=180)
    assert res.code == EXIT_ENGINE_UNUSABLE, res.stderr
    assert f"engine {tag}" in res.stderr and "llama-server" in res.stderr and "install record" in res.stderr
    refused = read_events(home, "instance.load_refused")
    assert [r["data"]["reason"] for r in refused] == ["engine_unverified"]
    assert len(read_events(home, "instance.started")) == 1  # the first load only
    ready = httpx2.get(f"http://127.0.0.1:{daemon}/ready", timeout=60, trust_env=False)
    assert ready.status_code == 503 and "install record" in ready.text


# -- a KV-bank save a crash left unrecorded --------------------------------------------------------------------------


def _leftover(paths: Paths, session: str) -> Path:
    """What a daemon SIGKILLed between the engine's write and `session.saved` leaves: a whole save, unrecorded."""
    d = paths.data_dir / "slots" / "gemma"
    d.mkdir(parents=True, exist_ok=True)
    f = d / bank_file_name(session)
    f.write_bytes(b"k" * 4096)
    return f


def test_an_unrecorded_bank_save_is_found_by_doctor_and_removed_by_fix_and_at_start_up(
        cli: Cli, paths: Paths) -> None:
    cli("config", "set", "telemetry.log_level", "info")  # a home with a log
    recorded = _leftover(paths, "kept")
    append(paths, [SessionSaved(session="kept", model="gemma", instance_id="i1", slot_id=0,
                                file=str(recorded.relative_to(paths.data_dir)), bytes=4096, tokens=4,
                                duration_ms=1.0, identity=IDENT, reason="stopped")])
    lost = _leftover(paths, "lost")

    report = cli("doctor", "--json", check=False, timeout=180).json()
    (bank,) = [c for c in report["checks"] if c["check"] == "store.kv_bank"]
    assert bank["status"] == "warn" and bank["fixable"] and str(lost) in bank["observation"]
    assert str(recorded) not in bank["observation"]

    fixed = cli("doctor", "--json", "--fix", check=False, timeout=180).json()
    assert [(f["check"], f["action"], f["target"]) for f in fixed["fixed"]] == [
        ("store.kv_bank", "removed_file", str(lost))]
    (bank,) = [c for c in fixed["checks"] if c["check"] == "store.kv_bank"]
    assert bank["status"] == "ok"
    assert not lost.exists() and recorded.exists()

    again = _leftover(paths, "lost-again")
    port = free_port()
    with serving(cli, "--port", str(port)) as proc:
        wait_for(lambda: healthy(port), "/health", proc=proc)
        stop_daemon(proc)
    assert not again.exists() and recorded.exists()
    fixes = [e["data"] for e in read_events(paths.data_dir, "doctor.fixed")]
    assert [f["target"] for f in fixes] == [str(lost), str(again)]
    assert "start-up" in fixes[1]["detail"]
