"""Profiling data in: one small parser per format, all returning :class:`ParsedFile`.

``parse_file`` reads the bytes once, hashes them, picks the parser (``--kind`` or ``detect``),
and resolves the hardware: ``--hardware`` when given, else what the file names, else an error.
Nothing here touches the store.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from paraplan.errors import InputError
from paraplan.measurements.ingest.detect import FORMATS, detect_kind
from paraplan.measurements.ingest.hardware_names import check_hardware
from paraplan.measurements.ingest.megatron_log import parse_megatron_log
from paraplan.measurements.ingest.nccl_tests import parse_nccl_json, parse_nccl_text
from paraplan.measurements.ingest.paraplan_format import parse_paraplan_csv, parse_paraplan_json
from paraplan.measurements.ingest.records import Parsed, ParsedFile, file_bytes, file_text, sha256_hex
from paraplan.measurements.ingest.routing_stats import parse_routing
from paraplan.measurements.ingest.torch_trace import parse_torch_trace
from paraplan.measurements.ingest.vidur import parse_vidur

__all__ = ["FORMATS", "ParsedFile", "parse_file"]


def _parsers() -> dict[str, Callable[[Path, str], Parsed]]:
    return {"paraplan-csv": parse_paraplan_csv, "paraplan-json": parse_paraplan_json, "vidur": parse_vidur,
            "nccl-tests": parse_nccl_text, "nccl-tests-json": parse_nccl_json, "torch-trace": parse_torch_trace,
            "megatron-log": parse_megatron_log, "routing": parse_routing}


def parse_file(path: Path, kind: str = "auto", hardware: str | None = None) -> ParsedFile:
    """Parse ``path`` as ``kind`` (or detect it); InputError on anything malformed, naming the line."""
    parsers = _parsers()
    if kind != "auto" and kind not in parsers:
        raise InputError(f"unknown --kind {kind!r}; choose auto or one of {', '.join(parsers)}")
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
