"""The one reader of text files a user hands over by path: bounded in size, UTF-8, read errors as InputError.

Each caller names what the file is (``"hardware file"``, ``"runs file"``) and its own size bound (a few
MiB at most: every such file is hand-written or small), so a wrong path or a binary file is one clear line.
"""

from __future__ import annotations

import json
from pathlib import Path

from paraplan.errors import InputError


def read_user_text(path: Path, max_bytes: int, what: str) -> str:
    """The text of ``path``; InputError when it cannot be read, exceeds ``max_bytes`` or is not UTF-8 (naming
    the line and byte of the first undecodable one)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise InputError(f"{path}: {size:,} bytes is too large for a {what} (at most {max_bytes:,}); is this "
                             "the right file?")
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise InputError(f"{path}: line {line} is not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x}); "
                         "save the file as UTF-8") from None


MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects accepted in a user's JSON: every file paraplan reads nests at most
about 6 levels (a plan document); 64 keeps Python's parser far from its recursion limit."""


def _refuse_constant(origin: str):
    def refuse(name: str) -> float:
        raise InputError(f"{origin}: holds {name}, which JSON does not allow; write a number")
    return refuse


def _depth(text: str) -> int:
    """Deepest nesting of [ and { outside strings (a linear scan, so a hostile file cannot recurse)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def parse_user_json(text: str, origin: str, *, top: type | None = dict) -> object:
    """Parse JSON text a user handed over: nesting at most MAX_JSON_DEPTH, no NaN/Infinity, integers of
    at most 4,300 digits (Python's own bound); ``top`` is the type the document must be (None: any)."""
    if _depth(text) > MAX_JSON_DEPTH:
        raise InputError(f"{origin}: JSON nested more than {MAX_JSON_DEPTH} levels deep; is this the right file?")
    try:
        data = json.loads(text, parse_constant=_refuse_constant(origin))
    except json.JSONDecodeError as exc:
        raise InputError(f"{origin}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:  # an integer too long to convert, or nesting the scan missed
        raise InputError(f"{origin}: malformed JSON: {str(exc)[:120]}") from None
    if top is not None and not isinstance(data, top):
        raise InputError(f"{origin}: expected a JSON {'object' if top is dict else top.__name__} at the top level, "
                         f"got {type(data).__name__}")
    return data


def read_user_json(path: Path, max_bytes: int, what: str, *, top: type | None = dict) -> object:
    """read_user_text then parse_user_json: the one way in for a JSON file a user names."""
    return parse_user_json(read_user_text(path, max_bytes, what), str(path), top=top)
