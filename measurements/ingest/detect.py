"""``--kind auto``: tell a file's format from its name and its first bytes."""

from __future__ import annotations

import re
from pathlib import Path

from paraplan.errors import InputError

FORMATS = ("paraplan-csv", "paraplan-json", "vidur", "nccl-tests", "nccl-tests-json", "torch-trace",
           "megatron-log", "routing", "aiconfigurator")
DATABASE_SUFFIXES = (".whl", ".zip", ".parquet")
"""Files that hold aiconfigurator's per-op database (its wheel, or one parquet table), told by name: their bytes are
binary, and the reader checks their layout."""


def path_kind(path: Path) -> str | None:
    """The format a PATH names before any of it is read: ``aiconfigurator`` for a folder (its ``systems/data`` layout),
    a wheel or a parquet table; None for a single file whose text ``detect_kind`` reads."""
    path = Path(path)
    if path.is_dir() or path.suffix.lower() in DATABASE_SUFFIXES:
        return "aiconfigurator"
    return None


# How a JSON document opens: an object, or an array whose first element is a JSON value. A log line that
# starts with a bracketed prefix ('[2024-04-06 02:59:36] iteration ...', '[host:0]: ...', '[Rank 0] ...')
# is not one: 'grep iteration train.log' keeps only such lines and was read as JSON.
_JSON_OPENING = re.compile(r'\{|\[\s*($|[{\["\]]|-?\d+(\.\d+)?([eE][+-]?\d+)?\s*[,\]]|(true|false|null)\s*[,\]])')
# mpirun --tag-output prefixes '[1,0]<stdout>:', which opens like a JSON array: a Megatron line still wins.
_MEGATRON_ITERATION = re.compile(r"iteration\s+\d+/\s*\d+ \|")
_MEGATRON_LINE = re.compile(_MEGATRON_ITERATION.pattern + r"|memory \(MB\)\s*\|")


def detect_kind(path: Path, text: str) -> str:
    """The format of ``text`` (read from ``path``); InputError when nothing matches."""
    head = text[:4096]
    first = head.split("\n", 1)[0].strip()
    if _JSON_OPENING.match(first) and not _MEGATRON_LINE.search(first):
        return _json_kind(text)
    if first.replace(" ", "") == "layer,expert,next_expert,tokens":
        return "routing"
    first_data = next((line.strip() for line in head.splitlines() if line.strip() and not line.startswith("#")), "")
    if first_data.replace(" ", "").startswith("kind,name,model,time_s"):
        return "paraplan-csv"
    if "time_stats." in first:
        return "vidur"
    # Megatron before nccl-tests: a Megatron log run with NCCL_DEBUG=INFO prints 'NCCL version' near its top,
    # and nccl-tests never print an iteration line.
    if _MEGATRON_ITERATION.search(text[:200000]):
        return "megatron-log"
    if re.search(r"out-of-place|nThread \d+ nGpus|busbw|all_reduce_perf|NCCL version", head):
        return "nccl-tests"
    raise InputError(f"{path}: line 1: cannot tell the format; pass --kind with one of {', '.join(FORMATS)}")


def _json_kind(text: str) -> str:
    head = text[:65536]
    if '"traceEvents"' in text:
        return "torch-trace"
    if '"nccl_version"' in head or '"average_bus_bandwidth"' in head or '"out_of_place"' in head:
        return "nccl-tests-json"
    return "paraplan-json"
