"""The profile store's kernel-table rows: measured ops that name the software stack they ran on.

Rows whose params carry ``stack`` (aiconfigurator's per-op database: ``"vllm 0.24.0"``; paraplan's own training
suite: ``"pytorch 2.11.0+cu130"``) are grids measured for pricing, one group per (op kind, kernel name, stack,
dtype). Older rows without a stack (vidur's per-model layers, torch traces) feed the learned models instead.
SQLite's ``json_extract`` does the grouping and filtering inside the database, so a store holding aiconfigurator's
whole database (hundreds of thousands of rows) answers in a fraction of a second.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from paraplan.measurements.store import _read_sql


@dataclass(frozen=True, slots=True)
class KernelGroup:
    """One measured table: rows of one kernel on one stack, GPU and dtype."""

    hardware: str
    kind: str
    name: str
    """The kernel (aiconfigurator's ``kernel_source``, e.g. ``torch.nn.functional.linear``)."""
    stack: str
    dtype: str
    rows: int


def kernel_groups(store: Path, hardware: str, kind: str) -> list[KernelGroup]:
    """The stack-tagged groups of ``kind`` measured on ``hardware``, largest first."""
    frame = _read_sql(store, "SELECT name, json_extract(params, '$.stack') AS stack, "
                      "COALESCE(json_extract(params, '$.dtype'), '') AS dtype, COUNT(*) AS n FROM measurements "
                      "WHERE hardware = ? AND kind = ? AND json_extract(params, '$.stack') IS NOT NULL "
                      "GROUP BY 1, 2, 3 ORDER BY n DESC, 2, 1, 3", (hardware, kind))
    return [KernelGroup(hardware, kind, str(r.name), str(r.stack), str(r.dtype), int(r.n))
            for r in frame.itertuples()]


def group_rows(store: Path, group: KernelGroup, columns: tuple[str, ...],
               where: dict[str, str] | None = None) -> pd.DataFrame:
    """``time_s`` and the named params of one group's rows (``where``: params that must equal a text value where
    a row has them, e.g. ``{"pass": "forward"}`` keeps forward rows and rows that do not say)."""
    fields = ", ".join(f"json_extract(params, '$.{c}') AS {c}" for c in columns)
    extra = "".join(f" AND COALESCE(json_extract(params, '$.{k}'), ?) = ?" for k in (where or {}))
    query = (f"SELECT time_s, {fields} FROM measurements WHERE hardware = ? AND kind = ? AND name = ? "
             f"AND json_extract(params, '$.stack') = ? AND COALESCE(json_extract(params, '$.dtype'), '') = ?{extra}")
    frame = _read_sql(store, query, (group.hardware, group.kind, group.name, group.stack, group.dtype,
                                     *(v for value in (where or {}).values() for v in (value, value))))
    return frame.apply(pd.to_numeric, errors="coerce").replace([np.inf, -np.inf], np.nan).dropna()


def store_version(store: Path, hardware: str) -> str:
    """A digest of the files stored for ``hardware``: it changes exactly when that hardware's data does."""
    frame = _read_sql(store, "SELECT sha256 FROM files WHERE hardware = ? ORDER BY sha256", (hardware,))
    return hashlib.sha256("\n".join(frame["sha256"].astype(str)).encode()).hexdigest()
