"""The audio routes' uploads directory: a transcription's file lives there only while its request runs, so what a
daemon that died mid-request left behind (someone's audio) is removed before the next one serves."""

from __future__ import annotations

from blazar.api.audio import clear_uploads, path_limits, uploads_dir
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
