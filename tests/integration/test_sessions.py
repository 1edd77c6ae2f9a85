"""Sessions and the KV bank end to end: the official `openai`, `anthropic` and `ollama` SDKs against `blazar serve`
with the real llama-server and the real Gemma 3 270M. A session's turns go to the slot holding its prefix (warm);
when its instance is stopped the slot is saved, and the next turn restores it before the prompt, which the engine's
own `timings.prompt_n` (the prompt tokens it evaluated) shows; a restore into another context size is refused and
runs cold; the bank keeps to its bound; `blazar session` and `blazar why` tell all of it."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import ollama
import openai
import pytest

from tests.support.blazar_home import read_events
from tests.support.daemon import wait_for
from tests.support.serving import blazar_cli, serving_gemma

MODEL = "gemma"
SLOTS = 2
CTX = 2048
# A long first message (about 700 tokens) so that a turn's prefix is worth keeping, short enough to prefill quickly.
HISTORY = "The sea is wide and the tide comes in twice a day. " * 55


class Daemon:
    def __init__(self, home: Path, port: int) -> None:
        self.home, self.port = home, port
        self.base = f"http://127.0.0.1:{port}"

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return blazar_cli(self.home, *args)

    def cli_fails(self, *args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "BLAZAR_HOME": str(self.home), "NO_COLOR": "1"}
        return subprocess.run([sys.executable, "-m", "blazar.cli.main", *args], env=env, capture_output=True,
                              text=True, timeout=120)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key="unused", max_retries=0, timeout=180)

    def events(self, *types: str) -> list[dict[str, Any]]:
        return read_events(self.home, *types)

    def of_trace(self, trace: str, type_: str) -> dict[str, Any]:
        """The trace's event of `type_` (request events are group-committed: waited for)."""
        return wait_for(lambda: next((e["data"] for e in self.events(type_) if e["trace_id"] == trace), None),
                        f"{type_} of {trace}", timeout=20)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("sessions-home")
    settings = {"ctx": CTX, "slots": SLOTS, "keep_alive": "10m"}
    with serving_gemma(home, engine_binary, gemma_path, MODEL, settings) as (port, _):
        yield Daemon(home, port)


class Conversation:
    """A chat that grows turn by turn, sent as a session through the openai SDK."""

    def __init__(self, daemon: Daemon, session: str, first: str = HISTORY) -> None:
        self.daemon, self.session = daemon, session
        self.messages: list[dict[str, str]] = [{"role": "user", "content": first}]

    def turn(self, follow_up: str, **headers: str) -> tuple[str, dict[str, Any], Any]:
        """Send the conversation so far; returns (trace id, the engine's timings, the completion)."""
        raw = self.daemon.client().chat.completions.with_raw_response.create(
            model=MODEL, messages=self.messages, max_tokens=4, temperature=0,
            extra_headers={"X-Blazar-Session": self.session, **headers})
        chat = raw.parse()
        self.messages += [{"role": "assistant", "content": chat.choices[0].message.content or ""},
                          {"role": "user", "content": follow_up}]
        return raw.headers["x-blazar-trace-id"], (chat.model_extra or {}).get("timings") or {}, chat


def _placed(daemon: Daemon, trace: str) -> dict[str, Any]:
    return daemon.of_trace(trace, "request.placed")


def test_a_sessions_next_turn_after_stop_and_reload_restores_its_slot(daemon: Daemon) -> None:
    conv = Conversation(daemon, "sea-1")
    first, t1, _ = conv.turn("And the sky?")
    placed = _placed(daemon, first)
    assert (placed["kv"], placed["reason"]) == ("cold", "the session's first turn")
    assert t1["prompt_n"] > 500  # the whole prompt was evaluated

    second, t2, chat2 = conv.turn("And the land?")
    placed = _placed(daemon, second)
    assert placed["kv"] == "warm" and placed["slot_id"] == _placed(daemon, first)["slot_id"]
    assert t2["prompt_n"] < 60 < chat2.usage.prompt_tokens  # only the new turn was evaluated

    daemon.cli("stop", MODEL)
    saved = wait_for(lambda: [e for e in daemon.events("session.saved") if e["data"]["session"] == "sea-1"],
                     "session.saved")[-1]["data"]
    assert saved["reason"] == "stopped" and saved["tokens"] > 600 and saved["bytes"] > 1 << 20
    assert saved["identity"]["ctx_tokens"] == CTX and saved["identity"]["swa_full"] is True
    file = daemon.home / saved["file"]
    assert file.is_file() and stat.S_IMODE(file.stat().st_mode) == 0o600

    third, t3, chat3 = conv.turn("And the moon?")
    placed = _placed(daemon, third)
    assert placed["kv"] == "restored" and placed["restored_tokens"] == saved["tokens"]
    # The engine evaluated only what the saved prefix did not hold, not the whole prompt.
    assert t3["prompt_n"] < 60 and t3["cache_n"] >= saved["tokens"] - 1
    assert chat3.usage.prompt_tokens > 700

    why = json.loads(daemon.cli("why", third, "--json").stdout)
    assert "session sea-1 restored from the KV bank" in why["verdict"]
    assert any(s["type"] == "request.placed" and "restored" in s["text"] for s in why["steps"])
    warm_why = json.loads(daemon.cli("why", second, "--json").stdout)
    assert "session sea-1 warm on slot" in warm_why["verdict"]


def test_a_restore_into_another_context_size_is_refused_and_runs_cold(daemon: Daemon) -> None:
    conv = Conversation(daemon, "sea-ctx")
    conv.turn("And the sky?")
    daemon.cli("stop", MODEL)
    wait_for(lambda: [e for e in daemon.events("session.saved") if e["data"]["session"] == "sea-ctx"],
             "session.saved")
    daemon.cli("config", "set", "fit.ctx", str(CTX // 2))
    try:
        trace, timings, chat = conv.turn("And the land?")
        placed = _placed(daemon, trace)
        assert placed["kv"] == "cold"
        assert f"ctx_tokens {CTX} there, {CTX // 2} here" in placed["reason"]
        assert timings["prompt_n"] == chat.usage.prompt_tokens  # a full prefill
        why = json.loads(daemon.cli("why", trace, "--json").stdout)
        assert "session sea-ctx cold: " in why["verdict"] and "does not match this instance" in why["verdict"]
    finally:
        daemon.cli("config", "set", "fit.ctx", str(CTX))
        daemon.cli("stop", MODEL)


def test_session_commands_list_show_save_restore_and_rm(daemon: Daemon) -> None:
    conv = Conversation(daemon, "sea-cli")
    conv.turn("And the sky?")
    saved = json.loads(daemon.cli("session", "save", "sea-cli", "--json").stdout)
    assert [e["type"] for e in saved["events"]] == ["session.saved"]
    assert saved["events"][0]["data"]["reason"] == "requested"
    listed = json.loads(daemon.cli("session", "list", "--json").stdout)
    row = next(r for r in listed["sessions"] if r["name"] == "sea-cli")
    assert row["live"] and row["turns"] == 1 and row["cold"] == 1 and row["bank_bytes"] > 0
    assert listed["bank_bytes"] <= listed["bank_limit_bytes"]
    daemon.cli("stop", MODEL)
    restored = json.loads(daemon.cli("session", "restore", "sea-cli", "--json").stdout)
    assert restored["kv"] == "restored" and restored["tokens"] > 600
    trace, timings, _ = conv.turn("And the land?")
    assert _placed(daemon, trace)["kv"] == "warm" and timings["prompt_n"] < 60
    shown = json.loads(daemon.cli("session", "show", "sea-cli", "--json").stdout)
    assert shown["turns"] == 2 and shown["warm"] == 1 and len(shown["bank"]) == 1
    files = [daemon.home / e["file"] for e in shown["bank"]]
    removed = json.loads(daemon.cli("session", "rm", "sea-cli", "--json").stdout)
    assert removed["removed"] == "sea-cli" and not any(f.exists() for f in files)
    gone = daemon.cli_fails("session", "show", "sea-cli")
    assert gone.returncode == 1 and "no session named 'sea-cli'" in " ".join(gone.stderr.split())
    # The next turn is cold: no slot counts as holding it any more.
    trace, _, _ = conv.turn("And the moon?")
    assert _placed(daemon, trace)["kv"] == "cold"


def test_sessions_from_the_anthropic_and_ollama_sdks_keep_their_prefix(daemon: Daemon) -> None:
    """Anthropic names the session in `metadata.session`, Ollama in the body's `session`: both turns run warm."""
    ant = anthropic.Anthropic(base_url=daemon.base, api_key="unused", max_retries=0, timeout=180)
    messages: list[Any] = [{"role": "user", "content": HISTORY}]
    first = ant.messages.with_raw_response.create(model=MODEL, max_tokens=4, messages=messages,
                                                  metadata={"session": "ant-1"})  # type: ignore[typeddict-unknown-key]
    messages += [{"role": "assistant", "content": first.parse().content[0].text or "ok"},
                 {"role": "user", "content": "And the sky?"}]
    second = ant.messages.with_raw_response.create(model=MODEL, max_tokens=4, messages=messages,
                                                   metadata={"session": "ant-1"})  # type: ignore[typeddict-unknown-key]
    assert _placed(daemon, second.headers["x-blazar-trace-id"])["kv"] == "warm"

    # The Ollama SDK sends no extra body field: the header, from the client's own headers; then the body's field.
    oll = ollama.Client(host=daemon.base, timeout=180, headers={"X-Blazar-Session": "oll-1"})
    chat: list[dict[str, str]] = [{"role": "user", "content": HISTORY}]
    one = oll.chat(model=MODEL, messages=chat, options={"num_predict": 4, "temperature": 0})
    chat += [{"role": "assistant", "content": one.message.content or "ok"}, {"role": "user", "content": "Sky?"}]
    two = httpx2.post(f"{daemon.base}/api/chat", timeout=180, json={
        "model": MODEL, "messages": chat, "stream": False, "session": "oll-1",
        "options": {"num_predict": 4, "temperature": 0}})
    assert two.status_code == 200 and two.json()["prompt_eval_count"] > 700
    assert _placed(daemon, two.headers["x-blazar-trace-id"])["kv"] == "warm"
    rows = {r["name"]: r for r in json.loads(daemon.cli("session", "list", "--json").stdout)["sessions"]}
    assert rows["ant-1"]["warm"] == 1 and rows["oll-1"]["turns"] == 2


def test_a_bad_session_name_is_a_400_in_each_dialect(daemon: Daemon) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        daemon.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=2, extra_headers={"X-Blazar-Session": "no spaces"})
    assert "X-Blazar-Session" in e.value.message
    ant = anthropic.Anthropic(base_url=daemon.base, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as a:
        ant.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}],
                            metadata={"session": "x" * 200})  # type: ignore[typeddict-unknown-key]
    assert "metadata.session" in str(a.value)


def test_the_bank_keeps_to_its_bound_dropping_the_oldest_save(daemon: Daemon) -> None:
    """Two saves of about 10 MiB each into a 16 MiB bank: the older is dropped (recorded, its file deleted). A save
    larger than session_save_max_mib is not kept at all."""
    daemon.cli_fails("stop", MODEL)  # from an earlier test, if loaded
    for name in [r["name"] for r in json.loads(daemon.cli("session", "list", "--json").stdout)["sessions"]]:
        daemon.cli("session", "rm", name)
    daemon.cli("config", "set", "sessions.session_bank_mib", "16")
    try:
        older, newer = Conversation(daemon, "bank-old"), Conversation(daemon, "bank-new")
        older.turn("And the sky?")
        newer.turn("And the sky?")
        daemon.cli("stop", MODEL)
        dropped = wait_for(lambda: [e["data"] for e in daemon.events("session.dropped")
                                    if e["data"]["reason"] == "bank_full"], "session.dropped")
        assert [d["session"] for d in dropped] == ["bank-old"]
        assert not (daemon.home / dropped[0]["file"]).exists()
        listed = json.loads(daemon.cli("session", "list", "--json").stdout)
        assert 0 < listed["bank_bytes"] <= listed["bank_limit_bytes"] == 16 << 20
        kept = {r["name"]: r["bank_bytes"] for r in listed["sessions"]}
        assert kept["bank-new"] > 0 and kept["bank-old"] == 0

        daemon.cli("config", "set", "sessions.session_save_max_mib", "1")
        Conversation(daemon, "bank-big").turn("And the sky?")
        daemon.cli("stop", MODEL)
        failed = wait_for(lambda: [e["data"] for e in daemon.events("session.save_failed")
                                   if e["data"]["session"] == "bank-big"], "session.save_failed")
        assert failed[0]["reason"] == "too_large" and "session_save_max_mib" in failed[0]["detail"]
        # On disk: the newer save only (the older was dropped, the big one never kept).
        new_file = next(Path(e["data"]["file"]).name for e in daemon.events("session.saved")
                        if e["data"]["session"] == "bank-new")
        assert {f.name for f in (daemon.home / "slots" / MODEL).glob("*.bin")} == {new_file}
    finally:
        daemon.cli("config", "set", "sessions.session_bank_mib", "2048")
        daemon.cli("config", "set", "sessions.session_save_max_mib", "1024")



def test_a_session_keeps_its_model_loaded_past_its_keep_alive_then_idle_eviction_saves_it(daemon: Daemon) -> None:
    """keep_alive 1 s, session_keep_s an hour: an instance whose slot holds a session outlives its keep-alive. Then
    session_keep_s 2 s and one more turn (its end wakes the reaper; at the latest it wakes every
    REAPER_MAX_SLEEP_S to read its settings again): once the session has been idle that long the
    reaper evicts the instance like any other, saving the session's slot first. No bound here depends on the
    machine's speed: the first wait is past a keep-alive the session's hour outlasts, the second is for an event."""
    daemon.cli_fails("stop", MODEL)
    daemon.cli("config", "set", "engine.keep_alive", "1s")
    daemon.cli("config", "set", "sessions.session_keep_s", "3600")
    try:
        conv = Conversation(daemon, "keep-1")
        trace, _, _ = conv.turn("And the sky?")
        iid = _placed(daemon, trace)["instance_id"]
        time.sleep(2)  # past its keep-alive (1 s), well within session_keep_s
        assert iid in {i["instance_id"] for i in json.loads(daemon.cli("ps", "--json").stdout)["instances"]}
        assert not [e for e in daemon.events("instance.evicted") if e["data"]["instance_id"] == iid]
        daemon.cli("config", "set", "sessions.session_keep_s", "2")
        conv.turn("And the land?")  # on `iid`, or (had the reaper woken between) on a fresh instance
        evicted = wait_for(lambda: [e["data"] for e in daemon.events("instance.evicted")
                                    if e["data"]["instance_id"] == iid], "idle eviction", timeout=60)
        obs = evicted[0]["observations"]
        assert evicted[0]["reason"] == "idle" and (obs["keep_alive_s"], obs["idle_keep_s"]) == (1.0, 2.0)
        assert obs["idle_s"] >= 2.0
        saved = [(e["data"]["reason"], e["data"]["instance_id"]) for e in daemon.events("session.saved")
                 if e["data"]["session"] == "keep-1"]
        assert ("evicted", iid) in saved
    finally:
        daemon.cli("config", "set", "engine.keep_alive", "10m")
        daemon.cli("config", "set", "sessions.session_keep_s", "1800")
