"""The smoke gate against the real llama-server on the tiny model, and against stand-ins that crash, never turn
healthy, or answer without tokens: each is a failed SmokeResult with the facts, never an exception."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path

import gguf
import pytest

from blazar.adapters.engines.llama_server import Capabilities, parse_help, probe
from blazar.adapters.engines.smoke import smoke_argv, smoke_test
from blazar.adapters.engines.tiny_model import write_tiny_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "llama_server"
REAL_ENGINE_BOUND_MS = 30_000  # the tiny model loads in tens of milliseconds; this only catches a hang

# A stand-in llama-server: --version/--help print the real outputs; otherwise it runs BODY.
SHELL = textwrap.dedent('''\
    #!/bin/sh
    case "$1" in
      --version) cat "{fixtures}/version.txt"; exit 0;;
      --help) cat "{fixtures}/help.txt"; exit 0;;
    esac
    echo "main: loading model: $*"
    {body}
''')

# A stand-in HTTP engine: /health answers HEALTH; POST /completion answers a body with TOKENS predicted, or dies of
# SIGILL when TOKENS is negative (a kernel only the decode path uses). Given --api-key-file, as llama-server does, it
# refuses (401) a POST without that key.
SERVER = textwrap.dedent('''
    import http.server, json, os, signal, sys
    health, tokens = int(sys.argv[1]), int(sys.argv[2])
    port = int(sys.argv[sys.argv.index("--port") + 1])
    key = None
    if "--api-key-file" in sys.argv:
        key = open(sys.argv[sys.argv.index("--api-key-file") + 1]).read().strip()

    class H(http.server.BaseHTTPRequestHandler):
        def reply(self, code, body):
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())

        def do_GET(self):
            self.reply(health, {"status": "ok"} if health == 200 else {"error": "loading"})

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            if key is not None and self.headers.get("Authorization") != "Bearer " + key:
                return self.reply(401, {"error": {"message": "Invalid API Key"}})
            if tokens < 0:
                os.kill(os.getpid(), signal.SIGILL)
            self.reply(200, {"content": "", "tokens_predicted": tokens})

        def log_message(self, *args):
            pass

    print("standin listening", flush=True)
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
''')


def _standin(tmp_path: Path, body: str) -> Path:
    exe = tmp_path / "bin" / "llama-server"
    exe.parent.mkdir(exist_ok=True)
    exe.write_text(SHELL.format(fixtures=FIXTURES, body=body))
    exe.chmod(0o755)
    return exe


def _server_standin(tmp_path: Path, *, health: int, tokens: int) -> Path:
    script = tmp_path / "bin" / "server.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(SERVER)
    return _standin(tmp_path, f'exec "{sys.executable}" "{script}" {health} {tokens} "$@"')


def _running_with(fragment: str) -> list[int]:
    """Pids whose command line mentions `fragment`: the gate must leave no engine behind."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if fragment.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.fixture(scope="module")
def help_caps() -> Capabilities:
    return parse_help((FIXTURES / "help.txt").read_text())


def test_tiny_model_is_deterministic_small_and_a_llama_gguf(tmp_path) -> None:
    a = write_tiny_model(tmp_path / "a.gguf")
    b = write_tiny_model(tmp_path / "sub" / "b.gguf")
    assert a.read_bytes() == b.read_bytes()
    assert a.stat().st_size < 512 * 1024
    reader = gguf.GGUFReader(a)
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "llama"
    types = reader.fields["tokenizer.ggml.token_type"]
    assert sum(1 for i in types.data if types.parts[i][0] == gguf.TokenType.BYTE) == 256
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["a.gguf", "b.gguf"]  # no temp file left


def test_smoke_argv_uses_listed_flags_for_a_light_start(help_caps, tmp_path) -> None:
    argv = smoke_argv(Path("/e/llama-server"), help_caps, tmp_path / "tiny.gguf", 4242)
    assert argv == ["/e/llama-server", "-m", str(tmp_path / "tiny.gguf"), "--host", "127.0.0.1", "--port", "4242",
                    "-c", "256", "-np", "1", "-t", "2"]


async def test_smoke_passes_on_the_real_engine(engine_binary, tmp_path) -> None:
    _, caps = probe(engine_binary)
    work = tmp_path / "smoke"
    res = await smoke_test(engine_binary, caps, workdir=work, env=os.environ)
    assert res.passed, res.detail + "\n" + "\n".join(res.log_tail)
    assert res.tokens == 8  # n_predict with ignore_eos
    assert res.exit_code is None
    assert 0 < res.duration_ms < REAL_ENGINE_BOUND_MS
    assert "generated 8 tokens" in res.detail
    assert any("model loaded" in line or "listening" in line for line in res.log_tail)
    assert (work / "smoke.log").is_file()
    assert _running_with(str(work)) == []
    assert not (work / "smoke.key").exists()  # the child had its own key (its /completion needs it), now gone


async def test_smoke_fails_with_the_exit_code_and_log_tail_when_the_engine_crashes(tmp_path) -> None:
    exe = _standin(tmp_path, "kill -ILL $$")
    _, caps = probe(exe)
    res = await smoke_test(exe, caps, workdir=tmp_path / "smoke", env=os.environ, timeout_s=30)
    assert not res.passed
    assert res.exit_code == -signal.SIGILL
    assert "SIGILL" in res.detail and "loading model" in res.detail  # the cause and the last log line
    assert any(line.startswith("main: loading model: -m ") for line in res.log_tail)
    assert res.tokens == 0


async def test_smoke_fails_by_timeout_when_the_engine_never_turns_healthy(tmp_path) -> None:
    exe = _server_standin(tmp_path, health=503, tokens=8)
    _, caps = probe(exe)
    work = tmp_path / "smoke"
    res = await smoke_test(exe, caps, workdir=work, env=os.environ, timeout_s=1.5)
    assert not res.passed
    assert "not healthy after 1.5s" in res.detail
    assert res.exit_code is None  # it did not die: the gate stopped it
    assert 1500 <= res.duration_ms < 1500 + REAL_ENGINE_BOUND_MS
    assert any(line.startswith("main: loading model") for line in res.log_tail)
    assert _running_with(str(work)) == []


async def test_smoke_fails_when_the_engine_generates_no_tokens(tmp_path) -> None:
    exe = _server_standin(tmp_path, health=200, tokens=0)
    _, caps = probe(exe)
    work = tmp_path / "smoke"
    res = await smoke_test(exe, caps, workdir=work, env=os.environ, timeout_s=30)
    assert not res.passed and res.tokens == 0
    assert "generated no tokens" in res.detail
    assert _running_with(str(work)) == []


async def test_smoke_reports_the_exit_code_when_the_engine_crashes_mid_request(tmp_path) -> None:
    exe = _server_standin(tmp_path, health=200, tokens=-1)
    _, caps = probe(exe)
    res = await smoke_test(exe, caps, workdir=tmp_path / "smoke", env=os.environ, timeout_s=30)
    assert not res.passed and res.exit_code == -signal.SIGILL
    assert "killed by SIGILL (exit code -4) during /completion" in res.detail


async def test_smoke_of_a_missing_binary_fails_without_raising(help_caps, tmp_path) -> None:
    res = await smoke_test(tmp_path / "absent" / "llama-server", help_caps, workdir=tmp_path / "smoke", env=os.environ,
                           timeout_s=5)
    assert not res.passed and res.exit_code is None
    assert "cannot start" in res.detail and "absent" in res.detail


async def test_smoke_fails_without_raising_when_the_binary_lists_no_port_flag(tmp_path) -> None:
    caps = parse_help("-m,    --model FNAME      model path\n--host HOST     address\n")
    res = await smoke_test(Path(os.devnull), caps, workdir=tmp_path / "smoke", env=os.environ, timeout_s=5)
    assert not res.passed and "--port" in res.detail
