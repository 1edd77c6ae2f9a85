"""The engine store as the api and `blazar engine list|show` read it: each installed engine typed, which one is active
and which one `engine rollback` would activate, and the JSON both show an engine as."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from blazar.context import Blazar
from blazar.projections import engines
from blazar.projections.engines import InstalledEngine

__all__ = ["InstalledEngine", "active_tag", "engine", "engine_json", "installed_engines", "rollback_target"]


def engine(app: Blazar, tag: str) -> InstalledEngine | None:
    """The engine tagged `tag`, or None."""
    return engines.installed(app.runner.state("engines"), tag)


def installed_engines(app: Blazar) -> list[InstalledEngine]:
    """Every installed engine, oldest install first."""
    return sorted(engines.engines(app.runner.state("engines")), key=lambda e: e.installed_ts or 0)


def active_tag(app: Blazar) -> str | None:
    return app.runner.state("engines").active


def rollback_target(app: Blazar) -> str | None:
    return engines.rollback_target(app.runner.state("engines"))


def engine_json(app: Blazar, e: InstalledEngine, *, engines_dir: Path | None = None) -> dict[str, Any]:
    """An engine as the console lists it: the install record without its files and flag texts. With `engines_dir`,
    as `blazar engine list|show --json` print it: also where it lives and its files."""
    row: dict[str, Any] = {
        "tag": e.tag, "active": active_tag(app) == e.tag, "rollback_target": rollback_target(app) == e.tag,
        "source_kind": e.source_kind, "source": e.source, "version": dict(e.version),
        "build_options": list(e.build_options), "package_version": e.package_version,
        "installed_ts": e.installed_ts, "activated_ts": e.activated_ts,
        "file_count": sum(1 for f in e.files if not f.link_to), "bytes": sum(f.bytes for f in e.files),
        "smoke": None if e.smoke is None else e.smoke.to_json(),
        "verified": None if e.verified is None else e.verified.to_json(),
        "refused": None if e.refused is None else e.refused.to_json(),
    }
    if engines_dir is not None:
        row |= {"dir": str(engines_dir / e.tag), "binary": str(engines_dir / e.tag / e.binary),
                "files": [f.model_dump(mode="json") for f in e.files]}
    return row
