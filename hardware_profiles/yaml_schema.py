"""Strict reading of the catalog's YAML files: malformed text, unknown or missing keys are errors."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import yaml

from paraplan.errors import InputError


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key written twice in one mapping (PyYAML silently keeps the last)."""


def _mapping_without_repeats(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # '<<: *anchor' merges may be overridden by explicit keys, as YAML intends
        key = loader.construct_object(key_node, deep=True)
        try:
            repeated = key in seen
        except TypeError:
            continue  # an unhashable key: construct_mapping below refuses it with its own message
        if repeated:
            raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_repeats)


def parse_yaml(text: str, origin: str) -> dict[str, Any]:
    """Parse YAML text whose top level must be a mapping; a key given twice in one mapping is an error."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"{origin}: malformed YAML{where}: {getattr(exc, 'problem', exc)}") from None
    except (ValueError, OverflowError) as exc:  # e.g. a timestamp such as 2024-13-45
        raise InputError(f"{origin}: malformed YAML: {exc}") from None
    except RecursionError:
        raise InputError(f"{origin}: malformed YAML: nested too deeply") from None
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
    unknown = sorted(map(str, set(entry) - required - optional))
    if unknown:
        allowed = ", ".join(sorted(required | optional))
        raise InputError(f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {allowed})")
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
        raise InputError(f"{where}: expected a fraction in (0, 1], got {value!r}")
    return number


def text(value: Any, where: str) -> str:
    """A non-empty string (YAML turns bare ``yes``, ``1.0`` or ``2024-01-01`` into other types)."""
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: expected a non-empty text, got {_shown(value)}; quote it")
    return value


def _shown(value: Any) -> str:
    """``repr`` cut to one short line, so an error never echoes a huge value."""
    shown = repr(value)
    return shown if len(shown) <= 60 else f"{shown[:57]}..."
