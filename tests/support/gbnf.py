"""A small GBNF reader and matcher for the unit tests of blazar/dialects/grammar.py: does a grammar accept a text,
as the engine would read it (llama.cpp's syntax: `name ::= ...`, literals, `[...]` classes with ranges and `^`,
groups, `|`, `*` `+` `?` `{m}` `{m,}` `{m,n}`, its escapes). Matching is exhaustive (every way through), so
it is for short texts only; left recursion is not supported (the converter writes none)."""

from __future__ import annotations

from dataclasses import dataclass, field

Node = tuple  # ("alt", [seq...]) | ("seq", [node...]) | ("lit", str) | ("cls", neg, [(lo, hi)]) | ("ref", name)
#               | ("rep", node, lo, hi|None)

_ESCAPES = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-"}
_HEX = {"x": 2, "u": 4, "U": 8}


class GbnfError(ValueError):
    pass


@dataclass
class Grammar:
    rules: dict[str, Node]
    _memo: dict[tuple[int, int], frozenset[int]] = field(default_factory=dict)

    def accepts(self, text: str, rule: str = "root") -> bool:
        self._memo.clear()
        self._text = text
        return len(text) in self._ends(("ref", rule), 0)

    def _ends(self, node: Node, pos: int) -> frozenset[int]:
        key = (id(node), pos)
        if key in self._memo:
            return self._memo[key]
        self._memo[key] = frozenset()  # a left-recursive loop finds nothing rather than recursing forever
        got = self._match(node, pos)
        self._memo[key] = got
        return got

    def _match(self, node: Node, pos: int) -> frozenset[int]:
        text = self._text
        kind = node[0]
        if kind == "lit":
            return frozenset({pos + len(node[1])}) if text.startswith(node[1], pos) else frozenset()
        if kind == "cls":
            if pos >= len(text):
                return frozenset()
            inside = any(lo <= ord(text[pos]) <= hi for lo, hi in node[2])
            return frozenset({pos + 1}) if inside != node[1] else frozenset()
        if kind == "ref":
            if node[1] not in self.rules:
                raise GbnfError(f"undefined rule {node[1]!r}")
            return self._ends(self.rules[node[1]], pos)
        if kind == "alt":
            return frozenset().union(*(self._ends(s, pos) for s in node[1]))
        if kind == "seq":
            current = frozenset({pos})
            for item in node[1]:
                current = frozenset().union(*(self._ends(item, p) for p in current))
                if not current:
                    break
            return current
        _, inner, lo, hi = node
        out: set[int] = {pos} if lo == 0 else set()
        current, seen, n = frozenset({pos}), {pos}, 0
        while current and (hi is None or n < hi):
            n += 1
            current = frozenset().union(*(self._ends(inner, p) for p in current))
            if n >= lo:
                out |= current
            if hi is None:
                current = frozenset(current - seen)
                seen |= current
        return frozenset(out)


def parse(text: str) -> Grammar:
    """Read a grammar; GbnfError for what the engine's parser would refuse (of what this reader knows)."""
    rules: dict[str, Node] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, body = line.partition("::=")
        name = name.strip()
        if not sep or not name or not all((c.isalnum() and c.isascii()) or c == "-" for c in name):
            raise GbnfError(f"not a rule: {line!r}")
        if name in rules:
            raise GbnfError(f"rule {name!r} defined twice")
        reader = _Reader(body)
        rules[name] = reader.alternatives()
        reader.skip()
        if reader.pos != len(body):
            raise GbnfError(f"unexpected {body[reader.pos:]!r} in rule {name!r}")
    grammar = Grammar(rules)
    for node in rules.values():
        _check_refs(node, rules)
    return grammar


def _check_refs(node: Node, rules: dict[str, Node]) -> None:
    if node[0] == "ref" and node[1] not in rules:
        raise GbnfError(f"undefined rule {node[1]!r}")
    for child in node[1] if node[0] in ("alt", "seq") else [node[1]] if node[0] == "rep" else []:
        _check_refs(child, rules)


class _Reader:
    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1

    def peek(self) -> str:
        self.skip()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def alternatives(self) -> Node:
        options = [self.sequence()]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else ("alt", options)

    def sequence(self) -> Node:
        items: list[Node] = []
        while (c := self.peek()) and c not in "|)":
            items.append(self.postfix(self.atom()))
        return items[0] if len(items) == 1 else ("seq", items)

    def atom(self) -> Node:
        c = self.peek()
        if c == '"':
            self.pos += 1
            chars = []
            while self.text[self.pos] != '"':
                chars.append(self.char())
            self.pos += 1
            return ("lit", "".join(chars))
        if c == "[":
            self.pos += 1
            negate = self.text[self.pos] == "^"
            self.pos += negate
            ranges = []
            while self.text[self.pos] != "]":
                lo = self.char()
                hi = lo
                if self.text[self.pos] == "-" and self.text[self.pos + 1] != "]":
                    self.pos += 1
                    hi = self.char()
                ranges.append((ord(lo), ord(hi)))
            self.pos += 1
            return ("cls", negate, ranges)
        if c == "(":
            self.pos += 1
            inner = self.alternatives()
            if self.peek() != ")":
                raise GbnfError(f"expected ')' at {self.text[self.pos:]!r}")
            self.pos += 1
            return inner
        start = self.pos
        while self.pos < len(self.text) and ((self.text[self.pos].isascii() and self.text[self.pos].isalnum())
                                             or self.text[self.pos] == "-"):
            self.pos += 1
        if start == self.pos:
            raise GbnfError(f"unexpected {self.text[self.pos:]!r}")
        return ("ref", self.text[start:self.pos])

    def char(self) -> str:
        c = self.text[self.pos]
        if c != "\\":
            self.pos += 1
            return c
        e = self.text[self.pos + 1]
        if e in _HEX:
            digits = self.text[self.pos + 2:self.pos + 2 + _HEX[e]]
            if len(digits) != _HEX[e] or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise GbnfError(f"bad escape at {self.text[self.pos:]!r}")
            self.pos += 2 + _HEX[e]
            return chr(int(digits, 16))
        if e not in _ESCAPES:
            raise GbnfError(f"unknown escape at {self.text[self.pos:]!r}")
        self.pos += 2
        return _ESCAPES[e]

    def postfix(self, node: Node) -> Node:
        while True:
            c = self.text[self.pos] if self.pos < len(self.text) else ""  # a suffix follows with no space
            if c in ("*", "+", "?"):
                self.pos += 1
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
                node = ("rep", node, lo, hi)
            elif c == "{":
                end = self.text.index("}", self.pos)
                spec = self.text[self.pos + 1:end]
                self.pos = end + 1
                first, comma, second = spec.partition(",")
                lo = int(first)
                hi = lo if not comma else (int(second) if second.strip() else None)
                node = ("rep", node, lo, hi)
            else:
                return node
