"""`blazar launch` end to end, as a subprocess against a real home, a real `blazar serve` with the real llama-server
and Gemma, and launched commands that use the official `openai`, `anthropic` and `ollama` SDKs configured only by the
environment launch gives them: the exit code passed on, the minted key scoped, not admin, and revoked afterwards
(key.* events; the secret then gets 401), signals passed on, a daemon started when none runs, and https."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx2
import openai
import pytest

from blazar.operations.launch import PLACEHOLDER_KEY
from tests.support.blazar_home import read_events
from tests.support.daemon import free_port, wait_for
from tests.support.serving import blazar_cli, serving_gemma
from tests.support.tls import self_signed, serving_tls

MODEL = "gemma"
LAUNCH_TIMEOUT_S = 300

# Every SDK configured from the environment alone; it writes what it saw to argv[1] and exits with argv[2].
CHAT_ALL_SDKS = textwrap.dedent("""
    import json, os, sys
    import anthropic, httpx, ollama, openai
    msgs = [{"role": "user", "content": "Hi"}]
    seen = {"env": {k: os.environ.get(k) for k in (
        "OPENAI_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "OLLAMA_HOST",
        "OLLAMA_API_KEY", "OPENAI_MODEL", "ANTHROPIC_MODEL")}}
    seen["loaded_first"] = [m.model for m in ollama.Client().ps().models]
    seen["openai"] = openai.OpenAI(max_retries=0).chat.completions.create(
        model=os.environ["OPENAI_MODEL"], messages=msgs, max_tokens=2).choices[0].message.role
    seen["anthropic"] = anthropic.Anthropic(max_retries=0).messages.create(
        model=os.environ["ANTHROPIC_MODEL"], max_tokens=2, messages=msgs).role
    seen["ollama"] = ollama.Client().chat(model=os.environ["OPENAI_MODEL"], messages=msgs,
                                          options={"num_predict": 2}).message.role
    seen["admin_route"] = httpx.get(os.environ["ANTHROPIC_BASE_URL"] + "/api/blazar/ps", trust_env=False,
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}).status_code
    with open(sys.argv[1], "w") as f:
        json.dump(seen, f)
    sys.exit(int(sys.argv[2]))
""")

# Says it runs (with its key), then waits for a signal: "catch" exits 42 on SIGINT/SIGTERM, "default" dies of it.
WAIT_FOR_SIGNAL = textwrap.dedent("""
    import json, os, signal, sys, time
    if sys.argv[2] == "catch":
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: sys.exit(42))
    with open(sys.argv[1] + ".tmp", "w") as f:
        json.dump({"key": os.environ["OPENAI_API_KEY"]}, f)
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(99)
""")

OPENAI_ONLY = textwrap.dedent("""
    import json, os, sys
    import openai
    answer = openai.OpenAI(max_retries=0).chat.completions.create(
        model=os.environ["OPENAI_MODEL"], messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    with open(sys.argv[1], "w") as f:
        json.dump({"finish": answer.choices[0].finish_reason, "key": os.environ["OPENAI_API_KEY"],
                   "base": os.environ["OPENAI_BASE_URL"]}, f)
""")


def launch_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "blazar.cli.main", "launch", *args]


def launch_env(home: Path) -> dict[str, str]:
    # No proxy may sit between the SDKs and the loopback daemon; no tty either (stdin is /dev/null below).
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return {**env, "BLAZAR_HOME": str(home), "NO_COLOR": "1", "COLUMNS": "200"}


def run_launch(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(launch_argv(*args), env=launch_env(home), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=LAUNCH_TIMEOUT_S)


def script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def launch_keys(home: Path) -> tuple[list[dict], list[dict]]:
    created = [e for e in read_events(home, "key.created") if e["data"]["name"].startswith("launch-")]
    revoked = [e for e in read_events(home, "key.revoked") if e["data"]["name"].startswith("launch-")]
    return created, revoked


def refused(base: str, secret: str) -> bool:
    try:
        openai.OpenAI(base_url=f"{base}/v1", api_key=secret, max_retries=0, timeout=30).models.list()
    except openai.AuthenticationError as e:
        return e.status_code == 401
    return False


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path
          ) -> Iterator[tuple[Path, str]]:
    """A running daemon with keys on (an admin key exists) and Gemma in the store."""
    home = tmp_path_factory.mktemp("launch-home")
    with serving_gemma(home, engine_binary, gemma_path, MODEL, {"ctx": 1024, "slots": 2}) as (port, _proc):
        blazar_cli(home, "keys", "create", "root", "--admin", "--json")
        yield home, f"http://127.0.0.1:{port}"


def test_the_command_chats_through_every_sdk_with_a_scoped_key_that_is_revoked_after(
        keyed: tuple[Path, str], tmp_path: Path) -> None:
    home, base = keyed
    seen_file = tmp_path / "seen.json"
    done = run_launch(home, "--model", MODEL, "--load", "--", sys.executable,
                      str(script(tmp_path, "chat.py", CHAT_ALL_SDKS)), str(seen_file), "7")
    assert done.returncode == 7, done.stderr
    seen = json.loads(seen_file.read_text())
    env = seen["env"]
    assert env["OPENAI_BASE_URL"] == f"{base}/v1" and env["ANTHROPIC_BASE_URL"] == base == env["OLLAMA_HOST"]
    assert env["OPENAI_MODEL"] == env["ANTHROPIC_MODEL"] == MODEL
    secret = env["OPENAI_API_KEY"]
    assert secret.startswith("blz_") and env["ANTHROPIC_API_KEY"] == env["OLLAMA_API_KEY"] == secret
    assert seen["openai"] == seen["anthropic"] == seen["ollama"] == "assistant"
    assert seen["admin_route"] == 403  # the launch key is not admin
    assert any(m.startswith(MODEL) for m in seen["loaded_first"])  # --load: loaded before the command ran
    created, revoked = launch_keys(home)
    (key,) = [e for e in created if e["data"]["prefix"] == secret[4:12]]
    name = key["data"]["name"]
    assert name.startswith("launch-python") and key["data"]["admin"] is False
    assert len(key["data"]["models"]) == 1 and key["data"]["models"][0].startswith(MODEL)
    assert key["data"]["expires_ts"] is not None and key["data"]["expires_ts"] > key["ts"]
    assert name in {r["data"]["name"] for r in revoked} and f"revoked key {name}" in done.stderr
    assert refused(base, secret)
    # Request events are group-committed: the command's three chats, each with its own key as the actor.
    wait_for(lambda: len([e for e in read_events(home, "request.completed") if e["actor"] == f"key:{name}"]) >= 3,
             "the command's requests, made with its key", timeout=30)


@pytest.mark.parametrize(("sig", "mode", "code"), [
    (signal.SIGINT, "catch", 42), (signal.SIGTERM, "catch", 42),
    (signal.SIGINT, "default", 128 + signal.SIGINT), (signal.SIGTERM, "default", 128 + signal.SIGTERM)])
def test_a_signal_to_launch_goes_to_the_command_and_the_key_is_revoked(
        keyed: tuple[Path, str], tmp_path: Path, sig: signal.Signals, mode: str, code: int) -> None:
    home, base = keyed
    ready = tmp_path / "running.json"
    proc = subprocess.Popen(launch_argv("--", sys.executable, str(script(tmp_path, "wait.py", WAIT_FOR_SIGNAL)),
                                        str(ready), mode),
                            env=launch_env(home), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(ready.exists, "the launched command to start", timeout=120)
        secret = json.loads(ready.read_text())["key"]
        assert not refused(base, secret)  # the key works while the command runs
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == code, stderr
    assert "revoked key launch-python" in stderr
    assert refused(base, secret)


def test_a_command_not_found_exits_127_and_its_key_is_still_revoked(keyed: tuple[Path, str]) -> None:
    home, _ = keyed
    before = len(launch_keys(home)[1])
    done = run_launch(home, "--", "blazar-no-such-command-anywhere", "--flag")
    assert done.returncode == 127
    assert "command not found: blazar-no-such-command-anywhere" in done.stderr
    assert len(launch_keys(home)[1]) == before + 1


def test_an_unknown_model_is_refused_before_anything_runs(keyed: tuple[Path, str], tmp_path: Path) -> None:
    home, _ = keyed
    before = launch_keys(home)
    marker = tmp_path / "ran"
    done = run_launch(home, "--model", "no-such-model", "--", sys.executable, "-c",
                      f"open({str(marker)!r}, 'w')")
    assert done.returncode == 2 and "no-such-model" in done.stderr and "blazar list" in done.stderr
    assert not marker.exists() and launch_keys(home) == before


def test_with_no_daemon_launch_starts_one_that_the_command_reaches_and_leaves_it_running(
        tmp_path: Path, engine_binary: Path, gemma_path: Path) -> None:
    home = tmp_path / "home"
    blazar_cli(home, "engine", "install", "--path", str(engine_binary))
    blazar_cli(home, "import", str(gemma_path), "--name", MODEL)
    port = free_port()
    for key, value in (("port", port), ("ctx", 512), ("slots", 1)):
        blazar_cli(home, "config", "set", key, str(value))
    seen_file = tmp_path / "seen.json"
    done = run_launch(home, "--", sys.executable, str(script(tmp_path, "chat.py", OPENAI_ONLY)), str(seen_file))
    daemon = home / "run" / "daemon.json"
    try:
        assert done.returncode == 0, done.stderr
        assert "no daemon is running: starting one in the background" in done.stderr
        seen = json.loads(seen_file.read_text())
        # Keys off: a placeholder key (the SDK refuses none); the only model is the default.
        assert seen["key"] == PLACEHOLDER_KEY and seen["base"] == f"http://127.0.0.1:{port}/v1"
        assert seen["finish"] in ("length", "stop")
        assert not launch_keys(home)[0]
        assert httpx2.get(f"http://127.0.0.1:{port}/health", timeout=5, trust_env=False).status_code == 200
    finally:
        if daemon.exists():
            pid = json.loads(daemon.read_text())["pid"]
            os.kill(pid, signal.SIGTERM)
            wait_for(lambda: not daemon.exists(), "the daemon launch started to stop", timeout=60)


def test_over_https_the_sdk_trusts_the_daemons_certificate_from_the_env(
        tmp_path: Path, engine_binary: Path, gemma_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    home = tmp_path / "home"
    with serving_tls(home, engine_binary, gemma_path, cert, key) as (_port, base):
        seen_file = tmp_path / "seen.json"
        done = run_launch(home, "--", sys.executable, str(script(tmp_path, "chat.py", OPENAI_ONLY)),
                          str(seen_file))
        assert done.returncode == 0, done.stderr
        seen = json.loads(seen_file.read_text())
        assert seen["base"] == f"{base}/v1" and seen["finish"] in ("length", "stop")


def test_help_names_every_variable_and_the_exit_codes(tmp_path: Path) -> None:
    done = run_launch(tmp_path / "home", "--help")
    assert done.returncode == 0
    for word in ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "OLLAMA_HOST", "OPENAI_MODEL", "revoked", "127",
                 "128+N", "--model", "--load", "--expires"):
        assert word in done.stdout, word
