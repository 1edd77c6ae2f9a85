"""A JSON schema as a GBNF grammar (llama.cpp's grammar syntax, the engine's `grammar` field) with no free whitespace:
a value is written exactly as `json.dumps(value, separators=(",", ":"), ensure_ascii=False)` lays it out (strings may
use any JSON escape). The engine's own converter pads every `{`, `,` and `:` with optional spaces and newlines that a
small model fills, so a forced tool call or a structured answer costs several times the tokens of its JSON.

The subset tool parameters and structured output use is covered; a schema asserting anything else raises
GrammarUnsupported naming the keyword, and the caller leaves the schema to the engine's own conversion (padded, but
correct). Deterministic: the same schema gives the same text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from blazar.errors import GrammarUnsupported

# Keywords that only describe: ignored.
ANNOTATIONS = frozenset({
    "description", "title", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly",
    "writeOnly", "format", "strict", "$defs", "definitions", "nullable",
})
# Keywords that assert what a grammar here cannot express (unknown keywords are annotations, as JSON Schema says).
UNSUPPORTED = frozenset({
    "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "not", "if", "then",
    "else", "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas", "dependencies",
    "uniqueItems", "contains", "minContains", "maxContains", "minProperties", "maxProperties",
    "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef",
})
_OBJECT = frozenset({"properties", "required", "additionalProperties"})
_ARRAY = frozenset({"items", "prefixItems", "additionalItems", "minItems", "maxItems"})
_STRING = frozenset({"minLength", "maxLength"})
_COMPOSED = frozenset({"$ref", "anyOf", "oneOf", "allOf"})
_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
# The engine refuses a repetition bound past 2,000; a larger one is left to its own converter (which refuses it too).
MAX_REPEAT = 1000

# The building blocks, defined once per grammar that uses them (a name here is never a generated one: those begin
# with "root" or "def-").
_PRIMITIVES: dict[str, tuple[str, tuple[str, ...]]] = {
    "char": (r'[^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )', ()),
    "string": (r'"\"" char* "\""', ("char",)),
    # Digits bounded, as the engine's own converter bounds them: a small model can write digits until max_tokens.
    "integer": (r'( "0" | "-"? [1-9] [0-9]{0,15} )', ()),
    "number": (r'"-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?', ()),
    "boolean": ('( "true" | "false" )', ()),
    "null": ('"null"', ()),
    "value": ("( any-object | any-array | string | number | boolean | null )",
              ("any-object", "any-array", "string", "number", "boolean", "null")),
    "any-object": (r'"{" ( string ":" value ( "," string ":" value )* )? "}"', ("string", "value")),
    "any-array": (r'"[" ( value ( "," value )* )? "]"', ("value",)),
    "key-char": (r'[^"\\\x00-\x1F]', ()),
}


def schema_grammar(schema: Any) -> str:
    """The compact GBNF grammar of `schema` (a JSON schema: an object or a boolean). Raises GrammarUnsupported."""
    return _Converter(schema).grammar()


def any_object_grammar() -> str:
    """The compact GBNF grammar of any JSON object (response_format json_object, Ollama's format "json")."""
    return _Converter({"type": "object"}).grammar()


def literal(text: str) -> str:
    """`text` as a GBNF string literal."""
    return '"' + "".join(_escape(c, '"\\') for c in text) + '"'


def _escape(c: str, special: str) -> str:
    code = ord(c)
    if c in special:
        return "\\" + c
    if c == "\n":
        return "\\n"
    if c == "\r":
        return "\\r"
    if c == "\t":
        return "\\t"
    if code < 0x20 or code == 0x7F:
        return f"\\x{code:02X}"
    return c


def _class_char(c: str) -> str:
    """One character inside a `[...]` class (`^` escaped everywhere: the engine's parser takes no `\\^`)."""
    return "\\x5E" if c == "^" else _escape(c, '\\]-[')


def _json_text(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):  # a lone surrogate is no UTF-8: its escape instead
        text = json.dumps(value, separators=(",", ":"))
    return text


def _repeat(expr: str, lo: int, hi: int | None, keyword: str) -> str:
    """`expr` repeated lo..hi times (hi None: unbounded); "" when it can only be absent."""
    if lo > MAX_REPEAT or (hi is not None and hi > MAX_REPEAT):
        raise GrammarUnsupported(keyword, f"a bound over {MAX_REPEAT}")
    if hi == 0:
        return ""
    group = expr if re.fullmatch(r"[A-Za-z0-9-]+|\"[^\"]*\"", expr) else f"( {expr} )"
    if (lo, hi) == (0, None):
        return f"{group}*"
    if (lo, hi) == (1, None):
        return f"{group}+"
    if (lo, hi) == (0, 1):
        return f"{group}?"
    if (lo, hi) == (1, 1):
        return expr
    if hi is None:
        return f"{group}{{{lo},}}"
    return f"{group}{{{lo}}}" if lo == hi else f"{group}{{{lo},{hi}}}"


def _seq(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def _count(schema: Mapping[str, Any], name: str) -> int | None:
    value = schema.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value) or value < 0:
        raise GrammarUnsupported(name, f"expected a non-negative integer, got {value!r}")
    return int(value)


def _type_fits(value: Any, kind: str) -> bool:
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return kind == "number" or value == int(value)


class _Converter:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.rules: dict[str, str] = {}
        self.names: set[str] = {*_PRIMITIVES, "root"}  # root is named last, in `grammar`
        self.by_body: dict[str, str] = {}
        self.refs: dict[str, str] = {}
        self.used: list[str] = []  # primitives used, in order of first use

    def grammar(self) -> str:
        expr = self.visit(self.root, "root")
        rules = dict(self.rules)
        referenced = re.compile(rf"(?<![A-Za-z0-9-]){re.escape(expr)}(?![A-Za-z0-9-])")
        if expr in rules and not any(referenced.search(body) for body in rules.values()):
            rules = {"root": rules.pop(expr), **rules}  # the top rule, used nowhere else, is root itself
        else:
            rules = {"root": expr, **rules}
        lines = [f"{name} ::= {body}" for name, body in rules.items()]
        lines += [f"{name} ::= {_PRIMITIVES[name][0]}" for name in self.used]
        return "\n".join(lines) + "\n"

    # -- rules -------------------------------------------------------------------------------------------------------

    def primitive(self, name: str) -> str:
        if name not in self.used:
            self.used.append(name)
            for dep in _PRIMITIVES[name][1]:
                self.primitive(dep)
        return name

    def fresh(self, hint: str) -> str:
        base = re.sub(r"-+", "-", re.sub(r"[^A-Za-z0-9-]+", "-", hint)).strip("-") or "r"
        name, n = base, 1
        while name in self.names:
            n += 1
            name = f"{base}-{n}"
        self.names.add(name)
        return name

    def define(self, hint: str, body: str) -> str:
        """A rule for `body` (one already defined with the same body is reused); a reference's rule, reserved under
        `hint`, gets its body here."""
        if self.rules.get(hint) == "":
            self.rules[hint] = body
            self.by_body.setdefault(body, hint)
            return hint
        if body in self.by_body:
            return self.by_body[body]
        name = self.fresh(hint)
        self.rules[name] = body
        self.by_body[body] = name
        return name

    # -- schemas -----------------------------------------------------------------------------------------------------

    def visit(self, schema: Any, path: str) -> str:
        """The GBNF expression of one (sub)schema."""
        if schema is True:
            return self.primitive("value")
        if schema is False:
            raise GrammarUnsupported("false", "a schema that accepts nothing")
        if not isinstance(schema, Mapping):
            raise GrammarUnsupported("schema", f"expected an object or a boolean, got {type(schema).__name__}")
        for keyword in schema:
            if keyword in UNSUPPORTED and not (keyword == "uniqueItems" and schema[keyword] is False):
                raise GrammarUnsupported(keyword)
        expr = self.core(schema, path)
        if schema.get("nullable") is True and expr != "null":
            return self.define(path, f"{expr} | {self.primitive('null')}")
        return expr

    def core(self, schema: Mapping[str, Any], path: str) -> str:
        composed = [k for k in ("$ref", "anyOf", "oneOf", "allOf") if k in schema]
        if len(composed) > 1:
            raise GrammarUnsupported(composed[1], f"beside {composed[0]}")
        if composed:
            return self.composed(schema, composed[0], path)
        if "const" in schema or "enum" in schema:
            return self.choices(schema, path)
        kind = schema.get("type")
        if isinstance(kind, list):
            if not kind or not all(isinstance(k, str) for k in kind):
                raise GrammarUnsupported("type", f"expected a type name or a list of them, got {kind!r}")
            alternatives = list(dict.fromkeys(self.typed(schema, k, f"{path}-{k}") for k in kind))
            return alternatives[0] if len(alternatives) == 1 else self.define(path, " | ".join(alternatives))
        if kind is None:
            keys = set(schema)
            kind = ("object" if keys & _OBJECT else "array" if keys & _ARRAY else "string" if keys & _STRING
                    else None)
            if kind is None:
                return self.primitive("value")
        if not isinstance(kind, str):
            raise GrammarUnsupported("type", f"expected a type name or a list of them, got {kind!r}")
        return self.typed(schema, kind, path)

    def composed(self, schema: Mapping[str, Any], keyword: str, path: str) -> str:
        if keyword == "allOf":
            return self.visit(self.merged(schema), path)
        asserting = sorted(k for k in schema if k != keyword and k not in ANNOTATIONS and k in _ASSERTING)
        if asserting:
            raise GrammarUnsupported(asserting[0], f"beside {keyword}")
        if keyword == "$ref":
            return self.ref(schema["$ref"])
        options = schema[keyword]
        if not isinstance(options, list) or not options:
            raise GrammarUnsupported(keyword, "expected a non-empty list of schemas")
        alternatives = list(dict.fromkeys(self.visit(s, f"{path}-{i}") for i, s in enumerate(options)))
        return alternatives[0] if len(alternatives) == 1 else self.define(path, " | ".join(alternatives))

    def ref(self, ref: Any) -> str:
        """One rule per referenced schema (reserved before its body, so a schema may refer to itself)."""
        if isinstance(ref, str) and ref in self.refs:
            return self.refs[ref]
        target = self.target(ref)
        name = self.fresh("def-" + (ref.rsplit("/", 1)[-1] if ref != "#" else "root"))
        self.refs[ref] = name
        self.rules[name] = ""  # reserved: `define` fills it, or the schema's expression below
        expr = self.visit(target, name)
        if expr != name:
            self.rules[name] = expr
        return name

    def target(self, ref: Any) -> Any:
        """What a local reference names (a JSON pointer into the root schema)."""
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            raise GrammarUnsupported("$ref", f"only local references (#/$defs/...) are supported, not {ref!r}")
        target: Any = self.root
        for token in ref[2:].split("/") if ref != "#" else []:
            token = unquote(token).replace("~1", "/").replace("~0", "~")
            if isinstance(target, Mapping) and token in target:
                target = target[token]
            elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
                target = target[int(token)]
            else:
                raise GrammarUnsupported("$ref", f"{ref!r} names nothing in the schema")
        return target

    def merged(self, schema: Mapping[str, Any]) -> Mapping[str, Any]:
        """allOf: one schema (annotations beside it), or object schemas merged into one."""
        parts = schema["allOf"]
        if not isinstance(parts, list) or not parts:
            raise GrammarUnsupported("allOf", "expected a non-empty list of schemas")
        rest = {k: v for k, v in schema.items() if k != "allOf" and k not in ANNOTATIONS}
        if len(parts) == 1 and not rest:
            return {"nullable": True, "anyOf": [parts[0]]} if schema.get("nullable") is True else parts[0]
        objects = [self.resolved(p) for p in parts] + ([rest] if rest else [])
        properties: dict[str, Any] = {}
        required: list[str] = []
        extra: Any = None
        for part in objects:
            if not isinstance(part, Mapping) or set(part) - ANNOTATIONS - _OBJECT - {"type"} \
                    or part.get("type", "object") != "object":
                raise GrammarUnsupported("allOf", "only object schemas (properties, required) can be merged")
            for name, sub in (part.get("properties") or {}).items():
                if name in properties and properties[name] != sub:
                    raise GrammarUnsupported("allOf", f"property {name!r} is declared twice, differently")
                properties[name] = sub
            required += [r for r in part.get("required") or [] if r not in required]
            if "additionalProperties" in part:
                if extra is not None and extra != part["additionalProperties"]:
                    raise GrammarUnsupported("allOf", "the parts disagree on additionalProperties")
                extra = part["additionalProperties"]
        for part in objects:
            if part.get("additionalProperties") is False and set(properties) - set(part.get("properties") or {}):
                raise GrammarUnsupported("allOf", "a part forbids the properties another declares")
        out: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
        if extra is not None:
            out["additionalProperties"] = extra
        if schema.get("nullable") is True:
            out["nullable"] = True
        return out

    def resolved(self, schema: Any) -> Any:
        """A schema with its $ref followed (for merging), to the end of a chain."""
        seen: set[str] = set()
        while isinstance(schema, Mapping) and "$ref" in schema:
            ref = schema["$ref"]
            if not isinstance(ref, str) or ref in seen or set(schema) - ANNOTATIONS - {"$ref"}:
                raise GrammarUnsupported("allOf", "a part that is a reference with siblings, or a cycle")
            seen.add(ref)
            schema = self.target(ref)
        return schema

    def choices(self, schema: Mapping[str, Any], path: str) -> str:
        values = [schema["const"]] if "const" in schema else schema["enum"]
        if not isinstance(values, list) or not values:
            raise GrammarUnsupported("enum", "expected a non-empty list")
        kind = schema.get("type")
        kinds = kind if isinstance(kind, list) else [kind] if isinstance(kind, str) else None
        if kinds is not None:
            if schema.get("nullable") is True:
                kinds = [*kinds, "null"]
            values = [v for v in values if any(_type_fits(v, k) for k in kinds)]
        if not values:
            raise GrammarUnsupported("enum", "no value fits the schema's type")
        texts = list(dict.fromkeys(literal(_json_text(v)) for v in values))
        return texts[0] if len(texts) == 1 else self.define(path, " | ".join(texts))

    def typed(self, schema: Mapping[str, Any], kind: str, path: str) -> str:
        if kind == "object":
            return self.object(schema, path)
        if kind == "array":
            return self.array(schema, path)
        if kind == "string":
            return self.string(schema, path)
        if kind in ("number", "integer", "boolean", "null"):
            return self.primitive(kind)
        raise GrammarUnsupported("type", f"unknown type {kind!r} (one of {', '.join(_TYPES)})")

    def string(self, schema: Mapping[str, Any], path: str) -> str:
        lo, hi = _count(schema, "minLength") or 0, _count(schema, "maxLength")
        if (lo, hi) == (0, None):
            return self.primitive("string")
        if hi is not None and hi < lo:
            raise GrammarUnsupported("maxLength", "under minLength: no string fits")
        chars = _repeat(self.primitive("char"), lo, hi, "maxLength" if hi is not None and hi > lo else "minLength")
        return self.define(path, _seq('"\\""', chars, '"\\""'))

    def object(self, schema: Mapping[str, Any], path: str) -> str:
        properties = schema.get("properties")
        if properties is not None and not isinstance(properties, Mapping):
            raise GrammarUnsupported("properties", "expected an object")
        properties = dict(properties or {})
        required = schema.get("required") or []
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise GrammarUnsupported("required", "expected a list of names")
        extra = schema.get("additionalProperties")
        if extra is not None and not isinstance(extra, bool | Mapping):
            raise GrammarUnsupported("additionalProperties", "expected a boolean or a schema")
        if "properties" not in schema and extra is None:
            extra = True  # an object with no properties: any object
        for name in required:
            if name not in properties:
                if extra is False:
                    raise GrammarUnsupported("required", f"{name!r} is required but additionalProperties is false")
                properties[name] = extra if isinstance(extra, Mapping) else True
        if extra is True and not properties:
            return self.primitive("any-object")
        pairs = [(literal(_json_text(name) + ":"), name in required, self.visit(sub, f"{path}-{name}"))
                 for name, sub in properties.items()]
        extra_member = None
        if extra is True or isinstance(extra, Mapping):
            extra_member = _seq(self.key(list(properties), path), '":"', self.visit(extra, f"{path}-extra"))
        return self.define(path, _seq('"{"', self.members(pairs, extra_member, path), '"}"'))

    def members(self, pairs: list[tuple[str, bool, str]], extra: str | None, path: str) -> str:
        """The members between the braces: the declared ones in order (a required one always, an optional one
        maybe), then any extra ones; a comma before each but the first written, whichever that is."""
        n = len(pairs)
        firsts = next((j for j, (_, needed, _) in enumerate(pairs) if needed), n)  # the first required one
        every_optional = firsts == n
        # Which member is written first: declared member j <= firsts (those before it left out), or an extra one.
        shared = firsts > 0 or (every_optional and extra is not None)
        # tails[i]: members i.. after one was written (so each comes with its comma); a rule when several
        # first-member choices share it, so the grammar grows with the members, not with their square.
        tails = [""] * (n + 1)
        tails[n] = _repeat(_seq('","', extra), 0, None, "additionalProperties") if extra else ""
        for i in range(n - 1, 0, -1):
            key, needed, value = pairs[i]
            member = _seq('","', key, value)
            tails[i] = _seq(member if needed else f"( {member} )?", tails[i + 1])
            if shared and len(tails[i]) > 40:
                tails[i] = self.define(f"{path}-tail-{i}", tails[i])
        options = [_seq(key, value, tails[j + 1]) for j, (key, _, value) in enumerate(pairs[:firsts + 1])]
        if every_optional and extra is not None:
            options.append(_seq(extra, tails[n]))
        if not options:
            return ""
        if every_optional:
            return f"( {' | '.join(options)} )?"
        return options[0] if len(options) == 1 else f"( {' | '.join(options)} )"

    def key(self, declared: list[str], path: str) -> str:
        """A member name that is none of the declared ones (extra members come after them: a repeated name would
        be a duplicate key). Written without escapes, so a name cannot spell a declared one another way."""
        if not declared:
            return self.primitive("string")
        char = self.primitive("key-char")
        trie: dict[str, Any] = {}
        for name in declared:
            node = trie
            for c in name:
                node = node.setdefault(c, {})
            node[""] = {}  # a declared name ends here

        def node_rule(node: dict[str, Any], hint: str) -> str:
            children = sorted(c for c in node if c)
            options = [] if "" in node else ['"\\""']
            excluded = "".join(_class_char(c) for c in children)
            options.append(_seq(f'[^"\\\\\\x00-\\x1F{excluded}]', f"{char}*", '"\\""'))
            for i, c in enumerate(children):
                options.append(_seq(literal(c), node_rule(node[c], f"{hint}-{i}")))
            return self.define(hint, " | ".join(options))

        return _seq('"\\""', node_rule(trie, f"{path}-key"))

    def array(self, schema: Mapping[str, Any], path: str) -> str:
        prefix = schema.get("prefixItems") or []
        items = schema.get("items")
        if isinstance(items, list):  # draft 7's tuple form
            prefix, rest = items, schema.get("additionalItems", True)
        else:
            rest = items if "items" in schema else True
        if not isinstance(prefix, list):
            raise GrammarUnsupported("prefixItems", "expected a list of schemas")
        lo, hi = _count(schema, "minItems") or 0, _count(schema, "maxItems")
        if rest is False:
            hi = len(prefix) if hi is None else min(hi, len(prefix))
        if hi is not None and hi < lo:
            raise GrammarUnsupported("minItems", "more than the array may hold: no array fits")

        def from_(i: int) -> str:
            if hi is not None and i >= hi:
                return ""
            comma = '","' if i else ""
            if i < len(prefix):
                inner = _seq(comma, self.visit(prefix[i], f"{path}-{i}"), from_(i + 1))
                return inner if i < lo else f"( {inner} )?"
            item = self.visit(rest, f"{path}-item")
            need, most = max(0, lo - i), None if hi is None else hi - i
            if i:
                return _repeat(_seq('","', item), need, most, "maxItems" if most is not None else "minItems")
            more = _repeat(_seq('","', item), max(need - 1, 0), None if most is None else most - 1,
                           "maxItems" if most is not None else "minItems")
            return _seq(item, more) if need else f"( {_seq(item, more)} )?"

        return self.define(path, _seq('"["', from_(0), '"]"'))


# What a keyword beside $ref / anyOf / oneOf would assert (an intersection the grammar does not build).
_ASSERTING = _OBJECT | _ARRAY | _STRING | _COMPOSED | {"type", "enum", "const"}
