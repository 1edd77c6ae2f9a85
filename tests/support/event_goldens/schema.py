"""An event class's JSON schema in the form its golden records, and what changed between two such schemas.

The recorded form is pydantic's validation schema with the nested models inlined ($ref resolved), titles and
descriptions dropped (a docstring or a class name is not part of the wire format), `required` and `enum` sorted (field
order is not either), `const` written as a one-value `enum` (a Literal of one value and an Enum of one member accept
the same), and the value of every default factory shown as the field's default (pydantic leaves it out).

A change is compatible when every payload the old schema accepts still decodes, with the same meaning, under the new
one: a new field with a default, a field that gained a default, a type that only widened (a Literal with more choices,
`int` -> `int | None`). Anything else (a field removed or renamed, a new required field, a changed default, a
narrowed or different type) would make events already in logs fail to decode or read differently.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

Schema = dict[str, Any]

_NO_DEFAULT = object()


class _FactoryDefaults(GenerateJsonSchema):
    """Shows `Field(default_factory=list)` as `"default": []`: a changed factory changes what old payloads read."""

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        factory = schema.get("default_factory")
        if factory is not None and not schema.get("default_factory_takes_data"):
            return factory()  # type: ignore[call-arg]
        return super().get_default_value(schema)


def normalized_schema(model: type[BaseModel]) -> Schema:
    raw: JsonSchemaValue = model.model_json_schema(schema_generator=_FactoryDefaults)
    return normalize(raw)


def normalize(schema: Schema) -> Schema:
    """The recorded form of `schema`; a recorded schema passes through unchanged (so does one recorded by an earlier
    version of this function, once it is read through this one)."""
    return _normal(schema, schema.get("$defs", {}))


def _normal(node: Schema, defs: dict[str, Schema]) -> Schema:
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[1]]
        return _normal({**target, **{k: v for k, v in node.items() if k != "$ref"}}, defs)
    out: Schema = {}
    for key, value in node.items():
        if key in ("title", "description", "$defs"):
            continue
        if key == "properties":
            out[key] = {name: _normal(sub, defs) for name, sub in value.items()}
        elif key in ("anyOf", "allOf", "oneOf", "prefixItems"):
            out[key] = [_normal(sub, defs) for sub in value]
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _normal(value, defs)
        elif key in ("required", "enum"):
            out[key] = sorted(value, key=orjson.dumps)
        elif key == "const":  # a Literal of one value; an Enum of one member says "enum": the same values
            out["enum"] = [value]
        else:
            out[key] = value
    return out


class Change(NamedTuple):
    path: str  # the field, dotted; `[]` an element of a list, `{}` a value of a dict
    what: str
    compatible: bool

    def line(self) -> str:
        return f"{self.path}: {self.what} ({'compatible' if self.compatible else 'NOT compatible'})"


def schema_changes(old: Schema, new: Schema) -> list[Change]:
    """What changed from the recorded schema `old` to the current `new`, field by field."""
    return _model_changes(old, new, "")


def _is_model(s: Schema) -> bool:
    return s.get("type") == "object" and "properties" in s


def _model_changes(old: Schema, new: Schema, path: str) -> list[Change]:
    out: list[Change] = []
    old_props, new_props = old.get("properties", {}), new.get("properties", {})
    old_req, new_req = set(old.get("required", [])), set(new.get("required", []))
    for name in sorted(old_props.keys() | new_props.keys()):
        where = f"{path}.{name}" if path else name
        if name not in new_props:
            out.append(Change(where, "removed (or renamed): a payload that holds it no longer decodes", False))
        elif name not in old_props:
            sub = new_props[name]
            if name in new_req:
                out.append(Change(where, f"added, required ({show(sub)}): a payload without it no longer decodes",
                                  False))
            else:
                out.append(Change(where, f"added with default {_json(sub.get('default'))} ({show(sub)})", True))
        else:
            out += _field_changes(old_props[name], new_props[name], name in old_req, name in new_req, where)
    rest_old = {k: v for k, v in old.items() if k not in ("properties", "required")}
    rest_new = {k: v for k, v in new.items() if k not in ("properties", "required")}
    if rest_old != rest_new:
        out.append(Change(path or "(the event)", f"{_json(rest_old)} -> {_json(rest_new)}", False))
    return out


def _field_changes(old: Schema, new: Schema, old_req: bool, new_req: bool, where: str) -> list[Change]:
    out: list[Change] = []
    old_default, new_default = old.get("default", _NO_DEFAULT), new.get("default", _NO_DEFAULT)
    if old_req and not new_req:
        out.append(Change(where, f"gained a default ({_json(new_default)})", True))
    elif new_req and not old_req:
        out.append(Change(where, "lost its default: a payload recorded without the field no longer decodes", False))
    elif old_default != new_default:
        out.append(Change(where, f"default {_json(old_default)} -> {_json(new_default)}: a payload recorded without "
                                 "the field (before it existed) would now read differently", False))
    out += _type_changes(_sans_default(old), _sans_default(new), where)
    return out


def _type_changes(old: Schema, new: Schema, where: str) -> list[Change]:
    if old == new:
        return []
    if _is_model(old) and _is_model(new):
        return _model_changes(old, new, where)
    if set(old) == set(new) == {"type", "items"} and old["type"] == new["type"] == "array":
        return _type_changes(old["items"], new["items"], f"{where}[]")
    if _is_dict(old) and _is_dict(new):
        return _type_changes(old["additionalProperties"], new["additionalProperties"], f"{where}{{}}")
    if set(old) == set(new) == {"anyOf"} and len(old["anyOf"]) == len(new["anyOf"]):
        return [c for o, n in zip(old["anyOf"], new["anyOf"], strict=True) for c in _type_changes(o, n, where)]
    old_choices, new_choices = _choices(old), _choices(new)
    if old_choices is not None and new_choices is not None and old.get("type") == new.get("type"):
        lost = [c for c in old_choices if c not in new_choices]
        gained = [c for c in new_choices if c not in old_choices]
        if lost:
            return [Change(where, f"choices {_json(lost)} removed: a payload that holds one no longer decodes", False)]
        if gained:
            return [Change(where, f"choices {_json(gained)} added", True)]
    if _accepts(new, old):
        return [Change(where, f"widened: {show(old)} -> {show(new)}", True)]
    return [Change(where, f"type {show(old)} -> {show(new)}", False)]


def _sans_default(s: Schema) -> Schema:
    return {k: v for k, v in s.items() if k != "default"}


def _is_dict(s: Schema) -> bool:
    return s.get("type") == "object" and "properties" not in s and isinstance(s.get("additionalProperties"), dict)


def _choices(s: Schema) -> list[Any] | None:
    if "enum" in s:
        return list(s["enum"])
    return None


def _branches(s: Schema) -> list[Schema]:
    return list(s["anyOf"]) if set(s) == {"anyOf"} else [s]


def _accepts(new: Schema, old: Schema) -> bool:
    """Does `new` accept every value `old` accepts? (Each branch of `old` within some branch of `new`.)"""
    return all(any(_branch_accepts(n, o) for n in _branches(new)) for o in _branches(old))


def _branch_accepts(new: Schema, old: Schema) -> bool:
    if new == old:
        return True
    old_choices, new_choices = _choices(old), _choices(new)
    if old_choices is not None:
        if new_choices is not None:
            return old.get("type") == new.get("type") and all(c in new_choices for c in old_choices)
        return new == {"type": old.get("type")}  # a plain string accepts every string choice
    if old == {"type": "integer"} and new == {"type": "number"}:
        return True
    if _is_model(old) and _is_model(new):
        return all(c.compatible for c in _model_changes(old, new, ""))
    return False


def show(s: Schema) -> str:
    """A schema in a few words, for a message: `integer | null`, `'a' | 'b'`, `list of string`."""
    if set(s) - {"default"} == {"anyOf"}:
        return " | ".join(show(b) for b in s["anyOf"])
    choices = _choices(s)
    if choices is not None:
        return " | ".join(_json(c) for c in choices)
    if s.get("type") == "array" and "items" in s:
        return f"list of {show(s['items'])}"
    if _is_model(s):
        return "object {" + ", ".join(s["properties"]) + "}"
    if _is_dict(s):
        return f"dict of {show(s['additionalProperties'])}"
    if set(s) - {"default"} == {"type"}:
        return str(s["type"])
    return _json(_sans_default(s))


def _json(value: Any) -> str:
    if value is _NO_DEFAULT:
        return "(none)"
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
