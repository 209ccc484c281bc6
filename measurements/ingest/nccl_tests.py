"""NVIDIA nccl-tests output (``all_reduce_perf`` and friends): the text table and the ``-J`` JSON.

Text (nccl-tests src/util.cu ``writeResultHeader``): a header line naming the columns
(``size count type redop root time algbw busbw #wrong time algbw busbw #wrong``, with or without
a leading ``#``), a units line, then one row per size; ``time`` is in microseconds, the first
``time`` column is out-of-place. ``#  Rank  N Group ... on HOST device D [...] NAME`` lines give
the group size, whether it spans hosts, and the GPU; ``NCCL version X`` the library.
JSON (``-J``): ``results`` rows with ``size`` and ``out_of_place.time`` (µs); ``config.devices``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from paraplan.errors import InputError
from paraplan.hardware_profiles.units import SECONDS_PER_US
from paraplan.limits import MAX_GPUS
from paraplan.measurements.ingest.hardware_names import catalog_name
from paraplan.measurements.ingest.records import Measurement, Parsed, bad_line, json_list, positive_number

# nccl-tests binary stem -> paraplan collective name (collectives.py's names).
COLLECTIVES = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
               "alltoall": "all_to_all", "sendrecv": "send_recv", "broadcast": "broadcast", "reduce": "reduce",
               "hypercube": "hypercube", "gather": "gather", "scatter": "scatter"}
_PERF = re.compile(r"\b(" + "|".join(sorted(COLLECTIVES, key=len, reverse=True)) + r")_perf")
_RANK = re.compile(r"^#?\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s+(.+)$")


def collective_name(path: Path, text: str) -> str:
    """The collective, from ``Collective test concluded: X_perf``/the command line, else the file name."""
    for source in (text[-4096:], text[:8192], Path(path).name):
        found = _PERF.search(source)
        if found:
            return COLLECTIVES[found.group(1)]
    raise InputError(f"{path}: cannot tell which collective this nccl-tests output measured; keep the binary's "
                     "name in the file name (e.g. all_reduce_perf.txt)")


def _ranks(lines: list[str]) -> tuple[int, set[str], str | None]:
    """(ranks listed, their hosts, the GPU name) from the ``Rank N ... on HOST device`` lines."""
    hosts: set[str] = set()
    gpus: list[str] = []
    ranks = 0
    for line in lines:
        found = _RANK.match(line.strip())
        if found:
            ranks, hosts = ranks + 1, hosts | {found.group(2)}
            gpus.append(found.group(3).strip())
    return ranks, hosts, (catalog_name(gpus[0]) if gpus else None)


def _software(text: str) -> str:
    found = re.findall(r"(NCCL version [^\s,]+|nccl-tests version [^\s,]+|CUDA Driver version [^\s,]+)", text)
    return "; ".join(dict.fromkeys(found)) or "nccl-tests (NCCL version not in the output)"


def _header(path: Path, lines: list[str]) -> tuple[int, list[str]]:
    for i, line in enumerate(lines):
        tokens = line.lstrip("#").split()
        if tokens[:2] == ["size", "count"]:
            return i, tokens
    raise InputError(f"{path}: no nccl-tests header line (size count type redop root time algbw busbw ...)")


def _group_size(lines: list[str], ranks: int) -> int:
    # At most 7 digits each: a longer count is not a group size (and int() of 4,300+ digits raises).
    found = re.search(r"nThread\s+(\d{1,7})\s+nGpus\s+(\d{1,7})\b", "\n".join(lines[:50]))
    return ranks or (int(found.group(1)) * int(found.group(2)) if found else 0)


def _row(name: str, line: int, seconds: float, size: float, group: int, hosts: int) -> Measurement:
    """One collective timing; ``hosts`` > 1 means the group crossed the network."""
    return Measurement(kind="collective", name=name, line=line, time_s=seconds,
                       params={"size_bytes": size, "group_size": float(group),
                               "domain": "inter" if hosts > 1 else "intra",
                               "devices_per_node": float(group / max(hosts, 1)), "setup": "nccl-tests"})


def parse_nccl_text(path: Path, text: str) -> Parsed:
    """Out-of-place times of every size row of an nccl-tests text output."""
    lines = text.splitlines()
    start, header = _header(path, lines)
    time_column = next((i for i, name in enumerate(header) if name in ("time", "cputime")), None)
    if time_column is None:
        raise bad_line(path, start + 1, "the header has no time column")
    name, (ranks, hosts, gpu) = collective_name(path, text), _ranks(lines)
    group = _group_size(lines, ranks)
    if group < 1:
        raise InputError(f"{path}: no 'Rank N ... device' or 'nThread N nGpus N' line gives the group size")
    if group > MAX_GPUS:
        raise InputError(f"{path}: a group of {group:,} GPUs is implausibly large (at most {MAX_GPUS:,})")
    out = []
    for line_no, line in enumerate(lines[start + 1:], start=start + 2):
        tokens = line.split()
        if not tokens or line.lstrip().startswith("#") or not tokens[0][:1].isdigit():
            continue
        if len(tokens) != len(header):
            raise bad_line(path, line_no, f"has {len(tokens)} columns, the header names {len(header)}")
        seconds = positive_number(path, line_no, header[time_column], tokens[time_column]) * SECONDS_PER_US
        out.append(_row(name, line_no, seconds, positive_number(path, line_no, "size", tokens[0]), group, len(hosts)))
    return Parsed(measurements=out, hardware=gpu, software=_software(text))


def _json_document(path: Path, text: str) -> tuple[dict[str, Any], list[Any], list[Any]]:
    """(document, results, devices) of an nccl-tests JSON file, each checked for its type."""
    document, results = json_list(path, text, "results", "an nccl-tests JSON file")
    stated = document.get("config")
    config: dict[str, Any] = stated if isinstance(stated, dict) else {}
    stated = config.get("devices")
    devices: list[Any] = stated if isinstance(stated, list) else []
    ngpus = config.get("ngpus")
    if not devices and isinstance(ngpus, int) and not isinstance(ngpus, bool) and ngpus > 0:
        if ngpus > MAX_GPUS:
            raise InputError(f"{path}: config.ngpus = {ngpus:,} is implausibly large (at most {MAX_GPUS:,})")
        devices = [{} for _ in range(ngpus)]
    if not devices:
        raise InputError(f"{path}: config.devices or config.ngpus must give the group size")
    return document, results, devices


def parse_nccl_json(path: Path, text: str) -> Parsed:
    """Out-of-place times of every row of an nccl-tests ``-J`` JSON file (``line`` = result index)."""
    document, results, devices = _json_document(path, text)
    name = collective_name(path, text)
    hosts = len({str(d.get("host", "")) for d in devices if isinstance(d, dict)})
    out = []
    for index, row in enumerate(results, start=1):
        timing = row.get("out_of_place") if isinstance(row, dict) else None
        if not isinstance(timing, dict):
            raise bad_line(path, index, "results entry needs an out_of_place object (line = result index)")
        seconds = positive_number(path, index, "out_of_place.time", timing.get("time", timing.get("cpu_time")))
        size = positive_number(path, index, "size", row.get("size"))
        out.append(_row(name, index, seconds * SECONDS_PER_US, size, len(devices), hosts))
    found = re.search(r"NVIDIA [A-Z]+\d+[^\"]*", text)
    software = f"NCCL {str(document.get('nccl_version', 'unknown'))[:40]}; " \
               f"nccl-tests {str(document.get('version', 'unknown'))[:40]}"
    return Parsed(measurements=out, hardware=catalog_name(found.group(0)) if found else None, software=software)
