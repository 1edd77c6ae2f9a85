"""What an error tells a caller who is not the machine's owner. An error's `message` is the owner's (the CLI, an admin
key, `blazar why`, the daemon log) and may name the home's files, quote an engine's output or a Python traceback; a
key that is not an admin's is told the error's `public` text (blazar/errors.py) or, for an error without one, its
message with every path of this machine, every log file's name and any traceback taken out (`scrub`). Pure.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from blazar.errors import BlazarError

WITHHELD = "<path>"
# The first segments of the paths the API and its children serve: a message that names a route (`it serves
# /v1/audio/speech`, `/api/blazar/ps needs an admin key`) keeps it. NOTE: every route's first segment is here
# (tests/unit/test_redact.py walks the route table, blazar/api/table.py); any other absolute path is the machine's.
ROUTE_HEADS = frozenset({"", "v1", "api", "health", "ready", "metrics", "console", "openapi.json", "rerank",
                         "completion", "tokenize", "slots", "synthesize", "info", "voices"})
# A token that starts with "/" where a path would: not inside a word, a URL (`http://host:1/v1`) or a relative path.
_ABSOLUTE = re.compile(r"(?<![\w.:/~@-])/[^\s'\"`<>|;:,()\[\]]*")
_LOG_NAME = re.compile(r"(?:[\w.+-]+/)*[\w.+-]*\.log\b")
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)|\bFile \"[^\"]*\", line \d+")
# Where a path ends inside a message: whitespace, a quote, a bracket or a separator (a route's template keeps its
# `{name}`).
_PATH_REST = r"[^\s'\"`<>|;:,()\[\]]*"


def machine_roots(*homes: Path) -> tuple[str, ...]:
    """The directories whose paths a caller is never shown: Blazar's home, the user's home, the interpreter's
    prefixes (the venv and the Python it was made from) and the temporary directory, as given and resolved; longest
    first, so a home under the user's home is taken out whole."""
    found: set[str] = set()
    try:
        user = [Path.home()]
    except (RuntimeError, KeyError):  # no HOME and no password entry: nothing to take out for it
        user = []
    for d in (*homes, *user, Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix),
              Path(tempfile.gettempdir())):
        for form in (str(d), os.path.realpath(d)):
            if form.strip("/"):
                found.add(form.rstrip("/"))
    return tuple(sorted(found, key=len, reverse=True))


def scrub(text: str, roots: Sequence[str] = ()) -> str:
    """`text` with a traceback cut off where it starts, every path under `roots` (spaces and all) and every other
    absolute path that is no route replaced by WITHHELD, and log files' names taken out."""
    cut = _TRACEBACK.search(text)
    if cut is not None:
        text = text[:cut.start()].rstrip(" |:;\n") + " (the rest is withheld)"
    for root in roots:
        text = re.sub(re.escape(root) + r"(?=$|[/\s'\"`<>|;:,()\[\]])" + _PATH_REST, WITHHELD, text)
    text = _ABSOLUTE.sub(lambda m: m.group(0) if _is_route(m.group(0)) else WITHHELD, text)
    return _LOG_NAME.sub(WITHHELD, text)


def _is_route(token: str) -> bool:
    return token.split("/", 2)[1].split("?", 1)[0] in ROUTE_HEADS and not token.startswith("//")


def public_message(exc: BaseException, roots: Sequence[str] = ()) -> str:
    """What a key that is not an admin's is told of `exc`: its public text, else its message scrubbed; an exception
    that is no BlazarError (a bug of ours) says nothing of itself."""
    if isinstance(exc, BlazarError):
        return scrub(exc.public if exc.public is not None else exc.message, roots)
    return "internal error: the server's owner can see it in the daemon log"


def told(exc: BaseException, *, detail: bool, roots: Sequence[str] = ()) -> str:
    """`exc` in words for its caller: the whole message for the machine's owner (`detail`), else `public_message`."""
    if detail:
        return exc.message if isinstance(exc, BlazarError) else f"internal error: {type(exc).__name__}: {exc}"
    return public_message(exc, roots)
