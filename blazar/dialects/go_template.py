"""Ollama's chat templates (Go's `text/template`) as Jinja, for llama-server's `--jinja --chat-template-file`: the
same prompt for the same messages, so a model brought over from Ollama keeps the turn format it was served with.

What Ollama gives a template, and what the Jinja computes from llama-server's `messages` to match (Ollama's
template/template.go, `Execute`):
- A template that names `.Messages` gets `.System` (every system message's text, joined by a blank line) and
  `.Messages` (the messages with consecutive ones of the same role merged by a blank line, tool results apart),
  each with `.Role` and `.Content`; `.Response` is empty.
- A legacy template (`.System`, `.Prompt`, `.Response`, no `.Messages`) is run once per turn (a system text, a
  user's prompt, the assistant's response), then once more for the last turn cut just after `{{ .Response }}`
  (appended where the template has none), which leaves the prompt open where the model's answer goes.
Go's variables live across blocks (`$x = ...` inside a range changes the outer `$x`): here they are a namespace's
attributes. `continue` and `break`, which Jinja lacks, are flags that skip the rest of the iteration or the loop.

Tools, thinking and the functions that format them (`.Tools`, `.ToolCalls`, `json`, `currentDate`, ...) are not
converted: `TemplateNotConvertible` says what, and the model keeps its GGUF's own template (or its architecture's).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from blazar.dialects.go_template_parse import (
    Assign,
    Call,
    Expr,
    If,
    Jump,
    Lit,
    Node,
    Path,
    Print,
    Range,
    Text,
    parse,
)
from blazar.errors import TemplateNotConvertible

__all__ = ["TemplateNotConvertible", "to_jinja"]

# A message's text: a string, the text parts of a list, or "" (an assistant's turn of tool calls has none).
_TEXT = ("{%- macro _text(c) -%}{%- if c is string -%}{{ c }}{%- elif c is iterable and c is not mapping -%}"
         "{%- for p in c -%}{%- if p['type'] == 'text' -%}{{ p['text'] }}{%- endif -%}{%- endfor -%}{%- endif -%}"
         "{%- endmacro -%}")
# Ollama's collate: the system texts joined, and consecutive messages of one role merged (tool results apart).
_COLLATE = ("{%- set _c = namespace(turns=[], system='', n=0) -%}"
            "{%- for _m in messages -%}{%- set _x = _text(_m['content']) -%}"
            "{%- if _m['role'] == 'system' -%}{%- set _c.system = _c.system ~ ('\\n\\n' if _c.n else '') ~ _x -%}"
            "{%- set _c.n = _c.n + 1 -%}{%- endif -%}"
            "{%- if _c.turns and _c.turns[-1]['role'] == _m['role'] and _m['role'] != 'tool' -%}"
            "{%- set _c.turns = _c.turns[:-1] + [{'role': _m['role'], 'content': _c.turns[-1]['content'] ~ "
            "'\\n\\n' ~ _x}] -%}"
            "{%- else -%}{%- set _c.turns = _c.turns + [{'role': _m['role'], 'content': _x}] -%}{%- endif -%}"
            "{%- endfor -%}")
# Ollama's legacy loop: a turn is run when the next one starts (a system text or a prompt after a response).
_RESET = "{%- set _t.s = '' -%}{%- set _t.p = '' -%}{%- set _t.r = '' -%}"
_LEGACY = ("{%- set _t = namespace(s='', p='', r='', prev='') -%}"
           "{%- for _m in messages -%}{%- set _role = _m['role'] -%}{%- set _x = _text(_m['content']) -%}"
           "{%- if _role == _t.prev and _role != 'tool' -%}"
           "{%- if _role == 'system' -%}{%- set _t.s = _t.s ~ '\\n\\n' ~ _x -%}"
           "{%- elif _role == 'user' -%}{%- set _t.p = _t.p ~ '\\n\\n' ~ _x -%}"
           "{%- elif _role == 'assistant' -%}{%- set _t.r = _t.r ~ '\\n\\n' ~ _x -%}{%- endif -%}"
           "{%- elif _role == 'system' -%}{%- if _t.p or _t.r -%}{{ _turn(_t.s, _t.p, _t.r) }}" + _RESET +
           "{%- endif -%}{%- set _t.s = _x -%}"
           "{%- elif _role == 'user' -%}{%- if _t.r -%}{{ _turn(_t.s, _t.p, _t.r) }}" + _RESET +
           "{%- endif -%}{%- set _t.p = _x -%}"
           "{%- elif _role == 'assistant' -%}{%- set _t.r = _x -%}{%- endif -%}"
           "{%- set _t.prev = _role -%}{%- endfor -%}"
           "{{ _last(_t.s, _t.p, _t.r) }}")
_JINJA_MARKS = re.compile(r"\{\{|\}\}|\{%|%\}|\{#|#\}")
_ROOT_FIELDS = {"messages": {"System": "_c.system", "Messages": "_c.turns", "Response": "''"},
                "legacy": {"System": "_s", "Prompt": "_p", "Response": "_r"}}
_MESSAGE_FIELDS = {"Role": "role", "Content": "content"}
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def to_jinja(go: str) -> str:
    """Ollama's Go template `go` as a Jinja chat template. TemplateNotConvertible (with the reason) where it uses
    what is not converted."""
    tree = parse(go)
    names = {n.lower() for n in _identifiers(tree)}
    if "messages" in names:
        return _TEXT + _COLLATE + _Writer("messages").write(tree)
    if "response" not in names:  # Ollama appends {{ .Response }} to a template without one
        tree = [*tree, Print(Path("dot", ("Response",)))]
    last = _cut(tree, [False])
    return (_TEXT + "{%- macro _turn(_s, _p, _r) -%}" + _Writer("legacy").write(tree) + "{%- endmacro -%}"
            + "{%- macro _last(_s, _p, _r) -%}" + _Writer("legacy").write(last) + "{%- endmacro -%}" + _LEGACY)


# -- what the template names --------------------------------------------------------------------------------------


def _identifiers(nodes: list[Node]) -> list[str]:
    """Every field and variable name the template uses (as Ollama's `Vars` collects them)."""
    out: list[str] = []

    def expr(e: Expr) -> None:
        if isinstance(e, Path):
            out.extend([e.base, *e.fields])
        elif isinstance(e, Call):
            for a in e.args:
                expr(a)

    for n in nodes:
        if isinstance(n, Print | Assign):
            expr(n.expr)
        elif isinstance(n, If):
            for cond, body in n.branches:
                expr(cond)
                out.extend(_identifiers(body))
            out.extend(_identifiers(n.otherwise or []))
        elif isinstance(n, Range):
            expr(n.expr)
            out.extend(_identifiers(n.body) + _identifiers(n.otherwise or []))
    return out


def _names_response(e: Expr) -> bool:
    if isinstance(e, Path):
        return "Response" in e.fields
    return isinstance(e, Call) and any(_names_response(a) for a in e.args)


def _cut(nodes: list[Node], cut: list[bool]) -> list[Node]:
    """The template for the last turn: everything after the first `{{ .Response }}` dropped (Ollama's deleteNode).
    A cut inside an `if` that has an `else` after it makes Ollama fail: not converted."""
    out: list[Node] = []
    for n in nodes:
        if cut[0]:
            break
        if isinstance(n, Print) and _names_response(n.expr):
            if n.expr not in (Path("dot", ("Response",)), Path("root", ("Response",))):
                raise TemplateNotConvertible("the Go template uses .Response inside an expression")
            out.append(n)
            cut[0] = True
        elif isinstance(n, If):
            branches: list[tuple[Expr, list[Node]]] = []
            for cond, body in n.branches:
                if cut[0]:
                    raise TemplateNotConvertible("the Go template has an {{ else }} after its {{ .Response }}")
                branches.append((cond, _cut(body, cut)))
            if n.otherwise is not None and cut[0]:
                raise TemplateNotConvertible("the Go template has an {{ else }} after its {{ .Response }}")
            out.append(If(branches, None if n.otherwise is None else _cut(n.otherwise, cut)))
        elif isinstance(n, Range | Assign) and "Response" in _identifiers([n]):
            raise TemplateNotConvertible("the Go template uses .Response in a range or a variable")
        else:
            out.append(n)
    return out


# -- writing Jinja ------------------------------------------------------------------------------------------------


@dataclass
class _Value:
    jinja: str
    kind: str = "value"  # "messages" (the list), "message" (one of them), "root" (the template's data), "value"


@dataclass
class _Writer:
    mode: str  # "messages" or "legacy"
    scopes: list[dict[str, _Value]] = field(default_factory=lambda: [{}])
    loops: list[str] = field(default_factory=list)  # the open ranges' jump flags, innermost last
    dot: _Value = field(default_factory=lambda: _Value("", "root"))
    declared: set[str] = field(default_factory=set)
    count: int = 0

    def write(self, tree: list[Node]) -> str:
        body = self.nodes(tree)
        attrs = ", ".join(f"{n}=0" for n in sorted(self.declared))
        return "{%- set _v = namespace(" + attrs + ") -%}" + body if self.declared else body

    def nodes(self, nodes: list[Node]) -> str:
        out = []
        for i, n in enumerate(nodes):
            out.append(self.node(n))
            if self.loops and _jumps(n):  # the rest of this iteration runs unless a continue or break was taken
                rest = self.nodes(nodes[i + 1:])
                if rest:
                    out.append("{%- if not " + self.loops[-1] + ".skip -%}" + rest + "{%- endif -%}")
                break
        return "".join(out)

    def node(self, n: Node) -> str:
        if isinstance(n, Text):
            if _JINJA_MARKS.search(n.text):
                raise TemplateNotConvertible("the Go template's text holds Jinja's own delimiters")
            return "{{ " + json.dumps(n.text, ensure_ascii=False) + " }}"
        if isinstance(n, Print):
            value = self.expr(n.expr)
            if value.kind != "value":
                raise TemplateNotConvertible(f"the Go template prints a whole {value.kind}")
            return "{{ " + value.jinja + " }}"
        if isinstance(n, Assign):
            return self.assign(n)
        if isinstance(n, If):
            parts = []
            for k, (cond, body) in enumerate(n.branches):
                parts.append(("{%- if " if k == 0 else "{%- elif ") + self.expr(cond).jinja + " -%}"
                             + self.scoped(body))
            if n.otherwise is not None:
                parts.append("{%- else -%}" + self.scoped(n.otherwise))
            return "".join(parts) + "{%- endif -%}"
        if isinstance(n, Range):
            return self.range(n)
        flag = self.loops[-1]
        return "{%- set " + flag + ".skip = true -%}" + ("{%- set " + flag + ".stop = true -%}"
                                                           if n.kind == "break" else "")

    def scoped(self, body: list[Node]) -> str:
        self.scopes.append({})
        try:
            return self.nodes(body)
        finally:
            self.scopes.pop()

    def assign(self, n: Assign) -> str:
        value = self.expr(n.expr)
        if value.kind not in ("value",):
            raise TemplateNotConvertible(f"the Go template keeps a {value.kind} in a variable ({n.name})")
        name = "v_" + n.name[1:]
        if n.declare:
            if any(n.name in s for s in self.scopes[:-1]):
                raise TemplateNotConvertible(f"the Go template declares {n.name} again in an inner block")
            self.scopes[-1][n.name] = _Value("_v." + name)
            self.declared.add(name)
        elif self.lookup(n.name).jinja != "_v." + name:
            raise TemplateNotConvertible(f"the Go template assigns to {n.name}, which is not a plain variable")
        return "{%- set _v." + name + " = " + value.jinja + " -%}"

    def range(self, n: Range) -> str:
        over = self.expr(n.expr)
        if over.kind != "messages":
            raise TemplateNotConvertible("the Go template ranges over something other than .Messages")
        self.count += 1
        elem, flag = f"_e{self.count}", f"_k{self.count}"
        jumps = any(_jumps(c) for c in n.body)
        head = ("{%- set " + flag + " = namespace(skip=false, stop=false) -%}" if jumps else "") + \
            "{%- for " + elem + " in " + over.jinja + " -%}"
        if jumps:
            head += "{%- set " + flag + ".skip = " + flag + ".stop -%}"
        outer_dot = self.dot
        self.scopes.append({})
        if n.elem is not None:
            self.scopes[-1][n.elem] = _Value(elem, "message")
        if n.index is not None:
            index = "v_" + n.index[1:]
            self.scopes[-1][n.index] = _Value("_v." + index)
            self.declared.add(index)
            head += "{%- set _v." + index + " = loop.index0 -%}"
        self.dot = _Value(elem, "message")
        self.loops.append(flag)
        try:
            body = self.nodes(n.body)
        finally:
            self.loops.pop()
            self.dot = outer_dot
            self.scopes.pop()
        if jumps:
            body = "{%- if not " + flag + ".skip -%}" + body + "{%- endif -%}"
        tail = "{%- else -%}" + self.scoped(n.otherwise) if n.otherwise is not None else ""
        return head + body + tail + "{%- endfor -%}"

    def lookup(self, name: str) -> _Value:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        raise TemplateNotConvertible(f"the Go template uses {name} before declaring it")

    def expr(self, e: Expr) -> _Value:
        if isinstance(e, Lit):
            if e.value is None:
                raise TemplateNotConvertible("the Go template uses nil")
            if isinstance(e.value, bool):
                return _Value("true" if e.value else "false")
            return _Value(json.dumps(e.value, ensure_ascii=False))
        if isinstance(e, Path):
            base = self.dot if e.base == "dot" else _Value("", "root") if e.base == "root" else self.lookup(e.base)
            return self.fields(base, e.fields)
        return self.call(e)

    def fields(self, base: _Value, names: tuple[str, ...]) -> _Value:
        if not names:
            return base
        head, rest = names[0], names[1:]
        if base.kind == "root":
            mapped = _ROOT_FIELDS[self.mode].get(head)
            if mapped is None:
                raise TemplateNotConvertible(f"the Go template uses .{head}, which is not converted")
            value = _Value(mapped, "messages" if head == "Messages" else "value")
        elif base.kind == "message":
            key = _MESSAGE_FIELDS.get(head)
            if key is None:
                raise TemplateNotConvertible(f"the Go template uses a message's .{head}, which is not converted")
            value = _Value(f"{base.jinja}['{key}']")
        else:
            raise TemplateNotConvertible(f"the Go template reads .{head} of a value")
        return self.fields(value, rest)

    def call(self, c: Call) -> _Value:
        args = [self.expr(a) for a in c.args]
        js = [a.jinja for a in args]
        if c.func in _COMPARE and len(js) >= 2 and (c.func == "eq" or len(js) == 2):
            op = _COMPARE[c.func]
            return _Value("(" + " or ".join(f"{js[0]} {op} {b}" for b in js[1:]) + ")")
        if c.func in ("and", "or") and js:
            return _Value("(" + f" {c.func} ".join(js) + ")")
        if c.func == "not" and len(js) == 1:
            return _Value(f"(not {js[0]})")
        if c.func == "len" and len(js) == 1:
            return _Value(f"({js[0]} | length)")
        if c.func == "slice" and 1 <= len(js) <= 3 and args[0].kind == "messages":
            return _Value(js[0] + ("" if len(js) == 1 else f"[{js[1]}:{js[2] if len(js) == 3 else ''}]"),
                          "messages")
        if c.func == "index" and len(js) == 2 and args[0].kind == "messages":
            return _Value(f"{js[0]}[{js[1]}]", "message")
        if c.func == "printf" and c.args and isinstance(c.args[0], Lit) and isinstance(c.args[0].value, str):
            return _Value(_printf(c.args[0].value, js[1:]))
        raise TemplateNotConvertible(f"the Go template uses {{{{ {c.func} }}}} as written, which is not converted")


def _jumps(n: Node) -> bool:
    """Whether `n` may take a continue or break of the innermost open range (not one of a range inside it)."""
    if isinstance(n, Jump):
        return True
    if isinstance(n, If):
        return any(_jumps(c) for _, body in n.branches for c in body) or any(_jumps(c) for c in n.otherwise or [])
    return False


def _printf(fmt: str, args: list[str]) -> str:
    """Go's printf with %s, %v and %d (and %%): the pieces joined with Jinja's `~`."""
    parts: list[str] = []
    pieces = re.split(r"(%.)", fmt)
    used = 0
    for piece in pieces:
        if piece == "%%":
            parts.append(json.dumps("%"))
        elif piece in ("%s", "%v", "%d"):
            if used >= len(args):
                raise TemplateNotConvertible("the Go template's printf has fewer values than verbs")
            parts.append(args[used])
            used += 1
        elif piece.startswith("%"):
            raise TemplateNotConvertible(f"the Go template's printf uses {piece}, which is not converted")
        elif piece:
            parts.append(json.dumps(piece, ensure_ascii=False))
    if used != len(args):
        raise TemplateNotConvertible("the Go template's printf has more values than verbs")
    return "(" + " ~ ".join(parts or ['""']) + ")"
