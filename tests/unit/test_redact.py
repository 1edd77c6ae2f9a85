"""What an error tells a key that is not an admin's (blazar/redact.py): an error's public text, else its message with
every path of this machine, log file name and traceback taken out; the routes a message names, and URLs, kept."""

from __future__ import annotations

import sys
from pathlib import Path

from blazar.api.table import access_rules
from blazar.errors import BlazarError, DiskFull, EngineUnreachable, LoadFailed, Refused
from blazar.redact import ROUTE_HEADS, WITHHELD, machine_roots, public_message, scrub, told

HOME = "/home/ann smith/.local/share/blazar"  # a space in it: taken out whole all the same
ROOTS = (HOME, "/opt/venvs/blazar")

LOAD_FAILED = (f"gemma exited while loading (code 1): E common_init_: failed to load model '{HOME}/models/g.gguf' | "
               f"E srv load_model: failed; the engine log: {HOME}/log/instances/0f8e2433aadc.log")
PIPER_TRACEBACK = ('joe exited while loading (code 1): Traceback (most recent call last): |   File '
                   '"/opt/venvs/blazar/lib/python3.11/site-packages/piper/voice.py", line 12, in load | '
                   "onnxruntime.InvalidProtobuf: Load model from /srv/blazar/models/joe/joe.onnx failed")


def test_the_homes_paths_are_taken_out_whole_even_with_a_space_in_them() -> None:
    out = scrub(LOAD_FAILED, ROOTS)
    assert HOME not in out and "ann" not in out and "smith" not in out and ".log" not in out
    assert out == (f"gemma exited while loading (code 1): E common_init_: failed to load model '{WITHHELD}' | "
                   f"E srv load_model: failed; the engine log: {WITHHELD}")


def test_a_traceback_is_cut_where_it_starts_and_no_path_is_left() -> None:
    out = scrub(PIPER_TRACEBACK, ROOTS)
    assert out == "joe exited while loading (code 1) (the rest is withheld)"
    # A traceback's frames alone (no header line in the tail) are cut too.
    frames = scrub('x | File "/usr/lib/python3/dist-packages/a.py", line 3, in f | ValueError: no', ())
    assert frames == "x (the rest is withheld)"


def test_any_other_absolute_path_and_any_log_name_is_withheld_but_routes_and_urls_stay() -> None:
    assert scrub("cannot start /usr/local/bin/llama-server: Permission denied") == \
        f"cannot start {WITHHELD}: Permission denied"
    assert scrub("see daemon.log and log/instances/abc.log") == f"see {WITHHELD} and {WITHHELD}"
    kept = ("model 'w' is a whisper model; it serves /v1/audio/transcriptions and /v1/audio/translations; "
            "/api/blazar/ps needs an admin key; the engine at http://127.0.0.1:4444 did not answer /completion: "
            "reset; 12 tokens/s, 1/2 and/or")
    assert scrub(kept, ROOTS) == kept


def test_every_routes_first_segment_is_kept() -> None:
    ROUTES = access_rules()
    heads = {route.split("/")[1] for route in ROUTES}
    assert heads <= ROUTE_HEADS, heads - ROUTE_HEADS
    for route in ROUTES:
        assert scrub(f"{route} needs a key") == f"{route} needs a key"


def test_the_machines_roots_are_the_home_the_users_home_the_interpreters_and_the_temporary_directory(
        tmp_path: Path) -> None:
    roots = machine_roots(tmp_path / "home")
    assert str(tmp_path / "home") in roots and sys.prefix in roots and str(Path.home()) in roots
    assert list(roots) == sorted(roots, key=len, reverse=True)  # a home inside another root goes out whole
    assert "" not in roots and "/" not in roots


def test_a_key_is_told_the_public_text_and_the_owner_the_message() -> None:
    e = LoadFailed(LOAD_FAILED, public="gemma could not be loaded: its engine exited while loading")
    assert told(e, detail=True, roots=ROOTS) == LOAD_FAILED
    assert told(e, detail=False, roots=ROOTS) == "gemma could not be loaded: its engine exited while loading"
    # A class's own public text, for every error of it; none: the message scrubbed.
    full = DiskFull(f"no space left on /dev/sda1 for {HOME}/blazar.db", mount="/", free_bytes=0, needed_bytes=1,
                    writing="the log")
    assert public_message(full, ROOTS) == DiskFull.PUBLIC and "/dev" not in public_message(full, ROOTS)
    assert public_message(EngineUnreachable("the engine at http+unix:///x did not answer")) == \
        EngineUnreachable.PUBLIC
    assert public_message(BlazarError(f"cannot open {HOME}/config.toml"), ROOTS) == f"cannot open {WITHHELD}"


def test_a_refusal_made_from_an_error_carries_its_public_text_on() -> None:
    e = LoadFailed(LOAD_FAILED, public="gemma could not be loaded")
    refused = Refused(e.message, reason=e.code, http_status=e.http_status, public=e.public)
    assert refused.message == LOAD_FAILED and public_message(refused, ROOTS) == "gemma could not be loaded"
    assert Refused("queue full", reason="queue_full").public is None


def test_a_bug_of_ours_says_nothing_of_itself_to_a_key() -> None:
    bug = FileNotFoundError(2, "No such file or directory", f"{HOME}/files/f-1")
    assert told(bug, detail=False, roots=ROOTS) == "internal error: the server's owner can see it in the daemon log"
    assert told(bug, detail=True, roots=ROOTS).startswith("internal error: FileNotFoundError:")
