"""Settings validation, config.toml writes, and the config handlers' events."""

from __future__ import annotations

import logging
import tomllib

import pytest

from blazar import config as settings
from blazar.bootstrap import bootstrap
from blazar.context import Blazar
from blazar.errors import ConfigError
from blazar.events.system import ConfigChanged
from blazar.operations.config import reconcile_file, set_value, unset_value


def test_parse_value_converts_and_validates() -> None:
    assert settings.parse_value("telemetry.pii_scrub", "no") is False
    assert settings.parse_value("log.checkpoint_every", "500") == 500
    assert settings.parse_value("log.group_commit_ms", "2.5") == 2.5
    assert settings.parse_value("telemetry.log_level", "debug") == "debug"


@pytest.mark.parametrize(
    ("key", "text", "message"),
    [
        ("telemetry.log_level", "loud", "expected one of: debug, info, warning, error"),
        ("log.checkpoint_every", "5", "expected an integer from 100 to 10000000"),
        ("log.checkpoint_every", "many", "expected an integer from 100 to 10000000"),
        ("telemetry.pii_scrub", "maybe", "expected true or false"),
        ("colour", "red", "unknown config key 'colour'; valid keys: section.key, the sections being server, log"),
    ],
)
def test_invalid_values_are_refused_with_the_valid_choices(key: str, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        settings.parse_value(key, text)


def test_write_file_is_atomic_and_keeps_a_backup(tmp_path) -> None:
    path = tmp_path / "config.toml"
    settings.write_file(path, {"telemetry.log_level": "info"})
    settings.write_file(path, {"telemetry.log_level": "error"})
    assert settings.read_file(path) == {"telemetry.log_level": "error"}
    assert settings.read_file(path.with_name("config.toml.bak")) == {"telemetry.log_level": "info"}
    assert not list(tmp_path.glob(".config.toml.*.tmp"))


def test_read_file_reports_the_file_and_key(tmp_path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[telemetry]\nlog_level = "shouty"\n')
    with pytest.raises(ConfigError, match=r"config.toml: invalid value 'shouty' for telemetry.log_level"):
        settings.read_file(path)
    path.write_text("[telemetry]\nlog_level = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        settings.read_file(path)


async def test_set_writes_the_file_and_records_the_change(app: Blazar) -> None:
    rec = await set_value(app, "telemetry.log_level", "debug")
    assert rec is not None and rec.event.model_dump() == {
        "key": "telemetry.log_level", "old": None, "new": "debug", "source": "cli"}
    assert settings.read_file(app.paths.config_file) == {"telemetry.log_level": "debug"}
    assert app.settings().telemetry.log_level == "debug"
    assert await set_value(app, "telemetry.log_level", "debug") is None  # no change, no event
    assert await app.log.last_seq() == 1


async def test_invalid_set_changes_nothing(app: Blazar) -> None:
    with pytest.raises(ConfigError):
        await set_value(app, "log.checkpoint_every", "1")
    with pytest.raises(ConfigError, match=r"server.cors_origins: a value of .* a setting holds at most 8,192"):
        await set_value(app, "server.cors_origins", ",".join(f"http://h{i}.example" for i in range(600)))
    assert not app.paths.config_file.exists()
    assert await app.log.last_seq() == 0


async def test_unset_returns_to_default_and_records_it(app: Blazar) -> None:
    await set_value(app, "log.checkpoint_every", "500")
    rec = await unset_value(app, "log.checkpoint_every")
    assert rec is not None and rec.event.old == 500 and rec.event.new is None
    assert settings.read_file(app.paths.config_file) == {}
    assert app.settings().log.checkpoint_every == 10_000


async def test_unset_repairs_an_unknown_key_without_an_event(app: Blazar) -> None:
    app.paths.config_file.write_text('bogus = 1\n[telemetry]\nlog_level = "info"\n')
    assert await unset_value(app, "bogus") is None
    assert settings.read_file(app.paths.config_file) == {"telemetry.log_level": "info"}


async def test_hand_edits_are_recorded_at_the_next_start(paths, clock) -> None:
    app = await bootstrap(paths=paths, clock=clock, actor="test")
    await set_value(app, "telemetry.log_level", "debug")
    await app.close()
    paths.config_file.write_text('[telemetry]\nlog_level = "error"\npii_scrub = false\n')
    app = await bootstrap(paths=paths, clock=clock, actor="test")
    try:
        events = [r.event async for r in app.log.read()]
        assert [(e.key, e.old, e.new, e.source) for e in events[1:]] == [
            ("telemetry.log_level", "debug", "error", "file"),
            ("telemetry.pii_scrub", None, False, "file"),
        ]
        assert app.settings().telemetry.pii_scrub is False
        assert await reconcile_file(app) == []  # already in step: nothing more is recorded
    finally:
        await app.close()


async def test_a_broken_config_file_stops_start_up_with_a_clear_error(paths, clock) -> None:
    paths.ensure()
    paths.config_file.write_text("prot = 1\n")
    with pytest.raises(ConfigError, match="unknown config key 'prot'"):
        await bootstrap(paths=paths, clock=clock)


async def test_group_commit_ms_sets_the_request_writer_interval(paths, clock) -> None:
    app = await bootstrap(paths=paths, clock=clock, actor="test")
    await set_value(app, "log.group_commit_ms", "20")
    writer = app.request_writer()
    assert writer.interval == 0.02 and app.request_writer() is writer
    from blazar.events.system import SnapshotTaken

    writer.submit(SnapshotTaken(path="/x", seq_last=1, event_count=1, db_sha256="0" * 64), actor="test")
    await app.close()  # drains the writer
    app = await bootstrap(paths=paths, clock=clock, actor="test")
    try:
        assert [r.type async for r in app.log.read()] == ["config.changed", "snapshot.taken"]
    finally:
        await app.close()


async def test_a_hand_edit_too_large_to_record_is_refused_at_start_naming_it(paths, clock) -> None:
    paths.config_file.parent.mkdir(parents=True, exist_ok=True)
    origins = ", ".join(f'"http://h{i}.example"' for i in range(600))
    paths.config_file.write_text(f"[server]\ncors_origins = [{origins}]\n")
    with pytest.raises(ConfigError, match=r"config\.toml: server.cors_origins: a value of"):
        app = await bootstrap(paths=paths, clock=clock, actor="test")
        await app.close()


async def test_settings_are_built_once_per_change_of_the_overrides(app: Blazar) -> None:
    first = app.settings()
    assert app.settings() is first  # asked again (each request asks): the same, not validated again
    await set_value(app, "telemetry.log_level", "debug")
    changed = app.settings()
    assert changed is not first and changed.telemetry.log_level == "debug" and app.settings() is changed
    await unset_value(app, "telemetry.log_level")
    assert app.settings().telemetry.log_level == first.telemetry.log_level


def test_write_file_writes_one_table_per_section(tmp_path) -> None:
    path = tmp_path / "config.toml"
    settings.write_file(path, {"server.port": 8080, "telemetry.otlp_headers": {"a": "b"}, "log.checkpoint_every": 500})
    assert tomllib.loads(path.read_text()) == {
        "log": {"checkpoint_every": 500}, "server": {"port": 8080}, "telemetry": {"otlp_headers": {"a": "b"}}}


def test_an_old_flat_config_file_is_read_under_the_new_keys_saying_so(tmp_path, caplog) -> None:
    path = tmp_path / "config.toml"
    path.write_text('port = 8080\notlp_headers = {a = "b"}\n[telemetry]\nlog_level = "info"\n')
    with caplog.at_level(logging.WARNING, logger="blazar.config"):
        assert settings.read_file(path) == {
            "server.port": 8080, "telemetry.otlp_headers": {"a": "b"}, "telemetry.log_level": "info"}
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: the config key 'port' is deprecated: it is now 'server.port'",
        f"{path}: the config key 'otlp_headers' is deprecated: it is now 'telemetry.otlp_headers'",
    ]


def test_an_unknown_key_in_a_section_is_refused_naming_it(tmp_path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[server]\nprot = 1\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'server\.prot'"):
        settings.read_file(path)


def test_every_old_flat_name_is_the_name_of_one_key_in_its_section() -> None:
    assert len(settings.OLD_KEYS) == 77  # the keys there were before sections: none is lost
    assert all(key.partition(".")[2] == old and key in settings.FIELDS for old, key in settings.OLD_KEYS.items())
    assert settings.current_key("keep_alive") == "engine.keep_alive" == settings.current_key("engine.keep_alive")


async def test_setting_an_old_key_records_and_writes_its_new_key_saying_so(app: Blazar, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="blazar.config"):
        rec = await set_value(app, "queue_depth", "7")
    assert rec is not None and rec.event.key == "queue.queue_depth"
    assert [r.getMessage() for r in caplog.records] == [
        "config set: the config key 'queue_depth' is deprecated: it is now 'queue.queue_depth'"]
    assert tomllib.loads(app.paths.config_file.read_text()) == {"queue": {"queue_depth": 7}}
    assert app.settings().queue.queue_depth == 7


async def test_setting_a_key_rewrites_an_old_flat_file_in_sections(app: Blazar) -> None:
    app.paths.config_file.write_text("port = 8080\n")
    await reconcile_file(app)
    await set_value(app, "fit.ctx", "4096")
    assert tomllib.loads(app.paths.config_file.read_text()) == {"server": {"port": 8080}, "fit": {"ctx": 4096}}
    await unset_value(app, "port")  # an old name unsets its new key
    assert settings.read_file(app.paths.config_file) == {"fit.ctx": 4096}


async def test_an_old_flat_file_matches_a_log_that_recorded_its_keys_flat(paths, clock) -> None:
    """A home from before sections: its config.toml and its config.changed events name flat keys. Nothing is
    recorded again at start (the events are read under the new names), and the settings hold."""
    app = await bootstrap(paths=paths, clock=clock, actor="test", reconcile_config=False)
    await app.record(ConfigChanged(key="queue_depth", old=None, new=5, source="cli"))
    await app.close()
    paths.config_file.write_text("queue_depth = 5\n")
    app = await bootstrap(paths=paths, clock=clock, actor="test")
    try:
        assert await app.log.last_seq() == 1
        assert app.overrides() == {"queue.queue_depth": 5} and app.settings().queue.queue_depth == 5
    finally:
        await app.close()


@pytest.mark.parametrize(("overrides", "chosen"), [({}, False), ({"fit.slots": 2}, False), ({"fit.ctx": 4096}, True),
                                                    ({"fit.ctx": 8192}, True), ({"ctx": 2048}, True)])
def test_a_context_is_chosen_only_when_the_owner_set_fit_ctx(overrides: dict[str, object], chosen: bool) -> None:
    # A prompt over the context grows it (serving/routing.py) unless the owner chose one, even the default's value.
    assert settings.build({settings.current_key(k): v for k, v in overrides.items()}).fit.ctx_chosen is chosen


def test_an_unknown_key_names_the_nearest_and_its_sections_keys_not_all_of_them() -> None:
    message = str(settings.unknown_key("fit.ctxx"))
    assert "(did you mean 'fit.ctx'?)" in message and "valid keys in [fit]: fit.ctx, fit.slots" in message
    assert "server.port" not in message
    assert "(did you mean 'fit.ctx'?)" in str(settings.unknown_key("ctxx"))  # an old flat name: its new key
