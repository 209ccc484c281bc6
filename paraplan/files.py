"""The one guarded way in for every file a user hands over by path: bounded in size, UTF-8, and parsed by
bounded parsers (JSON, YAML, CSV) whose every failure is one InputError line naming the file.

Each caller names what the file is (``"hardware file"``, ``"runs file"``) and its own size bound (a few
MiB at most for hand-written files, more for profiler output), so a wrong path, a binary file or a hostile
one (nesting a million levels deep, a billion-laughs YAML, a 10,000-digit number) is one clear line, never
a traceback or minutes of work. Messages echo a user's value only through :func:`shown`, cut to one short line.
"""

from __future__ import annotations

import csv
import json
import math
import re
import reprlib
from collections.abc import Callable
from functools import cache
from io import StringIO
from pathlib import Path
from typing import Any

from paraplan.errors import MAX_MESSAGE_CHARS, InputError


class _ShortRepr(reprlib.Repr):
    """reprlib's bounded repr (a few items of each container, two levels deep), and integers beyond 64 bits
    by their size: Python refuses to print one of more than 4,300 digits, and a long one says nothing."""

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 64:
            return f"<an integer of about {int(x.bit_length() * math.log10(2)):,} digits>"
        return super().repr_int(x, level)


_SHORT_REPR = _ShortRepr()  # Python 3.10/3.11's Repr takes no arguments: its limits are attributes
(_SHORT_REPR.maxlevel, _SHORT_REPR.maxstring, _SHORT_REPR.maxlong, _SHORT_REPR.maxother) = (2, 80, 40, 80)
for _kind in ("maxtuple", "maxlist", "maxarray", "maxdict", "maxset", "maxfrozenset", "maxdeque"):
    setattr(_SHORT_REPR, _kind, 4)


def shown(value: Any, limit: int = 60) -> str:
    """A user's value for a one-line message, cut to ``limit`` characters: a container of more than four items
    by its size, anything else by a bounded repr (never walks or prints a huge value whole)."""
    if isinstance(value, (dict, list, tuple, set)) and len(value) > 4:
        return f"a {type(value).__name__} of {len(value):,} items"
    text = repr(value[: limit + 1]) if isinstance(value, str) else _SHORT_REPR.repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def listed(names: list[str] | tuple[str, ...], budget: int = 90) -> str:
    """``names`` joined by commas, as many as fit ``budget`` characters, then how many there are in all."""
    shown_names: list[str] = []
    for name in names:
        if len(", ".join([*shown_names, name])) > budget:
            return f"{', '.join(shown_names)}, ... ({len(names)} in all)"
        shown_names.append(name)
    return ", ".join(shown_names)


def one_line(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``message`` with its whitespace runs made single spaces and cut to ``limit`` characters."""
    text = " ".join(str(message).split())
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def read_user_bytes(path: Path, max_bytes: int, what: str) -> bytes:
    """The bytes of ``path``; InputError when it cannot be read or exceeds ``max_bytes``."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise InputError(f"{_short(path)}: {size:,} bytes is too large for a {what} (at most {max_bytes:,}); "
                             "is this the right file?")
        with path.open("rb") as handle:  # read at most one byte more than allowed: the file may grow meanwhile
            raw = handle.read(max_bytes + 1)
    except OSError as exc:
        raise InputError(f"cannot read {what} {_short(path)}: {exc.strerror or type(exc).__name__}") from None
    if len(raw) > max_bytes:
        raise InputError(f"{_short(path)}: more than {max_bytes:,} bytes is too large for a {what}")
    return raw


def decode_user_text(raw: bytes, origin: str) -> str:
    """``raw`` as UTF-8 text; InputError naming the line and byte of the first undecodable one."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise InputError(f"{_short(origin)}: line {line} is not UTF-8 text (byte {exc.start} is "
                         f"{raw[exc.start]:#04x}); save the file as UTF-8") from None


def read_user_text(path: Path, max_bytes: int, what: str) -> str:
    """The text of ``path``; InputError when it cannot be read, exceeds ``max_bytes`` or is not UTF-8 (naming
    the line and byte of the first undecodable one)."""
    return decode_user_text(read_user_bytes(path, max_bytes, what), str(path))


def _short(origin: object) -> str:
    """A file name as messages show it: at most 120 characters (the tail, which names the file)."""
    text = " ".join(str(origin).split())
    return text if len(text) <= 120 else f"...{text[-117:]}"


MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects accepted in a user's JSON: every file paraplan reads nests at most
about 6 levels (a plan document, a torch trace's Input Dims); 64 keeps every recursive reader far from
Python's recursion limit."""
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _refuse_constant(origin: str, allow_infinity: bool = False) -> Callable[[str], float]:
    def refuse(name: str) -> float:
        if allow_infinity and name in ("Infinity", "-Infinity"):
            return float(name.replace("Infinity", "inf"))
        raise InputError(f"{_short(origin)}: holds {name}, which JSON does not allow; write a number")
    return refuse


def _too_deep(text: str, depth: int) -> bool:
    """Whether well-formed JSON ``text`` nests deeper than ``depth``: with strings and everything but brackets
    removed, each round of deleting the innermost ``[]``/``{}`` pairs peels one level (all in C, so a
    100 MB trace costs about as much as parsing it, and no hostile file recurses)."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    for _ in range(depth):
        peeled = brackets.replace("[]", "").replace("{}", "")
        if not peeled:
            return False
        brackets = peeled
    return bool(brackets)


def parse_user_json(text: str, origin: str, *, top: type | None = dict, allow_infinity: bool = False) -> object:
    """Parse JSON text a user handed over: nesting at most MAX_JSON_DEPTH, no NaN/Infinity, integers of
    at most 4,300 digits (Python's own bound: a huge integer is left to the reader, which names its key);
    ``top`` is the type the document must be (None: any). ``allow_infinity`` lets ``Infinity`` and
    ``-Infinity`` through as floats (NaN stays refused): transformers writes float("inf") so in a model's
    config.json, whose reader checks every number it uses."""
    try:
        data = json.loads(text, parse_constant=_refuse_constant(origin, allow_infinity))
    except json.JSONDecodeError as exc:
        raise InputError(f"{_short(origin)}: malformed JSON at line {exc.lineno} column {exc.colno}: "
                         f"{exc.msg}") from None
    except RecursionError:
        raise InputError(f"{_short(origin)}: JSON nested more than {MAX_JSON_DEPTH} levels deep; is this the "
                         "right file?") from None
    except InputError:
        raise
    except ValueError as exc:  # an integer of more than 4,300 digits
        raise InputError(one_line(f"{_short(origin)}: malformed JSON: {exc}")) from None
    if isinstance(data, (dict, list)) and _too_deep(text, MAX_JSON_DEPTH):
        raise InputError(f"{_short(origin)}: JSON nested more than {MAX_JSON_DEPTH} levels deep; is this the "
                         "right file?")
    if top is not None and not isinstance(data, top):
        raise InputError(f"{_short(origin)}: expected a JSON {'object' if top is dict else top.__name__} at the "
                         f"top level, got {type(data).__name__}")
    return data


def read_user_json(path: Path, max_bytes: int, what: str, *, top: type | None = dict,
                   allow_infinity: bool = False) -> object:
    """read_user_text then parse_user_json: the one way in for a JSON file a user names."""
    return parse_user_json(read_user_text(path, max_bytes, what), str(path), top=top, allow_infinity=allow_infinity)


# -- YAML -------------------------------------------------------------------------------------------------------
MAX_YAML_DEPTH = 32
"""Deepest nesting of mappings and sequences in a user's YAML: hardware and topology files nest at most 4
levels (gpus -> name -> sources -> key)."""
MAX_YAML_NODES = 100_000
"""Values a YAML file may hold once its aliases are expanded: the largest real file (a topology listing a
thousand hosts) holds about 10,000; a billion-laughs file of 1 KB expands to 10^9 and is refused before
anything walks it."""
MAX_YAML_BYTES = 256 * 1024
"""A hand-written hardware, cluster or topology file: the whole built-in catalog (gpus.yaml) is 28 KB; the
YAML parser reads about 0.5 MB/s in the worst case, so this keeps the worst file under a second."""


def _yaml_events_check(text: str, origin: str, yaml: Any, loader: type) -> None:
    """One pass over the parser's events (no recursion): depth, and the size with aliases expanded; an alias
    to a node still open (a recursive structure) is refused."""
    depth, expanded = 0, 0
    sizes: dict[str, int] = {}
    open_anchors: list[tuple[str | None, int]] = []
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.AliasEvent):
            if event.anchor not in sizes:
                raise InputError(f"{_short(origin)}: alias *{event.anchor[:40]} refers to a node that contains it "
                                 "or is not defined before it; write the values out")
            expanded += sizes[event.anchor]
        elif isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise InputError(f"{_short(origin)}: YAML nested more than {MAX_YAML_DEPTH} levels deep; is this "
                                 "the right file?")
            open_anchors.append((event.anchor, expanded))
            expanded += 1
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
            anchor, start = open_anchors.pop()
            if anchor is not None:
                sizes[anchor] = expanded - start
        elif isinstance(event, yaml.ScalarEvent):
            expanded += 1
            if event.anchor is not None:
                sizes[event.anchor] = 1
        if expanded > MAX_YAML_NODES:
            raise InputError(f"{_short(origin)}: YAML holds more than {MAX_YAML_NODES:,} values once its aliases "
                             "are expanded; write the entries out or split the file")


@cache
def _strict_loader() -> type:
    """A SafeLoader (libyaml's when installed: about 3x faster) that refuses a key written twice in one mapping
    (PyYAML silently keeps the last)."""
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class StrictLoader(base):  # type: ignore[misc, valid-type]
        pass

    def mapping_without_repeats(loader: Any, node: Any) -> dict[Any, Any]:
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
                raise yaml.constructor.ConstructorError(None, None, f"key {shown(key, 40)} is given twice",
                                                        key_node.start_mark)
            seen.add(key)
        return loader.construct_mapping(node, deep=True)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping_without_repeats)
    return StrictLoader


def parse_user_yaml(text: str, origin: str, *, top: type | None = dict) -> Any:
    """Parse YAML text: safe types only, nesting at most MAX_YAML_DEPTH, at most MAX_YAML_NODES values with
    aliases expanded, no recursive alias, no key twice in one mapping;
    ``top`` is the type the document must be (None: any). Every failure is one InputError line."""
    import yaml

    loader = _strict_loader()
    try:
        _yaml_events_check(text, origin, yaml, loader)
        data = yaml.load(text, Loader=loader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputError(one_line(f"{_short(origin)}: malformed YAML{where}: {getattr(exc, 'problem', None) or exc}"))\
            from None
    except (ValueError, OverflowError, TypeError) as exc:  # a timestamp such as 2024-13-45, an unhashable key
        if isinstance(exc, InputError):
            raise
        raise InputError(one_line(f"{_short(origin)}: malformed YAML: {exc}")) from None
    except RecursionError:
        raise InputError(f"{_short(origin)}: malformed YAML: nested too deeply") from None
    if top is not None and not isinstance(data, top):
        kind = "mapping" if top is dict else top.__name__
        raise InputError(f"{_short(origin)}: expected a {kind} at the top level, got {type(data).__name__}")
    return data


def read_user_yaml(path: Path, what: str, max_bytes: int = MAX_YAML_BYTES, *, top: type | None = dict) -> Any:
    """read_user_text then parse_user_yaml: the one way in for a YAML file a user names."""
    return parse_user_yaml(read_user_text(path, max_bytes, what), str(path), top=top)


# -- CSV --------------------------------------------------------------------------------------------------------
MAX_CSV_FIELD_CHARS = 4096
"""Longest CSV cell: names, numbers and short notes; a longer one is the wrong file or a lost quote
(a quote left open swallows the rest of the file into one cell)."""


def parse_user_csv(text: str, origin: str, *, max_rows: int, max_columns: int = 256) -> list[list[str]]:
    """The rows of CSV text (header included), each a list of cells; InputError naming the line for a
    malformed row, a cell over MAX_CSV_FIELD_CHARS, more than ``max_columns`` cells or ``max_rows`` rows."""
    reader = csv.reader(StringIO(text, newline=""))
    rows: list[list[str]] = []
    try:
        for row in reader:
            if len(rows) >= max_rows:
                raise InputError(f"{_short(origin)}: more than {max_rows:,} rows; is this the right file?")
            if len(row) > max_columns:
                raise InputError(f"{_short(origin)}: line {reader.line_num}: {len(row):,} fields (at most "
                                 f"{max_columns})")
            long = next((cell for cell in row if len(cell) > MAX_CSV_FIELD_CHARS), None)
            if long is not None:
                raise InputError(f"{_short(origin)}: line {reader.line_num}: a cell of {len(long):,} characters "
                                 f"(at most {MAX_CSV_FIELD_CHARS:,}); is a quote left open?")
            rows.append(row)
    except csv.Error as exc:
        raise InputError(one_line(f"{_short(origin)}: line {reader.line_num}: malformed CSV ({exc})")) from None
    return rows


def read_user_csv(path: Path, max_bytes: int, what: str, *, max_rows: int, max_columns: int = 256) -> list[list[str]]:
    """read_user_text then parse_user_csv: the one way in for a CSV file a user names."""
    return parse_user_csv(read_user_text(path, max_bytes, what), str(path), max_rows=max_rows, max_columns=max_columns)
