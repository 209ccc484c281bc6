"""``--kind auto``: tell a file's format from its name and its first bytes."""

from __future__ import annotations

import re
from pathlib import Path

from paraplan.errors import InputError

_MEGATRON_ITERATION = re.compile(r"iteration\s+\d+/\s*\d+ \|")
FORMATS = ("paraplan-csv", "paraplan-json", "vidur", "nccl-tests", "nccl-tests-json", "torch-trace",
           "megatron-log", "routing")


def detect_kind(path: Path, text: str) -> str:
    """The format of ``text`` (read from ``path``); InputError when nothing matches."""
    head = text[:4096]
    first = head.split("\n", 1)[0].strip()
    # A Megatron log trimmed with grep starts with its '[2024-06-01 12:00:00] iteration ...' timestamp: the
    # bracket is not JSON's.
    if first.startswith("[") and _MEGATRON_ITERATION.search(first):
        return "megatron-log"
    if first.startswith(("{", "[")):
        return _json_kind(text)
    if first.replace(" ", "") == "layer,expert,next_expert,tokens":
        return "routing"
    first_data = next((line.strip() for line in head.splitlines() if line.strip() and not line.startswith("#")), "")
    if first_data.replace(" ", "").startswith("kind,name,model,time_s"):
        return "paraplan-csv"
    if "time_stats." in first:
        return "vidur"
    if re.search(r"out-of-place|nThread \d+ nGpus|busbw|all_reduce_perf|NCCL version", head):
        return "nccl-tests"
    if _MEGATRON_ITERATION.search(text[:200000]):
        return "megatron-log"
    raise InputError(f"{path}: line 1: cannot tell the format; pass --kind with one of {', '.join(FORMATS)}")


def _json_kind(text: str) -> str:
    head = text[:65536]
    if '"traceEvents"' in text:
        return "torch-trace"
    if '"nccl_version"' in head or '"average_bus_bandwidth"' in head or '"out_of_place"' in head:
        return "nccl-tests-json"
    return "paraplan-json"
