"""Shared CSV reading for the parsers: header check, rows as dicts, the line number of each."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

from paraplan.errors import InputError
from paraplan.files import listed
from paraplan.measurements.ingest.records import bad_line


def header_and_rows(path: Path, text: str, required: tuple[str, ...]) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """The header and the non-empty rows with their 1-based line numbers; InputError when a required
    column is missing or a row has a different number of fields than the header."""
    lines = text.splitlines()
    try:
        rows = list(csv.reader(lines))
    except csv.Error as exc:
        raise InputError(f"{path}: not a CSV file ({exc})") from None
    if not rows:
        raise InputError(f"{path}: line 1: empty file, expected a CSV header with {listed(required, 100)}")
    header = [cell.strip() for cell in rows[0]]
    missing = [name for name in required if name not in header]
    if missing:
        raise bad_line(path, 1, f"the header lacks column(s) {listed(missing, 100)}")
    body = []
    for line_no, row in enumerate(rows[1:], start=2):
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise bad_line(path, line_no, f"has {len(row)} fields, the header has {len(header)}")
        body.append((line_no, row))
    return header, body


def as_dicts(header: list[str], rows: list[tuple[int, list[str]]]) -> Iterator[tuple[int, dict[str, str]]]:
    """Each row as ``{column: cell}`` with its line number."""
    for line_no, row in rows:
        yield line_no, dict(zip(header, (cell.strip() for cell in row)))
