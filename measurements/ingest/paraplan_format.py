"""paraplan's own profile format, as CSV or JSON; ``paraplan profile`` writes the JSON form.

JSON: ``{"format": "paraplan-profile", "version": 1, "hardware": "h100-sxm", "software": "...",
"measurements": [{"kind": "gemm", "name": "matmul", "model": "", "time_s": 1.2e-4,
"params": {"m": 4096, "n": 4096, "k": 4096, "dtype": "bf16"}}, ...]}``.
CSV: optional ``# hardware=NAME`` and ``# software=TEXT`` lines, then a header starting
``kind,name,model,time_s`` whose further columns are params (numbers where they parse).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paraplan.errors import InputError
from paraplan.files import parse_user_json, shown
from paraplan.measurements.ingest.csv_rows import as_dicts, header_and_rows
from paraplan.measurements.ingest.records import KINDS, Measurement, Parsed, bad_line

FORMAT_NAME = "paraplan-profile"
FORMAT_VERSION = 1
CSV_COLUMNS = ("kind", "name", "model", "time_s")


def _measurement(path: Path, line: int, kind: object, name: object, model: object, time_s: Any,
                 params: object) -> Measurement:
    if not isinstance(params, dict) or not all(isinstance(v, (int, float, str)) for v in params.values()):
        raise bad_line(path, line, "params must be an object of numbers and strings")
    if kind not in KINDS:
        raise bad_line(path, line, f"kind must be one of {', '.join(KINDS)}, got {shown(kind, 40)}")
    try:
        return Measurement(kind=str(kind), name=str(name), model=str(model or ""), line=line,
                           time_s=float(time_s), params={str(k): v for k, v in params.items()})
    except (TypeError, ValueError, OverflowError):
        raise bad_line(path, line, f"time_s must be a finite number of seconds >= 0, got {shown(time_s, 40)}") from None


def parse_paraplan_json(path: Path, text: str) -> Parsed:
    """A paraplan JSON profile; ``line`` is the measurement's index."""
    document = parse_user_json(text, str(path), top=None)
    if not isinstance(document, dict) or document.get("format") != FORMAT_NAME:
        raise InputError(f"{path}: not a paraplan profile (expected \"format\": \"{FORMAT_NAME}\")")
    if document.get("version") != FORMAT_VERSION or not isinstance(document.get("measurements"), list):
        raise InputError(f"{path}: expected version {FORMAT_VERSION} with a 'measurements' list")
    out = []
    for index, item in enumerate(document["measurements"], start=1):
        if not isinstance(item, dict):
            raise bad_line(path, index, "each measurement must be an object")
        out.append(_measurement(path, index, item.get("kind"), item.get("name"), item.get("model"),
                                item.get("time_s"), item.get("params", {})))
    hardware = document.get("hardware")
    return Parsed(measurements=out, hardware=str(hardware) if hardware else None,
                  software=str(document.get("software", "not recorded")))


def _cell(value: str) -> float | str:
    try:
        return float(value)
    except ValueError:
        return value


def parse_paraplan_csv(path: Path, text: str) -> Parsed:
    """A paraplan CSV profile."""
    lines = text.splitlines()
    meta = dict(line[1:].strip().split("=", 1) for line in lines if line.startswith("#") and "=" in line)
    body = "\n".join(line if not line.startswith("#") else "" for line in lines)
    header, rows = header_and_rows(path, body.lstrip("\n"), CSV_COLUMNS)
    offset = next((i for i, line in enumerate(lines) if line and not line.startswith("#")), 0)
    out = []
    for line, row in as_dicts(header, rows):
        params = {k: _cell(v) for k, v in row.items() if k not in CSV_COLUMNS and v != ""}
        out.append(_measurement(path, line + offset, row["kind"], row["name"], row["model"], row["time_s"], params))
    return Parsed(measurements=out, hardware=meta.get("hardware") or None,
                  software=meta.get("software", "not recorded"))
