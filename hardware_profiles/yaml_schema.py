"""Strict reading of the catalog's YAML files: malformed text, unknown or missing keys are errors."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import yaml

from paraplan.errors import InputError


def parse_yaml(text: str, origin: str) -> dict[str, Any]:
    """Parse YAML text whose top level must be a mapping."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"{origin}: malformed YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise InputError(f"{origin}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def check_keys(entry: Any, where: str, required: Iterable[str], optional: Iterable[str] = ()) -> dict:
    """Return ``entry`` if it is a mapping with every required key and no unknown key."""
    if not isinstance(entry, dict):
        raise InputError(f"{where}: expected a mapping, got {type(entry).__name__}")
    required, optional = set(required), set(optional)
    missing = sorted(required - entry.keys())
    if missing:
        raise InputError(f"{where}: missing key(s) {', '.join(missing)}")
    unknown = sorted(set(entry) - required - optional)
    if unknown:
        allowed = ", ".join(sorted(required | optional))
        raise InputError(f"{where}: unknown key(s) {', '.join(map(str, unknown))} (allowed: {allowed})")
    return entry


def positive_number(value: Any, where: str) -> float:
    """A finite number > 0 (booleans are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not value > 0:
        raise InputError(f"{where}: expected a positive number, got {value!r}")
    return float(value)


def positive_int(value: Any, where: str) -> int:
    """An integer > 0 (``8.0`` is refused: sizes are counts)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"{where}: expected a positive integer, got {value!r}")
    return value


def fraction(value: Any, where: str) -> float:
    """A number in (0, 1]."""
    number = positive_number(value, where)
    if number > 1:
        raise InputError(f"{where}: expected a fraction in (0, 1], got {value!r}")
    return number
