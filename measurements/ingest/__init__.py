"""Profiling data in: one small parser per format, all returning :class:`ParsedFile`.

``parse_file`` reads the bytes once, hashes them, picks the parser (``--kind`` or ``detect``),
and resolves the hardware: ``--hardware`` when given, else what the file names, else an error.
``open_path`` takes any PATH ``ingest`` is given: a single file (parsed at once by ``parse_file``) or an
aiconfigurator database (its wheel, a folder in its layout or one parquet table), whose many tables are
checked at once and parsed one at a time as they are written; there ``--hardware`` selects the GPU folders
to read instead of naming the GPU. Nothing here touches the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from paraplan.errors import InputError
from paraplan.measurements.ingest.detect import FORMATS, detect_kind, path_kind
from paraplan.measurements.ingest.hardware_names import check_hardware
from paraplan.measurements.ingest.megatron_log import parse_megatron_log
from paraplan.measurements.ingest.nccl_tests import parse_nccl_json, parse_nccl_text
from paraplan.measurements.ingest.paraplan_format import parse_paraplan_csv, parse_paraplan_json
from paraplan.measurements.ingest.records import Parsed, ParsedFile, file_bytes, file_text, sha256_hex
from paraplan.measurements.ingest.routing_stats import parse_routing
from paraplan.measurements.ingest.torch_trace import parse_torch_trace
from paraplan.measurements.ingest.vidur import parse_vidur

if TYPE_CHECKING:
    from paraplan.measurements.ingest.aiconfigurator import TableRows

__all__ = ["FORMATS", "ParsedFile", "PathSource", "open_path", "parse_file", "parse_path"]


def _parsers() -> dict[str, Callable[[Path, str], Parsed]]:
    return {"paraplan-csv": parse_paraplan_csv, "paraplan-json": parse_paraplan_json, "vidur": parse_vidur,
            "nccl-tests": parse_nccl_text, "nccl-tests-json": parse_nccl_json, "torch-trace": parse_torch_trace,
            "megatron-log": parse_megatron_log, "routing": parse_routing}


def parse_file(path: Path, kind: str = "auto", hardware: str | None = None) -> ParsedFile:
    """Parse ``path`` as ``kind`` (or detect it); InputError on anything malformed, naming the line."""
    parsers = _parsers()
    if kind == "aiconfigurator" or (kind == "auto" and path_kind(Path(path)) == "aiconfigurator"):
        raise InputError(f"{path}: an aiconfigurator database holds many tables; read it with parse_path or "
                         "'paraplan ingest'")
    if kind != "auto" and kind not in parsers:
        raise InputError(f"unknown --kind {kind!r}; choose auto or one of {', '.join(FORMATS)}")
    data = file_bytes(path)
    text = file_text(path, data)
    chosen = detect_kind(path, text) if kind == "auto" else kind
    if chosen not in parsers:
        raise InputError(f"{path}: format {chosen} is not supported yet; supported: {', '.join(parsers)}")
    parsed = parsers[chosen](Path(path), text)
    if not parsed.measurements:
        raise InputError(f"{path}: no measurements found in this {chosen} file")
    resolved = hardware or parsed.hardware
    if resolved is None:
        raise InputError(f"{path}: the file does not say which GPU it was measured on; pass --hardware NAME")
    return ParsedFile(path=str(path), sha256=sha256_hex(data), kind=chosen,
                      hardware=check_hardware(resolved, path), software=parsed.software,
                      measurements=tuple(parsed.measurements))


@dataclass(frozen=True, slots=True, kw_only=True)
class PathSource:
    """One PATH given to ``ingest``, checked: what it holds, parsed as ``files()`` is iterated."""

    path: str
    """The PATH as given."""
    kind: str
    """Its format (``detect.FORMATS``)."""
    num_files: int
    """Files (or aiconfigurator tables) it holds."""
    notes: tuple[str, ...]
    """What was left out of it, one line each (aiconfigurator: folders paraplan does not read yet)."""
    files: Callable[[], Iterator[ParsedFile | TableRows]]
    """Its files parsed in turn (InputError on a malformed one): a single file was parsed when the PATH was opened;
    an aiconfigurator table is read when its turn comes, in column form (the database holds millions of rows: one
    table is in memory at a time, with no object per row; ``TableRows.parsed_file`` gives its Measurements)."""


def open_path(path: Path, kind: str = "auto", hardware: str | None = None,
              ops: tuple[str, ...] | None = None) -> PathSource:
    """Check ``path`` as ``kind`` (or detect it): a single file is parsed now (``parse_file``); an aiconfigurator
    database (``--kind aiconfigurator``, or a folder, wheel or parquet table) is checked now and its tables of
    ``hardware`` (all GPUs when None) and measurement kinds ``ops`` (all when None) parsed as ``files()`` runs."""
    path = Path(path)
    if kind == "aiconfigurator" or (kind == "auto" and path_kind(path) == "aiconfigurator"):
        from paraplan.measurements.ingest.aiconfigurator import open_database

        database = open_database(path, hardware, ops)
        return PathSource(path=str(path), kind="aiconfigurator", num_files=len(database.tables),
                          notes=database.notes, files=database.tables_read)
    if ops is not None:
        raise InputError(f"{path}: --op selects the tables of an aiconfigurator database; {path.name} is not one")
    parsed = parse_file(path, kind, hardware)
    return PathSource(path=str(path), kind=parsed.kind, num_files=1, notes=(), files=lambda: iter((parsed,)))


def parse_path(path: Path, kind: str = "auto", hardware: str | None = None,
               ops: tuple[str, ...] | None = None) -> list[ParsedFile]:
    """Every file of ``path`` parsed (``open_path``) into Measurements, all in memory at once: for a few files or
    tables; ``ingest`` writes ``open_path(...).files()`` one at a time instead."""
    return [item if isinstance(item, ParsedFile) else item.parsed_file()
            for item in open_path(path, kind, hardware, ops).files()]
