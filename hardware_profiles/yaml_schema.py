"""Strict reading of the catalog's YAML files: malformed text, unknown or missing keys are errors."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from typing import Any

from paraplan.errors import InputError
from paraplan.files import listed, one_line, parse_user_yaml, shown


def parse_yaml(text: str, origin: str) -> dict[str, Any]:
    """Parse YAML text whose top level must be a mapping, through the one guarded YAML parser
    (paraplan.files.parse_user_yaml: bounded depth and aliases, no key twice in one mapping)."""
    return parse_user_yaml(text, origin)


def check_keys(entry: Any, where: str, required: Iterable[str], optional: Iterable[str] = ()) -> dict[str, Any]:
    """Return ``entry`` if it is a mapping with every required key and no unknown key."""
    if not isinstance(entry, dict):
        raise InputError(f"{where}: expected a mapping, got {type(entry).__name__}")
    required, optional = set(required), set(optional)
    missing = sorted(required - entry.keys())
    if missing:
        raise InputError(f"{where}: missing key(s) {', '.join(missing)}")
    unknown = sorted(map(str, set(entry) - required - optional))
    if unknown:
        allowed = sorted(required | optional)
        more = f" and {len(unknown) - 1} more" if len(unknown) > 1 else ""
        close = difflib.get_close_matches(unknown[0], allowed, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}? " if close else ""
        raise InputError(f"{where}: unknown key(s) {one_line(unknown[0], 40)}{more} ({hint}allowed: "
                         f"{listed(allowed, 110)})")
    return entry


def positive_number(value: Any, where: str, maximum: float | None = None) -> float:
    """A finite number > 0 (booleans are not numbers here), at most ``maximum`` when one is given."""
    number = float("nan")
    if not isinstance(value, bool) and isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:  # an integer beyond float range
            pass
    if not math.isfinite(number) or not number > 0:
        raise InputError(f"{where}: expected a positive number, got {_shown(value)}")
    if maximum is not None and number > maximum:
        raise InputError(f"{where}: {_shown(value)} is implausibly large (at most {maximum:g}); check the unit "
                         "in the key name")
    return number


def positive_int(value: Any, where: str, maximum: int | None = None) -> int:
    """An integer > 0 (``8.0`` is refused: sizes are counts), at most ``maximum`` when one is given."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"{where}: expected a positive integer, got {_shown(value)}")
    if maximum is not None and value > maximum:
        raise InputError(f"{where}: {_shown(value)} is implausibly large (at most {maximum})")
    return value


def fraction(value: Any, where: str) -> float:
    """A number in (0, 1]."""
    number = positive_number(value, where)
    if number > 1:
        raise InputError(f"{where}: expected a fraction in (0, 1], got {_shown(value)}")
    return number


def text(value: Any, where: str) -> str:
    """A non-empty string (YAML turns bare ``yes``, ``1.0`` or ``2024-01-01`` into other types)."""
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: expected a non-empty text, got {_shown(value)}; quote it")
    return value


def _shown(value: Any) -> str:
    """``repr`` cut to one short line, so an error never echoes a huge value."""
    return shown(value)
