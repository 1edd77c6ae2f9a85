"""The audio routes' uploads directory: a transcription's file lives there only while its request runs, so what a
daemon that died mid-request left behind (someone's audio) is removed before the next one serves. And the form the
whisper child is sent: the client's fields, and the gateway's bound on the audio's length, which no client sets."""

from __future__ import annotations

from blazar.adapters.engines.kinds import BEAM_FIELD, MAX_AUDIO_FIELD
from blazar.api.audio import _multipart, _Upload, clear_uploads, path_limits, uploads_dir
from blazar.children.whisper import parse_form
from blazar.context import Blazar


async def test_what_a_dead_daemon_left_in_uploads_is_removed_and_nothing_else(app: Blazar) -> None:
    d = uploads_dir(app)
    assert d.stat().st_mode & 0o777 == 0o700  # for the owner only: it holds callers' audio
    (d / "audio-abc123").write_bytes(b"RIFF....")
    (d / "audio-def456").write_bytes(b"ID3")
    (d / "README").write_text("not an upload")
    assert clear_uploads(app) == 2
    assert sorted(p.name for p in d.iterdir()) == ["README"]
    assert clear_uploads(app) == 0


def test_the_upload_routes_body_bound_is_the_audio_bound_not_max_body_mib() -> None:
    limits = path_limits(25)
    assert set(limits) == {"/v1/audio/transcriptions", "/v1/audio/translations"}
    assert all(25 << 20 < v < 26 << 20 for v in limits.values())


def test_the_child_is_told_the_gateways_max_audio_s_and_never_a_clients() -> None:
    up = _Upload()
    up.fields = {"model": ["whisper-base"], "language": ["en"], MAX_AUDIO_FIELD: ["999999"], BEAM_FIELD: ["16"]}
    content_type, body = _multipart(up, b"ID3 the audio", 10.0)
    form = parse_form(body, content_type)
    assert form[MAX_AUDIO_FIELD] == (None, b"10.0")
    assert body.count(MAX_AUDIO_FIELD.encode()) == 1  # the client's is dropped, not merely outvoted
    assert BEAM_FIELD not in form  # the gateway's field alone: a client's is dropped
    assert form["model"] == (None, b"whisper-base") and form["language"] == (None, b"en")
    assert form["file"] == ("audio", b"ID3 the audio")
