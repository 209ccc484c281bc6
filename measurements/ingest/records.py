"""What every ingestion parser returns: measurements tagged with hardware, software and source line.

A :class:`Measurement` is one timing (or one count, for routing statistics) with the shape that
produced it in ``params``. Kinds:

- ``gemm``: one matrix multiply; params ``m``, ``n``, ``k`` (C[m,n] = A[m,k]·B[k,n]) and ``dtype``.
- ``elementwise``: a memory-bound kernel; params ``bytes`` where known, else the layer shape.
- ``attention``: attention core; params ``batch``, ``seq_len``, ``heads``, ``kv_heads``, ``head_dim``,
  ``pass`` (forward or backward; ``decode``: one new token per sequence attending to ``kv_len`` keys).
- ``collective``: params ``size_bytes`` (the full buffer), ``group_size``, ``domain`` (intra or inter:
  whether all ranks share one NVLink domain).
- ``step``: a full training step (time of one iteration); params carry the run's configuration.
- ``memory``: a bandwidth probe; params ``bytes``.
- ``gpu_memory``: memory a run reports (Megatron's memory lines); ``time_s`` is 0, params in bytes.
- ``routing``: MoE routing counts; ``time_s`` is 0 and params carry ``layer``, ``expert``,
  ``next_expert`` (-1 for loads) and ``tokens``.
- ``moe``: one rank's fused MoE layer (aiconfigurator's ``moe_perf``); params ``num_tokens`` entering it,
  ``hidden_size``, ``inter_size`` (one expert's, unsharded), ``topk``, ``num_experts``, ``moe_tp_size``,
  ``moe_ep_size`` (the sharding whose rank-0 share ran), ``dtype``, ``distribution`` (``balanced`` or
  ``power_law_<alpha>``: how tokens pick experts).

Rows of a measured kernel table (aiconfigurator's database) also carry ``stack``: the engine and version the
kernel ran under, lower-case, e.g. ``vllm 0.24.0`` (``measurements/ingest/aiconfigurator_tables.py`` lists every
param of those rows).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paraplan.errors import InputError
from paraplan.files import decode_user_text, one_line, parse_user_json, read_user_bytes, shown

MAX_INGEST_BYTES = 1 << 30
"""A profiling file: torch.profiler traces of a few steps run 10-300 MB and parse in seconds; a larger one holds
more steps than a fit needs (record fewer active steps), and JSON parsing takes about 10x the file in memory."""

KINDS = ("gemm", "elementwise", "attention", "collective", "step", "memory", "gpu_memory", "routing", "moe")


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """One measured quantity from one line of one file."""

    kind: str
    """What was measured (``KINDS``)."""
    name: str
    """The op or collective, e.g. ``mlp_up_proj`` or ``all_reduce``."""
    time_s: float
    """Measured seconds (median over repeats where the source gives one); 0 for counts."""
    line: int
    """1-based line (or record index for JSON) in the source file."""
    model: str = ""
    """The model whose layer this op belongs to, when the source says (used to hold models out)."""
    params: dict[str, float | str] = field(default_factory=dict)
    """Shape and settings that produced the time (see the module docstring per kind)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"measurement kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not math.isfinite(self.time_s) or self.time_s < 0:
            raise ValueError(f"time_s must be a finite non-negative number of seconds, got {self.time_s}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ParsedFile:
    """Everything one file contributes to the store, all or nothing."""

    path: str
    """The file as given."""
    sha256: str
    """Hex digest of the file's bytes: the store's idempotency key."""
    kind: str
    """The format that parsed it (``detect.FORMATS``)."""
    hardware: str
    """GPU catalog name (``h100-sxm``) or ``cpu``."""
    software: str
    """Versions recorded with the data (driver, CUDA, NCCL, torch), or where they are unknown, why."""
    measurements: tuple[Measurement, ...]
    """The rows, in file order."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Parsed:
    """What a format parser read from a file's text, before hardware is resolved and hashes taken."""

    measurements: list[Measurement]
    """The rows, in file order."""
    hardware: str | None = None
    """The GPU catalog name the file itself names, or None when it does not say."""
    software: str = "not recorded in the file"
    """Versions the file records (driver, CUDA, NCCL, torch)."""


def file_bytes(path: Path) -> bytes:
    """The bytes of ``path``; InputError when it cannot be read or exceeds MAX_INGEST_BYTES."""
    return read_user_bytes(Path(path), MAX_INGEST_BYTES, "profiling file")


def file_text(path: Path, data: bytes) -> str:
    """``data`` as UTF-8 text; InputError naming the line of the first undecodable byte."""
    return decode_user_text(data, str(path))


def sha256_hex(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def json_list(path: Path, text: str, key: str, what: str) -> tuple[dict[str, Any], list[Any]]:
    """(document, document[key]) of a JSON file whose ``key`` must hold a list; InputError otherwise."""
    document = parse_user_json(text, str(path), top=None)
    if not isinstance(document, dict) or not isinstance(items := document.get(key), list):
        raise InputError(f"{path}: {what} needs a '{key}' list")
    return document, items


def bad_line(path: Path, line: int, what: str) -> InputError:
    """The one error shape for malformed input: file, line, what is wrong and what is expected."""
    return InputError(one_line(f"{path}: line {line}: {what}"))


def positive_number(path: Path, line: int, label: str, text: Any) -> float:
    """``text`` (a cell's text, or a parsed JSON value) as a finite positive float, or InputError naming the line
    and the column."""
    try:
        value = float(text)
    except (TypeError, ValueError, OverflowError):  # OverflowError: a JSON integer beyond float range
        raise bad_line(path, line, f"{label} must be a number, got {shown(text, 40)}") from None
    if not math.isfinite(value) or value <= 0:
        raise bad_line(path, line, f"{label} must be a positive finite number, got {shown(text, 40)}")
    return value
