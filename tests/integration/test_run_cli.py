"""`blazar run` end to end: the real CLI, the real daemon it starts, and bench/fake_engine.py installed as the engine
(fast and deterministic: its reply is the first max_tokens words of a fixed sentence)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from blazar.adapters.engines.tiny_model import write_tiny_model
from blazar.errors import ModelNotFound
from tests.support.daemon import WAIT_S, free_port, stop_home_daemon
from tests.support.fake_serving import fake_engine
from tests.support.terminal import Pty


@pytest.fixture
def fake_home(cli, home: Path, tmp_path: Path) -> Iterator[Path]:
    """A home with the fake engine active, the tiny model imported as `tiny`, and its own port; the daemon that a
    test starts is stopped at the end."""
    binary = fake_engine.write_executable(tmp_path / "fake" / "llama-server")
    cli("engine", "install", "--path", str(binary), timeout=120)
    cli("import", str(write_tiny_model(tmp_path / "tiny.gguf")), "--name", "tiny")
    cli("config", "set", "server.port", str(free_port()))
    try:
        yield home
    finally:
        stop_home_daemon(home)


def _flat(text: str) -> str:
    return " ".join(text.split())  # rich wraps stderr at the terminal's width


def test_run_with_a_prompt_starts_the_daemon_and_prints_the_reply(cli, fake_home: Path) -> None:
    res = cli("run", "tiny", "--chat", "hi", "--max-tokens", "5", "--verbose", timeout=WAIT_S + 30)
    assert res.stdout == fake_engine.answer_text(5) + "\n"
    assert "starting one in the background" in _flat(res.stderr)
    assert "ttft" in res.stderr and "5 tokens" in res.stderr
    # The next one finds the daemon; the engine's default length applies without --max-tokens.
    res = cli("run", "tiny", "--chat", "again")
    assert res.stdout == fake_engine.answer_text(fake_engine.DEFAULT_CHUNKS) + "\n"
    assert "starting" not in res.stderr


def test_run_reads_the_prompt_from_piped_stdin(cli, fake_home: Path) -> None:
    res = cli("run", "tiny", "--chat", "--max-tokens", "3", input="a question from a pipe\n", timeout=WAIT_S + 30)
    assert res.stdout == fake_engine.answer_text(3) + "\n"
    res = cli("run", "tiny", "--chat", input="  \n", check=False)
    assert res.code == 2 and "stdin was empty" in _flat(res.stderr)


def test_run_json_prints_the_whole_answer(cli, fake_home: Path) -> None:
    answer = cli("run", "tiny", "--chat", "hi", "--max-tokens", "2", "--json", timeout=WAIT_S + 30).json()
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"]["content"] == fake_engine.answer_text(2)
    assert answer["usage"]["completion_tokens"] == 2


def test_run_on_a_base_model_continues_the_prompt_through_the_completion_route(cli, fake_home: Path) -> None:
    # The tiny GGUF has no chat template and no instruction-tuned name: a base model.
    res = cli("run", "tiny", "The sea", "--max-tokens", "3", timeout=WAIT_S + 30)
    assert res.stdout == "The sea" + fake_engine.answer_text(3) + "\n"
    said = [line for line in res.stderr.splitlines() if "is a base model" in line]
    assert len(said) == 1 and "--chat" in said[0]
    assert cli("run", "tiny", "The sea", "--max-tokens", "2", "--json").json()["object"] == "text_completion"


def test_run_an_unknown_model_exits_2_with_the_daemons_message(cli, fake_home: Path) -> None:
    res = cli("run", "nosuch", "hi", check=False, timeout=WAIT_S + 30)
    assert res.code == ModelNotFound.exit_code == 2
    assert "no model named 'nosuch'" in _flat(res.stderr)
    assert res.stdout == ""


def test_interactive_chat_keeps_the_conversation_and_ctrl_c_stops_only_the_reply(cli, fake_home: Path) -> None:
    # An engine that stops streaming while a file exists, so that Ctrl-C comes while a reply streams, however busy the
    # machine. Baked into the engine itself: the daemon passes an engine child none of its environment's FAKE_ENGINE_*.
    pause = fake_home.parent / "pause"
    paused = fake_engine.write_executable(fake_home.parent / "paused" / "llama-server", pause_file=pause)
    cli("engine", "install", "--path", str(paused), timeout=120)
    n = 100
    term = Pty(["run", "tiny", "--chat", "--max-tokens", str(n), "--verbose"], cli.env)
    try:
        term.expect(b">>> ", timeout=WAIT_S + 30)
        term.send(b"hello\r")
        first = term.expect(b">>> ").decode()
        assert fake_engine.answer_text(n) in first
        pause.touch()
        term.send(b"again\r")
        term.expect(b"The")  # its first token; the engine waits until the pause file goes
        term.send(b"\x03")  # Ctrl-C, as a terminal delivers it: SIGINT to the foreground process
        term.expect(b"(stopped)")
        pause.unlink()
        term.expect(b">>> ")
        term.send(b"more\r")
        third = term.expect(b">>> ").decode()
        term.send(b"/bye\r")
        assert term.close() == 0
    finally:
        term.kill()
    # The fake engine counts a prompt's words: the third request carried the whole conversation, the first reply
    # and the stopped one included.
    prompt_1, prompt_3 = (int(_flat(t).split("prompt ")[1].split()[0]) for t in (first, third))
    assert prompt_3 >= prompt_1 + len(fake_engine.answer_text(n).split()) + 2


def test_interactive_run_on_a_base_model_continues_each_line_on_its_own(cli, fake_home: Path) -> None:
    term = Pty(["run", "tiny", "--max-tokens", "4", "--verbose"], cli.env)
    try:
        term.expect(b"is a base model", timeout=WAIT_S + 30)
        term.expect(b"each line is continued on its own")
        term.expect(b">>> ")
        term.send(b"The sea\r")
        first = term.expect(b">>> ").decode()
        assert fake_engine.answer_text(4) in first
        term.send(b"The sea again\r")
        second = term.expect(b">>> ").decode()
        term.send(b"/bye\r")
        assert term.close() == 0
    finally:
        term.kill()
    # No conversation is carried: the second prompt is its own words only (the fake engine counts them).
    prompt_1, prompt_2 = (int(_flat(t).split("prompt ")[1].split()[0]) for t in (first, second))
    assert prompt_2 == prompt_1 + 1
