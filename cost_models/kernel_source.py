"""Which measured kernel table prices a job's GEMMs, read from the profile store and cached beside it.

A training job's 16-bit GEMMs are cuBLAS(Lt) calls under every engine paraplan plans (PyTorch's ``F.linear``
under torchtitan and DeepSpeed, Transformer Engine's ``te.Linear`` under Megatron-LM), so a table measured
through PyTorch's linear layer on the same GPU prices them: paraplan's own training suite (stack ``pytorch ...``)
first, else aiconfigurator's plain-PyTorch GEMM tables (``torch.nn.functional.linear`` under vLLM,
``sglang_torch_linear`` under SGLang), pooled. Low-precision GEMMs differ per recipe (per-tensor,
block-scaled, MX): they stay analytical until a table measured with the job's recipe exists.

Building a table reads only its group's rows (SQLite filters them); the built grid is cached in
``<store>.models/kernel_tables/`` under a digest of the hardware's stored files, so the next plan loads it in
milliseconds and new data invalidates it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from paraplan.cost_models.kernel_tables import KernelTable, TableAxis, build_table
from paraplan.measurements.kernel_rows import KernelGroup, group_rows, kernel_groups, store_version

TORCH_LINEAR_KERNELS = ("torch.nn.functional.linear", "sglang_torch_linear")
"""aiconfigurator GEMM kernels that are PyTorch's own linear layer (cuBLAS), as a training step calls it."""
SIXTEEN_BIT = ("bf16", "fp16")
GEMM_AXES = ("m", "n", "k")
TABLE_RULES_VERSION = 2
"""Part of every cache name: raise it when the choice or the building of a table changes, so old caches go unread."""


def _training_gemm_groups(groups: list[KernelGroup], dtype: str) -> list[KernelGroup]:
    """The groups that price a training job's ``dtype`` GEMMs: paraplan's own suite if the store has it, else every
    plain-PyTorch linear table (the same cuBLAS kernel measured under several engines: pooled, each grid cell then
    takes the median of all their rows); the job's own 16-bit type where measured, else the other."""
    if dtype not in SIXTEEN_BIT:
        return []
    usable = [g for g in groups if g.dtype in SIXTEEN_BIT and g.name != "grouped_mm"
              and (g.stack.startswith("pytorch") or g.name in TORCH_LINEAR_KERNELS)]
    chosen = [g for g in usable if g.stack.startswith("pytorch")] or usable
    same_type = [g for g in chosen if g.dtype == dtype]
    return sorted(same_type or chosen, key=lambda g: (g.stack, g.name, g.dtype))


def _cache_path(store: Path, hardware: str, dtype: str, version: str) -> Path:
    """Where the built table of ``hardware``'s ``dtype`` GEMMs for this state of the store lives."""
    name = f"gemm-{dtype}-v{TABLE_RULES_VERSION}-{version[:16]}.npz"
    return Path(store).with_suffix(".models") / "kernel_tables" / hardware / name


def _save(path: Path, table: KernelTable) -> None:
    """Write ``table`` atomically; a store folder that cannot be written just goes uncached."""
    meta = {"op": table.op, "label": table.label, "num_rows": table.num_rows,
            "axes": [[a.name, a.monotone, a.exponent_above] for a in table.axes]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial.npz")
        arrays: dict[str, np.ndarray] = {f"axis{i}": a.log2_points for i, a in enumerate(table.axes)}
        arrays.update(log_seconds=table.log_seconds, meta=np.array(json.dumps(meta)))
        with partial.open("wb") as handle:
            np.savez(handle, allow_pickle=False, **arrays)
        partial.replace(path)
    except OSError:
        return


def _load(path: Path) -> KernelTable | None:
    """The cached table, or None when absent or unreadable (it is then rebuilt)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            axes = tuple(TableAxis(name, data[f"axis{i}"], bool(mono), exp)
                         for i, (name, mono, exp) in enumerate(meta["axes"]))
            return KernelTable(op=meta["op"], axes=axes, log_seconds=data["log_seconds"], label=meta["label"],
                               num_rows=int(meta["num_rows"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _build_gemm(store: Path, groups: list[KernelGroup]) -> KernelTable | None:
    frames = [group_rows(store, group, GEMM_AXES, {"pass": "forward"}) for group in groups]
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if rows.empty:
        return None
    rows = rows[(rows[list(GEMM_AXES)] > 0).all(axis=1) & (rows["time_s"] > 0)]
    if rows.empty:
        return None
    kernels = ", ".join(f"{g.name} on {g.stack}" for g in groups)
    label = f"measured {groups[0].dtype} GEMM table ({groups[0].hardware}, {kernels}, {len(rows):,} rows)"
    return build_table("gemm", GEMM_AXES, rows[list(GEMM_AXES)].to_numpy(float), rows["time_s"].to_numpy(float),
                       label)


def training_gemm_table(store: Path, hardware: str, dtype: str) -> KernelTable | None:
    """The measured GEMM table for a training job's ``dtype`` on ``hardware``, or None when the store has none.

    The cache is consulted before the store's rows: finding the group scans every GEMM row's params (about half a
    second for aiconfigurator's whole database), a cached table loads in milliseconds. A store state without a
    table leaves an empty ``.none`` marker, so it is not scanned again either."""
    if dtype not in SIXTEEN_BIT or not Path(store).is_file():
        return None
    path = _cache_path(store, hardware, dtype, store_version(store, hardware))
    if path.with_suffix(".none").is_file():
        return None
    cached = _load(path) if path.is_file() else None
    if cached is not None:
        return cached
    table = _build_gemm(store, _training_gemm_groups(kernel_groups(store, hardware, "gemm"), dtype))
    if table is not None:
        _save(path, table)
    else:
        _mark_none(path.with_suffix(".none"))
    return table


def _mark_none(path: Path) -> None:
    """Remember that this state of the store has no table (best effort: an unwritable folder just rescans)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError:
        return
