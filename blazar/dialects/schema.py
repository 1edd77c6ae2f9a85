"""A client's JSON schema (structured output, tool parameters) is checked here before the engine sees it: a schema
that is not one answers 400 in the caller's dialect, never an engine error or an unconstrained answer."""

from __future__ import annotations

from typing import Any

from jsonschema import SchemaError, validators

from blazar.dialects.errors import DialectError


def check_schema(schema: Any, where: str) -> dict[str, Any] | bool:
    """`schema`, typed, when it is a valid JSON schema (by its own $schema's meta-schema, draft 2020-12 when it names
    none); else DialectError naming `where`."""
    if not isinstance(schema, dict | bool):
        raise DialectError(f"{where}: a JSON schema must be an object, not {type(schema).__name__}",
                           code="invalid_schema")
    if isinstance(schema, bool):
        return schema
    if "$schema" in schema and not isinstance(schema["$schema"], str):
        raise DialectError(f"{where}.$schema: must be a string (a meta-schema URI)", code="invalid_schema")
    try:
        validators.validator_for(schema).check_schema(schema)
    except SchemaError as e:
        path = ".".join(str(p) for p in e.absolute_path)
        raise DialectError(f"{where}{'.' + path if path else ''}: invalid JSON schema: {e.message}",
                           code="invalid_schema") from None
    except RecursionError:  # bodies are bounded in depth before this; a schema that still recurses is refused
        raise DialectError(f"{where}: the JSON schema nests too deeply to check", code="invalid_schema") from None
    return schema


def check_response_format(rf: Any) -> None:
    """OpenAI's `response_format`: text, json_object, or json_schema with a valid schema."""
    if rf is None:
        return
    if not isinstance(rf, dict):
        raise DialectError("response_format: must be an object such as {\"type\": \"json_object\"}")
    kind = rf.get("type")
    if kind in ("text", "json_object"):
        return
    if kind != "json_schema":
        raise DialectError(f"response_format.type: must be 'text', 'json_object' or 'json_schema', not {kind!r}")
    spec = rf.get("json_schema")
    if not isinstance(spec, dict) or "schema" not in spec:
        raise DialectError("response_format.json_schema: must be an object with a 'schema'")
    check_schema(spec["schema"], "response_format.json_schema.schema")


def check_tools(tools: Any) -> None:
    """OpenAI-shaped tools: each a function with a name and, when given, a valid parameters schema."""
    if tools is None:
        return
    if not isinstance(tools, list):
        raise DialectError("tools: must be a list")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise DialectError(f"tools.{i}: must be {{\"type\": \"function\", \"function\": {{...}}}}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise DialectError(f"tools.{i}.function.name: a non-empty string is required")
        if fn.get("parameters") is not None:
            check_schema(fn["parameters"], f"tools.{i}.function.parameters")
