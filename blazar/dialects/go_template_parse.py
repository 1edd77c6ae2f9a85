"""Go's `text/template`, the subset Ollama's chat templates are written in, read into a tree: text, actions that
print, `if`/`else if`/`else`, `range` (with its `$i, $x :=`), variables (`:=` and `=`), `break`, `continue`, and
expressions of fields, variables, literals and function calls. The trim markers (`{{-`, `-}}`) are applied here, to
the text beside them, as Go applies them. Whatever else Go's templates can say raises `TemplateNotConvertible`.

blazar/dialects/go_template.py writes the tree as Jinja.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from blazar.errors import TemplateNotConvertible

_SPACE = " \t\r\n"
_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<raw>`[^`]*`)
  | (?P<num>-?\d+(?:\.\d+)?)
  | (?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
  | (?P<field>(?:\.[A-Za-z_][A-Za-z0-9_]*)+|\.)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>:=|=|\(|\)|\||,)
""", re.VERBOSE)
_KEYWORDS = frozenset({"if", "else", "end", "range", "with", "template", "define", "block", "break", "continue"})


# -- the tree ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Path:
    """`.A.B` (base "dot"), `$.A` (base "root"), `$x.A` (base "$x"): a base and the fields read from it."""

    base: str
    fields: tuple[str, ...] = ()


@dataclass(frozen=True)
class Lit:
    value: str | int | float | bool | None


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple[Expr, ...]


Expr = Path | Lit | Call


@dataclass
class Text:
    text: str


@dataclass
class Print:
    expr: Expr


@dataclass
class Assign:
    name: str
    expr: Expr
    declare: bool  # `:=` (a new variable) rather than `=`


@dataclass
class If:
    branches: list[tuple[Expr, list[Node]]]
    otherwise: list[Node] | None = None


@dataclass
class Range:
    expr: Expr
    index: str | None
    elem: str | None
    body: list[Node] = field(default_factory=list)
    otherwise: list[Node] | None = None


@dataclass
class Jump:
    kind: str  # "break" or "continue"


Node = Text | Print | Assign | If | Range | Jump


# -- reading -------------------------------------------------------------------------------------------------------


def _actions(text: str) -> list[str | tuple[str]]:
    """The template as text pieces (str) and action bodies (1-tuples), trim markers applied, comments dropped."""
    out: list[str | tuple[str]] = []
    pos = 0
    while (start := text.find("{{", pos)) >= 0:
        before = text[pos:start]
        inner = start + 2
        if text.startswith("-", inner) and inner + 1 < len(text) and text[inner + 1] in _SPACE:
            before = before.rstrip(_SPACE)
            inner += 2
        end = text.find("}}", inner)
        if end < 0:
            raise TemplateNotConvertible("unclosed {{ in the Go template")
        body = text[inner:end]
        pos = end + 2
        if body.endswith("-") and len(body) >= 2 and body[-2] in _SPACE:
            body = body[:-2]
            following = text[pos:]
            pos += len(following) - len(following.lstrip(_SPACE))
        out.append(before)
        if not body.strip().startswith("/*"):  # a comment: {{/* ... */}}
            out.append((body,))
    out.append(text[pos:])
    return out


def _tokens(body: str) -> list[tuple[str, str]]:
    toks: list[tuple[str, str]] = []
    pos = 0
    while pos < len(body):
        m = _TOKEN.match(body, pos)
        if m is None:
            raise TemplateNotConvertible(f"Go template action {{{{{body.strip()[:40]}}}}}: cannot read it")
        kind = m.lastgroup or ""
        if kind != "space":
            toks.append((kind, m.group()))
        pos = m.end()
    return toks


class _Exprs:
    """An action's tokens, read as one pipeline (no `|`: Ollama's templates do not chain commands)."""

    def __init__(self, toks: list[tuple[str, str]], source: str) -> None:
        self.toks, self.i, self.source = toks, 0, source

    def fail(self, why: str) -> TemplateNotConvertible:
        return TemplateNotConvertible(f"Go template {{{{ {self.source.strip()[:48]} }}}}: {why}")

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise self.fail("ends too soon")
        self.i += 1
        return tok

    def pipeline(self) -> Expr:
        expr = self.command()
        if (tok := self.peek()) is not None:
            raise self.fail("pipelines (|) are not converted" if tok[1] == "|" else f"unexpected {tok[1]!r}")
        return expr

    def command(self) -> Expr:
        args: list[Expr] = []
        func: str | None = None
        while (tok := self.peek()) is not None and tok[1] not in (")", "|"):
            if not args and func is None and tok[0] == "ident" and tok[1] not in ("true", "false", "nil"):
                func = self.take()[1]
                continue
            args.append(self.operand())
        if func is not None:
            return Call(func, tuple(args))
        if len(args) != 1:
            raise self.fail("expected one value" if not args else "a method call with arguments is not converted")
        return args[0]

    def operand(self) -> Expr:
        kind, text = self.take()
        if kind == "str":
            return Lit(ast.literal_eval(text))  # Go's escapes (\n, \t, \", \\, \x, \u) read as Python's
        if kind == "raw":
            return Lit(text[1:-1])
        if kind == "num":
            return Lit(float(text) if "." in text else int(text))
        if kind == "ident":
            return Lit({"true": True, "false": False}.get(text))
        if kind == "field":
            return Path("dot", tuple(text.split(".")[1:]) if text != "." else ())
        if kind == "var":
            name, *fields = text.split(".")
            return Path("root" if name == "$" else name, tuple(fields))
        if text == "(":
            inner = self.command()
            if self.take()[1] != ")":
                raise self.fail("unbalanced parentheses")
            if (nxt := self.peek()) is not None and nxt[0] == "field":
                raise self.fail("a field of a parenthesized value is not converted")
            return inner
        raise self.fail(f"unexpected {text!r}")


def parse(text: str) -> list[Node]:
    """The Go template `text` as a tree. TemplateNotConvertible where it steps outside the subset."""
    tree = _Tree()
    for piece in _actions(text):
        if isinstance(piece, str):
            if piece:
                tree.current.append(Text(piece))
        else:
            tree.action(piece[0])
    if tree.stack:
        raise TemplateNotConvertible("a block in the Go template has no {{ end }}")
    return tree.root


class _Tree:
    """The tree as it is read: the open blocks, and the list the next node goes to."""

    def __init__(self) -> None:
        self.root: list[Node] = []
        self.stack: list[tuple[If | Range, list[Node]]] = []  # open blocks, and the list each was opened in
        self.current = self.root

    def open(self, block: If | Range, body: list[Node]) -> None:
        self.current.append(block)
        self.stack.append((block, self.current))
        self.current = body

    def action(self, body: str) -> None:
        toks = _tokens(body)
        if not toks:
            raise TemplateNotConvertible("an empty {{ }} action in the Go template")
        reader = _Exprs(toks, body)
        word = toks[0][1] if toks[0][0] == "ident" else ""
        if word in ("with", "template", "define", "block"):
            raise reader.fail(f"{{{{ {word} }}}} is not converted")
        if word == "if":
            reader.take()
            node = If([(reader.pipeline(), [])])
            self.open(node, node.branches[0][1])
        elif word == "range":
            reader.take()
            loop = _range(reader)
            self.open(loop, loop.body)
        elif word == "else":
            self.otherwise(reader)
        elif word == "end":
            if not self.stack or len(toks) != 1:
                raise reader.fail("{{ end }} without its block")
            _, self.current = self.stack.pop()
        elif word in ("break", "continue"):
            if len(toks) != 1 or not any(isinstance(b, Range) for b, _ in self.stack):
                raise reader.fail(f"{{{{ {word} }}}} outside a range")
            self.current.append(Jump(word))
        elif len(toks) >= 2 and toks[0][0] == "var" and toks[1][1] in (":=", "="):
            if "." in toks[0][1] or toks[0][1] == "$":
                raise reader.fail("assigning to a field is not converted")
            reader.i = 2
            self.current.append(Assign(toks[0][1], reader.pipeline(), toks[1][1] == ":="))
        else:
            self.current.append(Print(reader.pipeline()))

    def otherwise(self, reader: _Exprs) -> None:
        """`{{ else }}` or `{{ else if ... }}`."""
        if not self.stack:
            raise reader.fail("{{ else }} outside a block")
        block, _ = self.stack[-1]
        reader.take()
        if block.otherwise is not None:
            raise reader.fail("a branch after {{ else }}")
        if reader.peek() == ("ident", "if") and isinstance(block, If):
            reader.take()
            block.branches.append((reader.pipeline(), []))
            self.current = block.branches[-1][1]
        elif reader.peek() is None:
            block.otherwise = []
            self.current = block.otherwise
        else:
            raise reader.fail("this {{ else }} form is not converted")


def _range(reader: _Exprs) -> Range:
    toks = reader.toks
    names: list[str] = []
    if ":=" in (t[1] for t in toks) or "=" in (t[1] for t in toks):
        while (tok := reader.take())[1] not in (":=", "="):
            if tok[0] == "var" and "." not in tok[1] and tok[1] != "$":
                names.append(tok[1])
            elif tok[1] != ",":
                raise reader.fail("unexpected range variables")
        if not 1 <= len(names) <= 2:
            raise reader.fail("a range declares one or two variables")
    expr = reader.pipeline()
    index, elem = (names[0], names[1]) if len(names) == 2 else (None, names[0] if names else None)
    return Range(expr, index, elem)
