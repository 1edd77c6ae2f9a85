"""Ollama's Modelfile, both ways: the text `/api/create` may carry (FROM, TEMPLATE, SYSTEM, PARAMETER; values bare,
"quoted" or \"\"\"triple-quoted\"\"\" across lines) parsed into its parts, and a model's settings rendered back as
`/api/show` gives them (`parameters` in Ollama's text format, `modelfile`).

ADAPTER names a LoRA adapter already added to the FROM model (`blazar lora add`): the handler resolves it.
What Blazar cannot serve is refused by name here (MESSAGE, LICENSE); whether a value is acceptable (a
template's kind, a parameter's type) is the handler's decision (blazar/store/model_settings.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from blazar.errors import DialectError

MAX_MODELFILE_CHARS = 256 * 1024
_COMMANDS = ("from", "template", "system", "parameter", "adapter", "license", "message")
_REFUSED = {
    "message": "MESSAGE is not supported: a model carries no pre-seeded conversation here; send the messages with "
               "the request",
    "license": "LICENSE is not supported: Blazar keeps no license text with a model; remove the LICENSE lines",
}
_WORD = re.compile(r"[A-Za-z_]+")


@dataclass(frozen=True)
class Modelfile:
    """A parsed Modelfile: each value as written (quotes removed), parameters in order (`stop` may repeat)."""

    from_: str | None = None
    template: str | None = None
    system: str | None = None
    parameters: list[tuple[str, str]] = field(default_factory=list)
    adapters: list[str] = field(default_factory=list)  # ADAPTER values, as written (a name; a path is refused later)


def parse(text: str) -> Modelfile:
    """The Modelfile `text`; a DialectError names the line of what it cannot read or does not support."""
    if len(text) > MAX_MODELFILE_CHARS:
        raise DialectError(f"modelfile: {len(text)} characters, more than the {MAX_MODELFILE_CHARS} accepted")
    from_: str | None = None
    template: str | None = None
    system: str | None = None
    params: list[tuple[str, str]] = []
    adapters: list[str] = []
    pos, n = 0, len(text)
    while pos < n:
        line_no = text.count("\n", 0, pos) + 1
        end = _eol(text, pos)
        stripped = text[pos:end].strip()
        if not stripped or stripped.startswith("#"):
            pos = end + 1
            continue
        lead = pos + (len(text[pos:end]) - len(text[pos:end].lstrip()))
        word = _WORD.match(text, lead)
        command = word.group(0).lower() if word else ""
        if command not in _COMMANDS:
            raise DialectError(f"modelfile line {line_no}: unknown command {stripped.split()[0]!r}; expected one of "
                               f"{', '.join(c.upper() for c in _COMMANDS)}")
        if command in _REFUSED:
            raise DialectError(f"modelfile line {line_no}: {_REFUSED[command]}")
        assert word is not None
        pos = _skip_blanks(text, word.end())
        if command == "parameter":
            name_end = pos
            while name_end < n and not text[name_end].isspace():
                name_end += 1
            name = text[pos:name_end]
            if not name:
                raise DialectError(f"modelfile line {line_no}: PARAMETER needs a name and a value")
            pos = _skip_blanks(text, name_end)
            value, pos = _value(text, pos, line_no, f"PARAMETER {name}")
            params.append((name, value))
            continue
        value, pos = _value(text, pos, line_no, command.upper())
        if command == "from":
            from_ = value
        elif command == "template":
            template = value
        elif command == "adapter":
            adapters.append(value)
        else:
            system = value
    return Modelfile(from_=from_, template=template, system=system, parameters=params, adapters=adapters)


def _eol(text: str, pos: int) -> int:
    end = text.find("\n", pos)
    return len(text) if end < 0 else end


def _skip_blanks(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t":
        pos += 1
    return pos


def _value(text: str, pos: int, line_no: int, what: str) -> tuple[str, int]:
    """The value at `pos` and the position after its line: \"\"\"multi-line\"\"\", "one line", or the bare rest."""
    if text.startswith('"""', pos):
        close = text.find('"""', pos + 3)
        if close < 0:
            raise DialectError(f"modelfile line {line_no}: {what}: the \"\"\" value is never closed")
        value, after = text[pos + 3:close], close + 3
    elif text.startswith('"', pos):
        close = pos + 1
        while close < len(text) and text[close] != '"' and text[close] != "\n":
            close += 2 if text[close] == "\\" else 1
        if close >= len(text) or text[close] != '"':
            raise DialectError(f"modelfile line {line_no}: {what}: the quoted value is never closed on its line")
        value, after = _unescape(text[pos + 1:close]), close + 1
    else:
        end = _eol(text, pos)
        value, after = text[pos:end].strip(), end
    rest_end = _eol(text, after)
    if text[after:rest_end].strip():
        raise DialectError(f"modelfile line {line_no}: {what}: unexpected text after the value")
    if not value.strip():
        raise DialectError(f"modelfile line {line_no}: {what} needs a value")
    return value, rest_end + 1


def _unescape(text: str) -> str:
    return text.replace('\\"', '"').replace("\\\\", "\\")


# -- back to text (/api/show) ------------------------------------------------------------------------------------


def render_parameters(parameters: Mapping[str, object]) -> str:
    """Ollama's `parameters` text: one `name value` line per value (a `stop` list gives one line per string)."""
    lines = []
    for name in sorted(parameters):
        value = parameters[name]
        for one in value if isinstance(value, list) else [value]:
            lines.append(f"{name:<30} {_shown(one)}")
    return "\n".join(lines)


def render_modelfile(name: str, base: str, template: str | None, system: str | None,
                     parameters: Mapping[str, object], adapters: Sequence[str] = ()) -> str:
    """The Modelfile that makes `name` again: FROM its base, then its settings (ADAPTER: the base's adapters it
    applies, by name)."""
    out = [f"# Modelfile generated by \"blazar\" for {name}", f"FROM {base}", *(f"ADAPTER {a}" for a in adapters)]
    if template is not None:
        out.append(f'TEMPLATE """{template}"""')
    if system is not None:
        out.append(f'SYSTEM """{system}"""')
    for line in render_parameters(parameters).splitlines():
        key, _, value = line.partition(" ")
        out.append(f"PARAMETER {key} {value.strip()}")
    return "\n".join(out) + "\n"


def _shown(value: object) -> str:
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else str(value)
