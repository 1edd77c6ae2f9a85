"""The compact JSON-schema grammar (blazar/dialects/grammar.py): what each keyword's grammar accepts and refuses, read
by a small GBNF matcher (tests/support/gbnf.py) as the engine would read it; the keywords it refuses to convert;
escaping; rule names; determinism."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import pytest

from blazar.dialects.grammar import any_object_grammar, literal, schema_grammar
from blazar.errors import GrammarUnsupported
from tests.support.gbnf import Grammar, parse


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def grammar(schema: Any) -> Grammar:
    return parse(schema_grammar(schema))


def accepts(schema: Any, *values: Any) -> None:
    g = grammar(schema)
    for v in values:
        text = v if isinstance(v, str) and v[:1] in '{["' and _is_json(v) else compact(v)
        assert g.accepts(text), f"{text!r} should match {schema}"


def refuses(schema: Any, *texts: str) -> None:
    g = grammar(schema)
    for text in texts:
        assert not g.accepts(text), f"{text!r} should not match {schema}"


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


# -- scalars -----------------------------------------------------------------------------------------------------------

def test_a_string_is_any_json_string_with_any_escape_and_raw_unicode() -> None:
    g = grammar({"type": "string"})
    for text in ('""', '"plain"', '"é ü 東京 🙂"', r'"a\"b\\c\/d\b\f\n\r\t"', r'"\u00e9\uD83D\uDE00"'):
        assert g.accepts(text), text
    for text in ('"a"b"', '"a\\"', '"\x01"', '"tab\there"', "'x'", '"\\x41"', '"\\u12"', 'plain'):
        assert not g.accepts(text), text


@pytest.mark.parametrize(("kind", "good", "bad"), [
    ("integer", ["0", "7", "-12", "1234567890123456"], ["-0", "01", "1.0", "1e3", "+1", " 1", "12345678901234567"]),
    ("number", ["0", "-0.5", "3.25", "1e10", "2.5E-3", "-7"], ["01", ".5", "1.", "1e", "--1", "1 ", "NaN"]),
    ("boolean", ["true", "false"], ["True", "1", "null"]),
    ("null", ["null"], ["None", ""]),
])
def test_scalars_are_their_json_and_nothing_around_it(kind: str, good: list[str], bad: list[str]) -> None:
    g = grammar({"type": kind})
    for text in good:
        assert g.accepts(text), text
    for text in bad:
        assert not g.accepts(text), text


def test_string_lengths_count_characters_an_escape_being_one() -> None:
    schema = {"type": "string", "minLength": 2, "maxLength": 3}
    accepts(schema, "ab", "abc", "é東", '"\\n\\t"', '"\\u00e9x"')
    refuses(schema, '"a"', '"abcd"', '"\\n"')
    accepts({"type": "string", "minLength": 1}, "x", "x" * 40)
    refuses({"type": "string", "minLength": 1}, '""')


# -- objects -----------------------------------------------------------------------------------------------------------

def test_an_object_has_no_whitespace_anywhere() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array"}},
              "required": ["a", "b"]}
    accepts(schema, {"a": 1, "b": [1, {"x": None}]})
    refuses(schema, '{"a": 1,"b":[]}', '{ "a":1,"b":[]}', '{"a":1 ,"b":[]}', '{"a":1,"b":[ ]}', '{"a":1,"b":[]} ',
            '{\n"a":1,"b":[]}', '{"a":1,"b":[1, 2]}')


def test_properties_come_in_declared_order_required_always_optional_maybe() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                               "c": {"type": "integer"}}, "required": ["b"]}
    accepts(schema, {"b": 1}, {"a": 1, "b": 2}, {"b": 2, "c": 3}, {"a": 1, "b": 2, "c": 3})
    refuses(schema, "{}", '{"a":1}', '{"c":1}', '{"a":1,"c":3}', '{"b":2,"a":1}', '{"b":1,}', '{,"b":1}',
            '{"a":1,,"b":1}', '{"b":1,"d":4}')


@pytest.mark.parametrize("required", [[], ["c"], ["a", "d"]])
def test_every_subset_of_optional_properties_has_its_commas_right(required: list[str]) -> None:
    names = ["a", "b", "c", "d"]
    schema = {"type": "object", "properties": {n: {"type": "boolean"} for n in names}, "required": required}
    g = grammar(schema)
    for k in range(len(names) + 1):
        for subset in itertools.combinations(names, k):
            text = compact({n: True for n in subset})
            assert g.accepts(text) == (set(required) <= set(subset)), text
            if len(subset) > 1:
                assert not g.accepts(compact({n: True for n in reversed(subset)}))
                assert not g.accepts(text.replace(",", ",,", 1))
            assert not g.accepts(text[:-1] + ",}") and not g.accepts("{," + text[1:])


def test_no_additional_properties_when_absent_or_false() -> None:
    for extra in ({}, {"additionalProperties": False}):
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}, **extra}
        accepts(schema, {}, {"a": 1})
        refuses(schema, '{"b":1}', '{"a":1,"b":2}')


def test_additional_properties_come_after_the_declared_ones_never_repeating_one() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "ab": {"type": "integer"}},
              "required": ["ab"], "additionalProperties": {"type": "string"}}
    accepts(schema, {"ab": 1}, {"a": 1, "ab": 2}, {"ab": 1, "x": "s"},
            {"a": 1, "ab": 2, "abc": "s", "": "t", "b": "u"}, {"ab": 1, "A": "s", "aa": "t"})
    refuses(schema, '{"ab":1,"x":2}', '{"x":"s","ab":1}', '{"ab":1,"a":"s"}', '{"ab":1,"ab":"s"}',
            '{"ab":1,"x":"s",}', '{"ab":1,"\\u0061":"s"}')
    anything = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True}
    accepts(anything, {}, {"b": [1]}, {"a": 1, "b": {"c": None}}, {"b": 1, "c": 2})
    refuses(anything, '{"b":1,"a":1}', '{"a":1,"a":2}')


def test_an_object_without_properties_is_any_object() -> None:
    schema = {"type": "object"}
    accepts(schema, {}, {"x": [1, {"y": None}], "z": "é"})
    refuses(schema, "[]", '"x"', '{"x":1 }', '{"x" :1}')
    assert grammar(schema).accepts(compact({"deep": {"er": [[], {}, -1.5, True]}}))
    refuses({"type": "object", "additionalProperties": False}, '{"a":1}')
    accepts({"type": "object", "additionalProperties": False}, {})
    accepts({"type": "object", "additionalProperties": {"type": "integer"}}, {}, {"a": 1, "b": 2})
    refuses({"type": "object", "additionalProperties": {"type": "integer"}}, '{"a":"x"}')


def test_required_names_without_properties_must_be_there() -> None:
    accepts({"type": "object", "required": ["id"]}, {"id": 1}, {"id": "x", "more": True})
    refuses({"type": "object", "required": ["id"]}, "{}", '{"more":true}')
    with pytest.raises(GrammarUnsupported) as e:
        schema_grammar({"type": "object", "properties": {}, "required": ["id"], "additionalProperties": False})
    assert e.value.keyword == "required"


def test_a_type_is_inferred_from_its_keywords() -> None:
    accepts({"properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"a": 1})
    accepts({"items": {"type": "integer"}}, [1, 2])
    accepts({"maxLength": 2}, "ab")
    accepts({}, 1, "x", None, [1], {"a": {}})
    accepts(True, {"a": [1.5]})


# -- arrays ------------------------------------------------------------------------------------------------------------

def test_array_items_and_bounds() -> None:
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3}
    accepts(schema, [1], [1, 2], [1, 2, 3])
    refuses(schema, "[]", "[1,2,3,4]", "[1, 2]", '["x"]', "[1,]")
    accepts({"type": "array", "items": {"type": "integer"}}, [], [5], list(range(12)))
    accepts({"type": "array", "items": {"type": "integer"}, "minItems": 3}, [1, 2, 3], [1, 2, 3, 4, 5])
    refuses({"type": "array", "items": {"type": "integer"}, "minItems": 3}, "[1,2]")
    accepts({"type": "array", "maxItems": 1}, [], [{"any": "thing"}])
    refuses({"type": "array", "maxItems": 0}, "[1]")


def test_prefix_items_then_items_or_nothing() -> None:
    schema = {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": {"type": "boolean"}}
    accepts(schema, [], ["a"], ["a", 1], ["a", 1, True, False])
    refuses(schema, "[1]", '["a","b"]', '["a",1,2]')
    closed = {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False,
              "minItems": 2}
    accepts(closed, ["a", 1])
    refuses(closed, '["a"]', '["a",1,true]')
    draft7 = {"type": "array", "items": [{"type": "string"}], "additionalItems": False}
    accepts(draft7, [], ["a"])
    refuses(draft7, '["a","b"]')


# -- enum, const, alternatives, references -----------------------------------------------------------------------------

def test_enum_and_const_are_their_compact_json_literals() -> None:
    values = ["plain", 'quo"te', "back\\slash", "new\nline", "tab\t", "ctrl\x01", "é東🙂", "^]-[", 12, 1.5, None,
              True, {"k": [1, "v"]}]
    g = grammar({"enum": values})
    for v in values:
        assert g.accepts(compact(v)), v
    assert not g.accepts('"other"') and not g.accepts('{"k": [1,"v"]}') and not g.accepts("13")
    accepts({"const": "get_weather"}, "get_weather")
    refuses({"const": "get_weather"}, '"get_time"', '"get_weather "')


def test_an_enum_keeps_the_values_its_type_allows() -> None:
    schema = {"type": "string", "enum": ["a", 1, None]}
    accepts(schema, "a")
    refuses(schema, "1", "null")
    accepts({"type": "string", "enum": ["a", None], "nullable": True}, "a", None)
    with pytest.raises(GrammarUnsupported):
        schema_grammar({"type": "integer", "enum": ["a"]})


def test_any_of_one_of_and_type_lists_are_alternatives() -> None:
    schema = {"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"x": {"type": "string"}},
                                              "required": ["x"]}]}
    accepts(schema, 3, {"x": "y"})
    refuses(schema, '"3"', "{}")
    accepts({"oneOf": [{"type": "string"}, {"type": "null"}]}, "s", None)
    accepts({"type": ["string", "null"], "maxLength": 2}, "ab", None)
    refuses({"type": ["string", "null"], "maxLength": 2}, '"abc"', "1")
    accepts({"type": "integer", "nullable": True}, 1, None)
    refuses({"type": "integer", "nullable": True}, '"1"')


def test_nullable_wraps_whatever_it_is_on_the_top_included() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "nullable": True}
    accepts(schema, None, {"a": 1})
    refuses(schema, "{}", '"a"')
    accepts({"type": "array", "items": {"type": "integer", "nullable": True}, "nullable": True}, None, [1, None])


def test_all_of_merges_objects() -> None:
    schema = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                        {"properties": {"b": {"type": "string"}}}], "description": "merged"}
    accepts(schema, {"a": 1}, {"a": 1, "b": "x"})
    refuses(schema, '{"b":"x"}', '{"a":1,"c":2}')
    accepts({"allOf": [{"$ref": "#/$defs/A"}], "$defs": {"A": {"type": "integer"}}}, 5)
    merged_refs = {"$defs": {"A": {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                             "B": {"properties": {"b": {"type": "integer"}}, "required": ["b"]}},
                   "allOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}]}
    accepts(merged_refs, {"a": 1, "b": 2})
    refuses(merged_refs, '{"a":1}')


@pytest.mark.parametrize("schema", [
    {"allOf": [{"type": "string"}, {"maxLength": 3}]},
    {"allOf": [{"properties": {"a": {"type": "integer"}}}, {"properties": {"a": {"type": "string"}}}]},
    {"allOf": [{"properties": {"a": {"type": "integer"}}, "additionalProperties": False},
               {"properties": {"b": {"type": "integer"}}}]},
])
def test_all_of_that_is_not_a_merge_of_objects_is_unsupported(schema: dict) -> None:
    with pytest.raises(GrammarUnsupported) as e:
        schema_grammar(schema)
    assert e.value.keyword == "allOf"


def test_local_references_recurse_with_one_rule_each() -> None:
    tree = {"$defs": {"Node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}, "required": ["v"]}},
        "type": "object", "properties": {"root": {"$ref": "#/$defs/Node"}, "also": {"$ref": "#/$defs/Node"}},
        "required": ["root"]}
    text = schema_grammar(tree)
    assert len(re.findall(r"^def-Node ::=", text, re.M)) == 1 and not re.search(r"^def-Node-\d", text, re.M)
    accepts(tree, {"root": {"v": 1}}, {"root": {"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}, {"v": 4}]},
                                       "also": {"v": 0}})
    refuses(tree, '{"root":{"kids":[]}}', '{"root":{"v":1,"kids":[{}]}}')
    accepts({"definitions": {"N": {"type": "integer"}}, "type": "array", "items": {"$ref": "#/definitions/N"}}, [1])
    linked = {"type": "object", "properties": {"next": {"$ref": "#"}, "v": {"type": "integer"}}, "required": ["v"]}
    accepts(linked, {"v": 1}, {"next": {"v": 2}, "v": 1}, {"next": {"next": {"v": 3}, "v": 2}, "v": 1})
    escaped = {"$defs": {"a/b": {"type": "integer"}, "c~d": {"type": "string"}},
               "type": "array", "prefixItems": [{"$ref": "#/$defs/a~1b"}, {"$ref": "#/$defs/c~0d"}]}
    accepts(escaped, [1, "x"])


@pytest.mark.parametrize(("ref", "keyword"), [("https://example.com/s.json", "$ref"), ("#/$defs/missing", "$ref"),
                                              ("other.json#/$defs/A", "$ref"), ("#anchor", "$ref")])
def test_remote_or_dangling_references_are_unsupported(ref: str, keyword: str) -> None:
    with pytest.raises(GrammarUnsupported) as e:
        schema_grammar({"$defs": {"A": {"type": "integer"}}, "$ref": ref})
    assert e.value.keyword == keyword and ref in str(e.value)


# -- what is ignored, what is refused ----------------------------------------------------------------------------------

def test_annotations_change_nothing() -> None:
    bare = {"type": "object", "properties": {"when": {"type": "string"}}, "required": ["when"]}
    noted = {"type": "object", "title": "T", "description": "D",
             "$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "urn:x", "$comment": "c",
             "strict": True, "examples": [{}], "default": {}, "deprecated": False,
             "properties": {"when": {"type": "string", "format": "date-time", "readOnly": True, "writeOnly": False,
                                     "description": "when", "title": "When", "default": "now"}},
             "required": ["when"], "x-vendor": 1}
    assert schema_grammar(noted) == schema_grammar(bare)
    assert schema_grammar({"type": "array", "uniqueItems": False}) == schema_grammar({"type": "array"})


@pytest.mark.parametrize("keyword, schema", [
    ("pattern", {"type": "string", "pattern": "^a"}),
    ("minimum", {"type": "integer", "minimum": 0}),
    ("maximum", {"type": "number", "maximum": 9}),
    ("exclusiveMinimum", {"type": "number", "exclusiveMinimum": 0}),
    ("exclusiveMaximum", {"type": "number", "exclusiveMaximum": 0}),
    ("multipleOf", {"type": "integer", "multipleOf": 2}),
    ("not", {"not": {"type": "string"}}),
    ("if", {"if": {"type": "string"}, "then": {"maxLength": 2}}),
    ("patternProperties", {"type": "object", "patternProperties": {"^x": {}}}),
    ("propertyNames", {"type": "object", "propertyNames": {"maxLength": 3}}),
    ("dependentRequired", {"type": "object", "dependentRequired": {"a": ["b"]}}),
    ("uniqueItems", {"type": "array", "uniqueItems": True}),
    ("contains", {"type": "array", "contains": {"type": "integer"}}),
    ("minProperties", {"type": "object", "minProperties": 1}),
    ("minimum", {"type": "object", "properties": {"deep": {"type": "array", "items": {"minimum": 1}}}}),
    ("type", {"anyOf": [{"type": "string"}], "type": "string"}),
])
def test_what_the_grammar_cannot_express_is_refused_by_keyword(keyword: str, schema: dict) -> None:
    with pytest.raises(GrammarUnsupported) as e:
        schema_grammar(schema)
    assert e.value.keyword == keyword and keyword in str(e.value)


def test_a_bound_too_large_for_the_engine_is_refused() -> None:
    with pytest.raises(GrammarUnsupported):
        schema_grammar({"type": "string", "maxLength": 5000})
    schema_grammar({"type": "string", "maxLength": 1000})


# -- the grammar's text ------------------------------------------------------------------------------------------------

def test_rule_names_are_identifiers_whatever_the_property_names() -> None:
    schema = {"type": "object", "properties": {
        name: {"type": "object", "properties": {"in": {"type": "string", "maxLength": 2}}}
        for name in ("with space", 'quo"te', "東京", "-", "", "a_b", "a-b", "A B")}}
    text = schema_grammar(schema)
    names = [line.split(" ::= ")[0] for line in text.splitlines()]
    assert all(re.fullmatch(r"[A-Za-z0-9-]+", n) for n in names) and len(names) == len(set(names))
    accepts(schema, {'quo"te': {"in": "x"}, "東京": {}, "A B": {"in": "ab"}})


def test_literals_escape_what_gbnf_needs() -> None:
    assert literal('a"b\\c\nd\re\tf\x01g\x7fé') == '"a\\"b\\\\c\\nd\\re\\tf\\x01g\\x7Fé"'
    assert parse(f"root ::= {literal(chr(0x1F600) + '^]')}").accepts(chr(0x1F600) + "^]")


def test_the_same_schema_gives_the_same_grammar() -> None:
    schema = {"anyOf": [{"type": "object", "properties": {"name": {"const": n}, "arguments": {
        "type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}}},
        "required": ["name", "arguments"]} for n in ("a", "b")]}
    first = schema_grammar(schema)
    assert first == schema_grammar(json.loads(json.dumps(schema)))
    assert first.startswith("root ::= ") and first.endswith("\n")


def test_the_forced_call_grammar_for_one_tool_is_compact() -> None:
    schema = {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
        "required": ["name", "arguments"]}
    assert schema_grammar(schema) == (
        'root ::= "{" "\\"name\\":" "\\"get_weather\\"" "," "\\"arguments\\":" root-arguments "}"\n'
        'root-arguments ::= "{" "\\"city\\":" string "}"\n'
        'string ::= "\\"" char* "\\""\n'
        'char ::= [^"\\\\\\x00-\\x1F] | "\\\\" ( ["\\\\/bfnrt] | "u" [0-9a-fA-F]{4} )\n')


def test_any_object_grammar() -> None:
    g = parse(any_object_grammar())
    for text in ("{}", '{"a":1}', '{"a":{"b":[1,2,{"c":null}]},"d":"e"}'):
        assert g.accepts(text), text
    for text in ("[]", "1", '{"a": 1}', "{ }", '{"a":1,}'):
        assert not g.accepts(text), text
