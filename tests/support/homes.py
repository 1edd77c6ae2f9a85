"""Homes made once per test session and cloned: a home with the real engine installed (verified and smoke-tested)
and a model imported costs about ten seconds of CLI processes and a smoke test; a clone costs a fraction of a second.

The first home of each kind is made through the real CLI (`blazar engine install --path`, `blazar import`, `blazar
model set --template`), as a user would; every later one is a copy of it: the log copied with SQLite's backup API
(a consistent copy, WAL included), config.toml and the engine store copied, the model store hardlinked (the store is
content-addressed and a model file is never written in place, so homes share it read-only). A clone is a home like
any other: its own log, its own engine files, its own run/ and log/ (empty). Tests that are about installing,
importing or a home's first moments make their own home instead (tests/integration/test_engine_cli.py,
test_models_cli.py...)."""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from tests.support.blazar_home import home_paths
from tests.support.bounds import HANG_S

if TYPE_CHECKING:
    from blazar.context import Blazar
    from blazar.events.models import TemplateTrial
    from blazar.projections.catalog import StoredModel

_LOCK = threading.Lock()
_TEMPLATES: dict[tuple[str, ...], Path] = {}
_SESSION_DIR: list[Path] = []


def session_file(name: str, make: Callable[[Path], Path]) -> Path:
    """A file made once per test process (`make(path)` writes it) and shared read-only: the fake engine, the tiny
    model. Under the system's temporary directory, as test homes are (a hardlink needs one filesystem), and removed
    when the process exits."""
    with _LOCK:
        if not _SESSION_DIR:
            _SESSION_DIR.append(Path(tempfile.mkdtemp(prefix="blazar-test-session-")))
            atexit.register(shutil.rmtree, _SESSION_DIR[0], True)
        path = _SESSION_DIR[0] / name
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            make(path)
        return path


def clone_home(template: Path, dest: Path) -> Path:
    """`dest` (empty or missing) made a copy of the home `template` (which no daemon is serving)."""
    src, dst = home_paths(template), home_paths(dest)
    dest.mkdir(parents=True, exist_ok=True)
    os.chmod(dest, 0o700)
    for name in ("config.toml",):
        if (src.config_dir / name).exists():
            shutil.copy2(src.config_dir / name, dst.config_dir / name)
    with sqlite3.connect(src.db) as source, sqlite3.connect(dst.db) as target:
        source.backup(target)
    os.chmod(dst.db, 0o600)
    if src.engines.exists():
        shutil.copytree(src.engines, dst.engines, symlinks=True)
    if src.models.exists():
        shutil.copytree(src.models, dst.models, symlinks=True, copy_function=os.link)
    return dest


def _templates_dir(anchor: Path) -> Path:
    d = anchor.parent / "home-templates"
    d.mkdir(exist_ok=True)
    return d


def model_home(dest: Path, engine_binary: Path, model_path: Path, model: str, *, template_text: str | None = None,
               mmproj: Path | None = None, cli=None, probed: bool = True) -> Path:
    """`dest` made a home with `engine_binary` installed and `model_path` imported as `model` (with `mmproj` as its
    projector, and `template_text` as its chat template when given): cloned from the session's template of that
    kind, which the first call makes through the real CLI (`cli(home, *args)`: tests/support/serving.py's
    blazar_cli). On the real engine the model comes `probed` (its template probe recorded, as its first load would
    record it: `record_probe`), so a test's first load is the load of a model that was served before; a test about
    the first load itself asks for `probed=False`."""
    from tests.support.serving import blazar_cli

    cli = cli or blazar_cli
    key = (str(engine_binary), str(model_path), model, template_text or "", str(mmproj or ""), str(probed))
    with _LOCK:
        template = _TEMPLATES.get(key)
        if template is None:
            template = _templates_dir(model_path) / f"t{len(list(_templates_dir(model_path).iterdir()))}"
            template.mkdir()
            cli(template, "engine", "install", "--path", str(engine_binary))
            cli(template, "import", str(model_path), "--name", model, *(["--mmproj", str(mmproj)] if mmproj else []))
            if probed and template_text is None and _real_engine(engine_binary):
                record_probe(template, engine_binary, model_path, model)
            if template_text is not None:
                (template / "template.jinja").write_text(template_text)
                cli(template, "model", "set", model, "--template", str(template / "template.jinja"))
            _TEMPLATES[key] = template
    return clone_home(template, dest)


_PROBES: dict[tuple[str, str], list[TemplateTrial]] = {}


def _real_engine(binary: Path) -> bool:
    """llama-server itself (an executable file), not the fake engine's script."""
    with binary.open("rb") as f:
        return f.read(4) == b"\x7fELF"


def record_probe(home: Path, engine_binary: Path, model_path: Path, model: str) -> None:
    """`model`'s template probe recorded in `home` (`record_probe_in`)."""
    from blazar.bootstrap import bootstrap

    async def go() -> None:
        app = await bootstrap(paths=home_paths(home), env={}, actor="test:pytest")
        try:
            await record_probe_in(app, engine_binary, model_path, model)
        finally:
            await app.close()

    asyncio.run(go())


async def record_probe_in(app: Blazar, engine_binary: Path, model_path: Path, model: str) -> None:
    """`model`'s template probe recorded in `app`'s log as its first load would record it, measured once per test
    process by the probe's own code (blazar/instances/template_probe.py) on a llama-server of its own with the model:
    for a test whose first load is not about the probe."""
    from blazar.events.models import ModelTemplateProbed
    from blazar.instances.template_probe import MAX_TOKENS, PROMPTS, choose
    from blazar.projections.catalog import stored
    from blazar.store.engines import active_engine

    got = stored(app.runner.state("catalog"), model)
    assert got is not None
    key = (str(engine_binary), got.sha256)
    if key not in _PROBES:
        _PROBES[key] = await _measure(engine_binary, model_path, got)
    trials = _PROBES[key]
    await app.record(ModelTemplateProbed(name=model, sha256=got.sha256, engine_tag=active_engine(app).tag,
                                         prompts=len(PROMPTS), max_tokens=MAX_TOKENS, trials=trials,
                                         chosen=choose(trials)))


async def _measure(engine_binary: Path, model_path: Path, got: StoredModel) -> list[TemplateTrial]:
    from blazar.adapters.engines import process
    from blazar.adapters.engines.client import EngineClient
    from blazar.instances.template_probe import measure
    from blazar.store.chat_templates import probe_candidates

    port = process.free_port()
    log = Path(tempfile.mkdtemp(prefix="blazar-probe-")) / "engine.log"
    proc = await process.spawn([str(engine_binary), "-m", str(model_path), "--host", "127.0.0.1", "--port",
                                str(port), "-c", "1024", "-np", "1"], log_path=log, env=os.environ)
    client = EngineClient(max_connections=1)
    try:
        await process.wait_healthy(proc, port, timeout_s=HANG_S)
        return await measure(client, f"http://127.0.0.1:{port}", None, probe_candidates(got.metadata, None))
    finally:
        await client.aclose()
        await process.stop_process(proc, grace_s=5)
        shutil.rmtree(log.parent, ignore_errors=True)


def configure_all(home: Path, settings: Mapping[str, object]) -> None:
    """`blazar config set KEY VALUE` for each setting, in this process and one bootstrap (each a config.changed
    event, as the CLI records it)."""
    if not settings:
        return
    from blazar.bootstrap import bootstrap
    from blazar.operations.config import set_value

    async def go() -> None:
        app = await bootstrap(paths=home_paths(home), env={}, actor="test:pytest")
        try:
            for key, value in settings.items():
                await set_value(app, key, str(value))
        finally:
            await app.close()

    asyncio.run(go())
