"""A small JSON Schema (draft 2020-12 subset) checker for paraplan's own plan schema.

The allowed dependencies do not include a JSON Schema library, so this implements exactly the
keywords plan.schema.json uses: type, properties, required, additionalProperties, enum,
minimum, maximum, items, const. Unknown keywords in the schema are an error, not ignored.
"""

from __future__ import annotations

import math
from typing import Any

from paraplan.errors import InputError, InternalError

_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
    "integer": int, "number": (int, float),
}
_KEYWORDS = {"type", "properties", "required", "additionalProperties", "enum", "minimum", "maximum", "items",
             "const", "description", "$schema", "$id", "title"}


def _type_ok(value: Any, expected: str | list[str]) -> bool:
    names = [expected] if isinstance(expected, str) else expected
    for name in names:
        if isinstance(value, bool) and name in ("integer", "number"):
            continue
        if isinstance(value, _TYPES[name]):
            return True
    return False


def _errors(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    unknown = set(schema) - _KEYWORDS
    if unknown:
        raise ValueError(f"schema at {path} uses unsupported keywords {sorted(unknown)}")
    if "type" in schema and not _type_ok(value, schema["type"]):
        return [f"{path}: expected {schema['type']}, got {type(value).__name__}"]
    problems = []
    if isinstance(value, float) and not math.isfinite(value):
        problems.append(f"{path}: {value} is not a finite number (JSON has no NaN or Infinity)")
    if "const" in schema and value != schema["const"]:
        problems.append(f"{path}: must be {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if "minimum" in schema and isinstance(value, (int, float)) and value < schema["minimum"]:
        problems.append(f"{path}: {value} is below the minimum {schema['minimum']}")
    if "maximum" in schema and isinstance(value, (int, float)) and value > schema["maximum"]:
        problems.append(f"{path}: {value} is above the maximum {schema['maximum']}")
    if isinstance(value, dict):
        problems += [f"{path}: missing required key {key!r}" for key in schema.get("required", ()) if key not in value]
        properties = schema.get("properties", {})
        for key, item in value.items():
            if key in properties:
                problems += _errors(item, properties[key], f"{path}.{key}")
            elif schema.get("additionalProperties", True) is False:
                problems.append(f"{path}: unknown key {key!r}")
            elif isinstance(schema.get("additionalProperties"), dict):
                problems += _errors(item, schema["additionalProperties"], f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            problems += _errors(item, schema["items"], f"{path}[{index}]")
    return problems


def schema_errors(value: Any, schema: dict[str, Any]) -> list[str]:
    """Every violation of ``schema`` by ``value``, as readable paths."""
    return _errors(value, schema, "$")


def validate_own(value: Any, schema: dict[str, Any]) -> None:
    """Check a plan paraplan itself built: a failure is paraplan's defect (InternalError), not the user's."""
    try:
        validate_instance(value, schema, origin="the plan paraplan built")
    except InputError as exc:
        raise InternalError(str(exc)) from None


def validate_instance(value: Any, schema: dict[str, Any], origin: str = "plan") -> None:
    """InputError naming the first violation, if any."""
    problems = schema_errors(value, schema)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InputError(f"{origin} does not match the plan schema: {problems[0]}{more}")
