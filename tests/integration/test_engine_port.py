"""The engine port is locked, end to end: a real `blazar serve` loads the real Gemma into a real llama-server, whose
port then refuses anyone without the child's own key (chat, slot saves), while chat through the gateway works; the
child never sees the daemon's HF_TOKEN; and what Blazar wrote under its home is the owner's alone."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import httpx2
import openai
import pytest

from tests.support.serving import blazar_cli, serving_gemma

MODEL = "gemma"


def test_the_child_port_is_locked_and_the_home_is_private(tmp_path: Path, engine_binary: Path, gemma_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_must_not_reach_the_engine")
    home = tmp_path / "home"
    with serving_gemma(home, engine_binary, gemma_path, MODEL, {"ctx": 512, "slots": 1}) as (port, _proc):
        blazar_cli(home, "load", MODEL)
        (row,) = json.loads(blazar_cli(home, "ps", "--json").stdout)["instances"]
        child = f"http://127.0.0.1:{row['port']}"
        with httpx2.Client(trust_env=False, timeout=30) as c:
            chat = c.post(f"{child}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                                 "max_tokens": 2})
            assert chat.status_code == 401
            save = c.post(f"{child}/slots/0?action=save", json={"filename": "stolen.bin"})
            assert save.status_code == 401
            # A client's own Authorization is never the child's key: the gateway sends its own.
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="client-key-not-forwarded",
                                   max_retries=0, timeout=120)
            answer = client.chat.completions.create(model=MODEL, max_tokens=2,
                                                    messages=[{"role": "user", "content": "hi"}])
            assert answer.choices[0].finish_reason in ("length", "stop")
            forwarded = c.post(f"{child}/v1/chat/completions", headers={"Authorization":
                                                                        "Bearer client-key-not-forwarded"},
                               json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
            assert forwarded.status_code == 401
        environ = Path(f"/proc/{row['pid']}/environ").read_bytes()
        assert b"HF_TOKEN" not in environ and b"hf_must_not_reach_the_engine" not in environ
        assert b"PATH=" in environ
        slots = home / "slots"
        for d in [slots, *slots.iterdir()]:
            assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
        logs = list((home / "log" / "instances").glob("*.log"))
        assert logs and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in logs)
        keyfiles = list((home / "run" / "instances").glob("*.key"))
        assert len(keyfiles) == 1 and stat.S_IMODE(keyfiles[0].stat().st_mode) == 0o600
        events = blazar_cli(home, "events", "--type", "instance.started", "--json").stdout
        assert keyfiles[0].read_text().strip() not in events  # the key is never in the log
        blazar_cli(home, "stop", MODEL)
    assert not list((home / "run" / "instances").glob("*.key"))  # gone with its instance
    _assert_private(home)


def _assert_private(home: Path) -> None:
    """Every directory 0700 and every file 0600 (0700 if executable). The model store's files are hardlinks to the
    user's own imported file, whose mode is theirs; the store's directory (0700) is what keeps others out."""
    loose = []
    for root, dirs, files in os.walk(home):
        for d in dirs:
            mode = stat.S_IMODE((Path(root) / d).stat().st_mode)
            if mode & 0o077:
                loose.append(f"{root}/{d} {mode:o}")
        if Path(root) == home / "models":
            continue
        for f in files:
            p = Path(root) / f
            if p.is_symlink():
                continue
            mode = stat.S_IMODE(p.stat().st_mode)
            if mode & 0o077:
                loose.append(f"{p} {mode:o}")
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert not loose, loose
