"""Request-arrival traces a user hands over (``--arrival trace:PATH``): the arrival rate and burstiness they show,
and the prompt and output lengths when the trace records them.

Formats, told apart by the first line that is not blank:

- CSV with a header naming an arrival-time column: ``timestamp``, ``arrival_time``, ``time`` (seconds) or
  ``timestamp_ms``, ``arrival_time_ms``, ``time_ms`` (milliseconds); names match whatever their case, spaces or
  CamelCase (BurstGPT's ``Timestamp``, Azure's ``TIMESTAMP`` of date-times, which are read as such).
- JSONL, one object per request with the same keys (Mooncake/AIPerf traces, whose ``timestamp`` is in milliseconds
  by their specification, are recognised by their ``hash_ids`` key), or one JSON document: a list of such objects,
  or vLLM's ``bench serve --save-result --save-detailed`` result, whose ``start_times`` are seconds.
- Plain text: one arrival time in seconds per line.

Lines starting with ``#`` are comments in CSV and plain text.

Lengths are read from ``input_len``/``prompt_len``/``isl``/... and ``output_len``/``osl``/... (INPUT_KEYS,
OUTPUT_KEYS). Times are sorted; rate = (n - 1)/(last - first), cv² = variance / mean² of the gaps (population
moments). Every failure is one InputError line naming the file and the line. Reading a million requests took
8.5 s as CSV (15 MB) and 10-17 s as Mooncake JSONL (100 MB) on a shared 2-core machine.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from paraplan.errors import InputError
from paraplan.files import listed, parse_user_csv, parse_user_json, read_user_text, shown
from paraplan.limits import MAX_SEQ_LEN
from paraplan.planner.serving.arrivals import Arrivals

MAX_TRACE_BYTES = 1 << 28
"""256 MiB: two million requests of Mooncake-style JSONL with their block hashes (about 100 bytes a line)."""
MAX_TRACE_REQUESTS = 2_097_152
"""Requests in one trace (2^21): 2.4 days of a service at 10 requests/s; a rate and a cv² need far fewer."""
MAX_TIME_S = 1e11
"""Largest arrival time, seconds (3,169 years): Unix seconds are 1.8e9 today; milliseconds or nanoseconds given
under a seconds name are larger, and are refused with a pointer to the _ms names."""
TIME_KEYS = {"timestamp": 1.0, "arrival_time": 1.0, "time": 1.0, "timestamp_s": 1.0, "arrival_time_s": 1.0,
             "time_s": 1.0, "timestamp_ms": 1e-3, "arrival_time_ms": 1e-3, "time_ms": 1e-3}
"""Arrival-time keys, first found wins, with their unit in seconds."""
INPUT_KEYS = ("input_len", "input_length", "prompt_len", "prompt_length", "isl", "input_tokens", "prompt_tokens",
              "request_tokens", "context_tokens", "input_lens")
"""Prompt-length keys (BurstGPT: Request tokens, Azure: ContextTokens, vLLM's result: input_lens)."""
OUTPUT_KEYS = ("output_len", "output_length", "osl", "output_tokens", "completion_tokens", "response_tokens",
               "generated_tokens", "output_lens")
"""Output-length keys (BurstGPT: Response tokens, Azure: GeneratedTokens, vLLM's result: output_lens)."""
WHAT = "request trace"


@dataclass(frozen=True, slots=True, kw_only=True)
class LengthStats:
    """The distribution of a per-request length over a trace."""

    mean_tokens: float
    """Mean tokens per request."""
    cv: float
    """Coefficient of variation (standard deviation / mean; 0 when the mean is 0)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    """What a request trace says about the load."""

    arrivals: Arrivals
    """Its own rate and the cv² of its inter-arrival gaps."""
    num_requests: int
    """Requests in the trace."""
    span_s: float
    """Seconds from the first arrival to the last."""
    input_tokens: LengthStats | None
    """Prompt lengths, when the trace records them."""
    output_tokens: LengthStats | None
    """Output lengths, when the trace records them."""


def read_trace(path: Path) -> Trace:
    """Read a request trace (CSV, JSONL/JSON or one number per line); InputError, one line, on anything wrong."""
    path = Path(path)
    text = read_user_text(path, MAX_TRACE_BYTES, WHAT).lstrip("\ufeff")
    origin = str(path)
    first = next((line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")),
                 "")
    if not first:
        raise InputError(f"{origin}: the {WHAT} is empty; give one arrival time per request")
    if first[0] in "{[":
        columns = _json_columns(text, first, origin)
    elif _is_number(first):
        columns = _plain_columns(text, origin)
    else:
        columns = _csv_columns(text, origin)
    return _trace(columns, origin)


# -- formats to columns: name -> (cells, line of each cell), plus the time unit --------------------------------
Columns = tuple[dict[str, list[Any]], list[int], float]
"""Each column's cells (JSON values or CSV text) by name, the line of each row, and the time unit in seconds."""


def _key(name: object) -> str:
    """A column or key name compared: CamelCase split, lower case, spaces and dashes as underscores."""
    text = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", str(name).strip())
    return re.sub(r"[\s\-]+", "_", text).lower()


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _plain_columns(text: str, origin: str) -> Columns:
    """One arrival time per line."""
    cells: list[Any] = []
    lines: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            _count_bound(len(cells), origin)
            cells.append(line.strip())
            lines.append(number)
    return {"time": cells}, lines, 1.0


def _csv_columns(text: str, origin: str) -> Columns:
    """CSV with a header row naming the columns."""
    rows = parse_user_csv(text, origin, max_rows=MAX_TRACE_REQUESTS + 1)
    numbered = [(number, row) for number, row in enumerate(rows, start=1) if any(cell.strip() for cell in row)
                and not row[0].lstrip().startswith("#")]
    if not numbered:
        raise InputError(f"{origin}: no header row; the first line names the columns (timestamp, input_len, ...)")
    header_line, names = numbered[0]
    header = [_key(cell) for cell in names]
    if not any(key in TIME_KEYS for key in header):
        raise InputError(f"{origin}: line {header_line}: no arrival-time column; name one timestamp, arrival_time or "
                         "time (seconds) or timestamp_ms (milliseconds); the header has "
                         f"{shown(listed(names, 60), 80)}")
    body = numbered[1:]
    for number, row in body:
        if len(row) != len(header):
            raise InputError(f"{origin}: line {number}: {len(row)} fields where the header has {len(header)}")
    columns = {key: [row[i] for _, row in body] for i, key in enumerate(header) if key not in header[:i]}
    return columns, [number for number, _ in body], 1.0


def _json_columns(text: str, first: str, origin: str) -> Columns:
    """JSONL (a first line that is a whole object) or one JSON document (a list of objects, a vLLM result)."""
    if first.startswith("{") and first.endswith("}") and "\n" in text.strip():
        return _record_columns(*_jsonl_records(text, origin), origin)
    document = parse_user_json(text, origin, top=None)
    if isinstance(document, dict) and isinstance(document.get("start_times"), list):
        return _result_columns(document, origin)
    records = document if isinstance(document, list) else [document]
    objects = [record for record in records if isinstance(record, dict)]
    if not records or len(objects) != len(records):
        raise InputError(f"{origin}: expected JSON objects, one per request, or a vLLM result with start_times")
    _count_bound(len(objects) - 1, origin)
    return _record_columns(objects, [1] * len(objects), origin)


def _jsonl_records(text: str, origin: str) -> tuple[list[dict[str, Any]], list[int]]:
    """The objects of JSONL text and their lines: parsed as one JSON array (20x faster than line by line); where
    that fails or a line is not one object, the first bad line is parsed alone for its message."""
    numbered = [(number, line) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
    _count_bound(len(numbered) - 1, origin)
    lines = [number for number, _ in numbered]
    try:
        joined = parse_user_json("[" + ",\n".join(line for _, line in numbered) + "]", origin, top=list)
    except InputError:
        joined = None
    if isinstance(joined, list) and len(joined) == len(numbered) and all(isinstance(r, dict) for r in joined):
        return joined, lines
    # Line by line: the first bad line names itself. (The joined array nests one level deeper, so a file of
    # lines each at the depth limit parses only this way.)
    parsed = [parse_user_json(line, f"{origin}: line {number}") for number, line in numbered]
    records: list[dict[str, Any]] = []
    for number, record in zip(lines, parsed):
        if not isinstance(record, dict):
            raise InputError(f"{origin}: line {number}: expected one JSON object per line")
        records.append(record)
    return records, lines


def _record_columns(records: list[dict[str, Any]], lines: list[int], origin: str) -> Columns:
    """Columns of JSON objects, one per request, keyed as the first one is."""
    keys = {_key(key): key for key in records[0]}
    names = [key for key in (*TIME_KEYS, *INPUT_KEYS, *OUTPUT_KEYS) if key in keys]
    if not any(key in TIME_KEYS for key in names):
        raise InputError(f"{origin}: line {lines[0]}: no arrival-time key; give timestamp, arrival_time or time "
                         "(seconds) or timestamp_ms (milliseconds); the object has "
                         f"{shown(listed(list(keys), 60), 80)}")
    columns: dict[str, list[Any]] = {}
    for name in names:
        try:
            columns[name] = [record[keys[name]] for record in records]
        except KeyError:
            line = next(number for record, number in zip(records, lines) if keys[name] not in record)
            raise InputError(f"{origin}: line {line}: no {shown(keys[name], 40)}, which the first request has") \
                from None
    mooncake = "hash_ids" in keys and "timestamp" in names  # Mooncake's timestamps are milliseconds
    return columns, lines, 1e-3 if mooncake else 1.0


def _result_columns(document: dict[str, Any], origin: str) -> Columns:
    """The result of vLLM's bench serve: start_times, and input_lens and output_lens when saved with the details."""
    starts: list[Any] = document["start_times"]
    columns = {"start_times": starts}
    for key in ("input_lens", "output_lens"):
        lengths = document.get(key)
        if isinstance(lengths, list):
            if len(lengths) != len(starts):
                raise InputError(f"{origin}: {key} has {len(lengths):,} entries, start_times "
                                 f"{len(starts):,}; is the result file complete?")
            columns[key] = lengths
    _count_bound(len(starts) - 1, origin)
    return columns, [1] * len(starts), 1.0


def _count_bound(count: int, origin: str) -> None:
    """InputError once a trace holds more than MAX_TRACE_REQUESTS requests (``count``: those read so far, less one)."""
    if count >= MAX_TRACE_REQUESTS:
        raise InputError(f"{origin}: more than {MAX_TRACE_REQUESTS:,} requests; give a shorter window of the trace")


# -- columns to a trace -----------------------------------------------------------------------------------------
def _numbers(cells: list[Any], lines: list[int], origin: str, name: str) -> np.ndarray:
    """The cells as floats (numbers, or strings of numbers); InputError naming the first that is not one."""
    for cell, line in zip(cells, lines):
        if isinstance(cell, bool) or not isinstance(cell, (int, float, str)):
            raise InputError(f"{origin}: line {line}: {name} must be a number, got {shown(cell, 40)}")
    try:
        values = np.array(cells, dtype=float)
    except (ValueError, OverflowError):
        values = np.array([_number_or_nan(cell) for cell in cells], dtype=float)
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
    if bad.size:
        cell, line = cells[bad[0]], lines[bad[0]]
        raise InputError(f"{origin}: line {line}: {name} must be a finite number >= 0, got {shown(cell, 40)}")
    return values


def _number_or_nan(cell: object) -> float:
    try:
        return float(cell)  # type: ignore[arg-type]
    except (ValueError, OverflowError):
        return math.nan


def _times_s(cells: list[Any], lines: list[int], origin: str, name: str, unit_s: float) -> np.ndarray:
    """Arrival times in seconds: numbers in ``unit_s``, or date-times (Azure's traces) as seconds after the first."""
    if cells and isinstance(cells[0], str) and not _is_number(cells[0]):
        try:
            with warnings.catch_warnings():  # numpy warns that it drops a time zone written as Z or +00:00
                warnings.simplefilter("ignore")
                stamps = np.array(cells, dtype="datetime64[ns]")
        except (ValueError, OverflowError, TypeError):
            stamps = None
        if stamps is not None and not np.isnat(stamps).any():
            return (stamps - stamps.min()).astype(np.int64) / 1e9
    times = _numbers(cells, lines, origin, name) * unit_s
    if times.size and times.max() > MAX_TIME_S:
        raise InputError(f"{origin}: {name} reaches {times.max():.3g} s, later than {MAX_TIME_S:.0e} s; are these "
                         "milliseconds? name the column timestamp_ms")
    return times


def _lengths(columns: dict[str, list[Any]], keys: tuple[str, ...], lines: list[int], origin: str) -> LengthStats | None:
    name = next((key for key in keys if key in columns), None)
    if name is None:
        return None
    values = _numbers(columns[name], lines, origin, name)
    if values.max() > MAX_SEQ_LEN:
        raise InputError(f"{origin}: {name} reaches {values.max():.3g} tokens, more than {MAX_SEQ_LEN:,}")
    mean = float(values.mean())
    return LengthStats(mean_tokens=mean, cv=float(values.std()) / mean if mean > 0 else 0.0)


def _trace(found: Columns, origin: str) -> Trace:
    columns, lines, unit_s = found
    name = next(key for key in (*TIME_KEYS, "start_times") if key in columns)
    times = np.sort(_times_s(columns[name], lines, origin, name, unit_s * TIME_KEYS.get(name, 1.0)))
    if times.size < 2:
        raise InputError(f"{origin}: {times.size} arrival(s); a rate needs at least 2 requests")
    span = float(times[-1] - times[0])
    gaps = np.diff(times)
    cv2 = float(gaps.var() / gaps.mean() ** 2) if span > 0 else math.nan
    if not (span > 0 and math.isfinite(cv2) and math.isfinite((times.size - 1) / span)):
        raise InputError(f"{origin}: all {times.size:,} arrivals at the same time ({times[0]:.6g} s); a rate needs "
                         "arrivals spread over time")
    arrivals = Arrivals(rate_per_s=(times.size - 1) / span, cv2=cv2, source=f"trace {origin} ({times.size:,} requests)")
    return Trace(arrivals=arrivals, num_requests=int(times.size), span_s=span,
                 input_tokens=_lengths(columns, INPUT_KEYS, lines, origin),
                 output_tokens=_lengths(columns, OUTPUT_KEYS, lines, origin))
