"""What a client asks of Blazar itself, beside its dialect's request: a session, a deadline, best-of-N and a cascade.
Each comes as an `X-Blazar-*` header or as a body field (top level in every dialect, and in Anthropic's `metadata`);
the header wins where both are given. Anything malformed is a 400 in the caller's dialect (DialectError).

    X-Blazar-Session: NAME          session      (Ollama body, Anthropic metadata.session, any body's `session`)
    X-Blazar-Deadline-Ms: N         deadline_ms  (ms from arrival until the answer should be complete)
    X-Blazar-Best-Of: N             best_of      (1..8 candidates, 1 being one answer; more: non-streamed chat)
    X-Blazar-Cascade: small,large   cascade      (models tried in turn; non-streamed chat)
    X-Blazar-Spec: off|auto         spec         (Ollama: options.spec, also false|true; off: this request never
                                                  drafts on a speculative instance; auto: the governor decides)
    X-Blazar-Cache: use|refresh|off cache        (the response cache, header only: use it, run the engine and
                                                  replace the entry, or bypass it; blazar/serving/response_cache.py)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import falcon.asgi

from blazar.api.bounds import check_name, shown
from blazar.errors import DialectError
from blazar.serving.response_cache import CACHE_CHOICES

SESSION_MAX_CHARS = 128
_SESSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,127}")  # no "/": a name is a path segment of its routes
DEADLINE_MAX_MS = 24 * 3600 * 1000
BEST_OF_MAX = 8
CASCADE_MAX = 4
_DIGITS = re.compile(r"[0-9]{1,9}")


@dataclass(frozen=True, slots=True)
class RequestOptions:
    session: str | None = None
    deadline_ms: int | None = None
    best_of: int | None = None  # None or 1: one answer
    cascade: tuple[str, ...] = ()
    spec: str | None = None  # "off" or "auto" (None: auto)
    cache: str | None = None  # "use", "refresh" or "off" (None: the key's or the model's setting decides)

    @property
    def fans_out(self) -> bool:
        return (self.best_of or 1) > 1 or bool(self.cascade)


def _given(req: falcon.asgi.Request, header: str, data: dict[str, Any], field: str, *, metadata: bool
           ) -> tuple[Any, str]:
    """The header's value, else the body's (top level, then, for Anthropic, its metadata), and where it came from."""
    value = req.get_header(header)
    if value is not None:
        return value, header
    if field in data:
        return data[field], field
    meta = data.get("metadata") if metadata else None
    if isinstance(meta, dict) and field in meta:
        return meta[field], f"metadata.{field}"
    return None, field


def _integer(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise DialectError(f"{where}: expected an integer from {low} to {high}, got {shown(str(value))}")
    return value


def session_name(value: Any, where: str = "X-Blazar-Session") -> str:
    if not isinstance(value, str) or not _SESSION.fullmatch(value):
        raise DialectError(f"{where}: a session name is 1 to {SESSION_MAX_CHARS} characters of letters, digits and "
                           f"._:@/+=- (starting with a letter or digit), got {shown(str(value))}")
    return value


def _cascade(value: Any, where: str) -> tuple[str, ...]:
    names = [n.strip() for n in value.split(",")] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names) \
            or not 2 <= len(names) <= CASCADE_MAX:
        raise DialectError(f"{where}: expected 2 to {CASCADE_MAX} model names (a list, or comma-separated)")
    return tuple(check_name(n) for n in names)


SPEC_CHOICES = ("off", "auto")


def spec_choice(value: Any, where: str) -> str:
    """"off" or "auto"; where Ollama's options take it (`options.spec`), false and true mean the same."""
    if where == "options.spec" and isinstance(value, bool):
        return "auto" if value else "off"
    if isinstance(value, str) and value.strip().lower() in SPEC_CHOICES:
        return value.strip().lower()
    allowed = "off, auto, false or true" if where == "options.spec" else "off or auto"
    raise DialectError(f"{where}: expected {allowed}, got {shown(str(value))}")


def cache_choice(value: str | None) -> str | None:
    """The X-Blazar-Cache header: use, refresh or off (any case)."""
    if value is None:
        return None
    if value.strip().lower() in CACHE_CHOICES:
        return value.strip().lower()
    raise DialectError(f"X-Blazar-Cache: expected use, refresh or off, got {shown(value)}")


def _spec_given(req: falcon.asgi.Request, data: dict[str, Any], dialect: str) -> tuple[Any, str]:
    value = req.get_header("X-Blazar-Spec")
    if value is not None:
        return value, "X-Blazar-Spec"
    options = data.get("options") if dialect == "ollama" else None
    if isinstance(options, dict) and options.get("spec") is not None:
        return options["spec"], "options.spec"
    return None, "X-Blazar-Spec"


def request_options(req: falcon.asgi.Request, data: dict[str, Any], *, stream: bool, chat: bool,
                    dialect: str = "openai") -> RequestOptions:
    """The options of one request; best-of-N and cascades only on non-streamed chat (a 400 elsewhere)."""
    meta = dialect == "anthropic"
    session, where = _given(req, "X-Blazar-Session", data, "session", metadata=meta)
    deadline, d_where = _given(req, "X-Blazar-Deadline-Ms", data, "deadline_ms", metadata=meta)
    best_of, b_where = _given(req, "X-Blazar-Best-Of", data, "best_of", metadata=meta)
    cascade, c_where = _given(req, "X-Blazar-Cascade", data, "cascade", metadata=meta)
    spec, s_where = _spec_given(req, data, dialect)
    out = RequestOptions(
        session=session_name(session, where) if session is not None else None,
        deadline_ms=_integer(deadline, d_where, 1, DEADLINE_MAX_MS) if deadline is not None else None,
        best_of=_integer(best_of, b_where, 1, BEST_OF_MAX) if best_of is not None else None,
        cascade=_cascade(cascade, c_where) if cascade is not None else (),
        spec=spec_choice(spec, s_where) if spec is not None else None,
        cache=cache_choice(req.get_header("X-Blazar-Cache")),
    )
    if out.fans_out and (stream or not chat):
        what = "X-Blazar-Best-Of" if (out.best_of or 1) > 1 else "X-Blazar-Cascade"
        raise DialectError(f"{what}: only for chat answered whole (stream: false)")
    if (out.best_of or 1) > 1 and out.cascade:
        raise DialectError("X-Blazar-Best-Of and X-Blazar-Cascade cannot be combined")
    return out
