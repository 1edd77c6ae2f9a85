"""Every package `blazar/` imports is one it declares: `scripts/setup` (what a new user runs, without the dev extra)
installs `[project].dependencies` only, while the test venv has the dev extra and everything it brings, so an
undeclared import passes every test and breaks the README's first command (jinja2 did: `blazar engine build` died
with ModuleNotFoundError on a fresh machine). A module imported only behind an extra is declared in that extra."""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib.metadata import packages_distributions, requires
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
# Imported only where an extra is asked for (the module says so where it imports it).
EXTRA_ONLY = {"asyncpg": "postgres", "faster_whisper": "stt", "onnxruntime": "stt"}


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    extras = {extra: {canonicalize_name(Requirement(r).name) for r in reqs}
              for extra, reqs in project["optional-dependencies"].items()}
    return names, extras


def _required_by(names: set[str]) -> set[str]:
    """What the declared distributions themselves require (pydantic brings pydantic-core, gguf numpy): always there
    when they are."""
    out: set[str] = set()
    for name in names:
        for req in requires(name) or []:
            r = Requirement(req)
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                out.add(canonicalize_name(r.name))
    return out


def _third_party_imports() -> dict[str, str]:
    """Top-level module -> a file of blazar/ that imports it, for every module not ours and not the stdlib's."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "blazar").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                tops = [alias.name.partition(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = [node.module.partition(".")[0]]
            else:
                continue
            for top in tops:
                if top != "blazar" and top not in sys.stdlib_module_names:
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_every_imported_package_is_a_declared_dependency() -> None:
    names, extras = _declared()
    installed = names | _required_by(names)
    dists = packages_distributions()
    undeclared = []
    for module, where in sorted(_third_party_imports().items()):
        wanted = {canonicalize_name(d) for d in dists.get(module, [module])}
        if not wanted & (extras[EXTRA_ONLY[module]] if module in EXTRA_ONLY else installed):
            undeclared.append(f"{module} (imported by {where}; distribution {sorted(wanted)})")
    assert not undeclared, "imported by blazar/ but not in pyproject's dependencies:\n" + "\n".join(undeclared)
