"""Which measured table prices routed experts' grouped GEMMs, read from the store and cached (kernel_source.py).

paraplan's training suite times ``torch._grouped_mm`` (the experts' GEMM torchtitan calls; measurements/
profile_kernels.grouped_rows) with balanced routing: ``experts`` GEMMs of [tokens_per_expert, n, k], each with its
own weight, forward layout (tokens as the rows). The table is over (tokens per expert, experts, n, k). Past the
largest tokens per expert or expert count time grows linearly (the kernel is saturated there: 620-655 TFLOP/s at
8,192 tokens per expert on the shipped H100 for 2,048-wide experts, a persistent grid that only gets more tiles);
past the widths measured, below any axis's smallest value, or where a neighbouring cell was never measured (the
suite skipped operands over half the GPU's memory), the query is not covered and the analytical model prices it.
Transformer Engine's per-expert cuBLAS GEMMs (Megatron) are not this kernel, but stand where it stands: the
dense tables' cuBLAS is priced the same way for every engine (kernel_source.py).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from paraplan.cost_models.kernel_source import SIXTEEN_BIT, _cached
from paraplan.cost_models.kernel_tables import KernelTable, build_table
from paraplan.measurements.kernel_rows import group_rows, kernel_groups

GROUPED_AXES = ("tokens_per_expert", "experts", "n", "k")


def _build_grouped(store: Path, hardware: str, dtype: str) -> dict[str, KernelTable]:
    groups = [g for g in kernel_groups(store, hardware, "gemm") if g.name == "grouped_mm"
              and g.stack.startswith("pytorch") and g.dtype in SIXTEEN_BIT]
    groups = [g for g in groups if g.dtype == dtype] or groups
    frames = [group_rows(store, g, GROUPED_AXES, {"pass": "forward"}) for g in groups]
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if rows.empty:
        return {}
    rows = rows[(rows[list(GROUPED_AXES)] > 0).all(axis=1) & (rows["time_s"] > 0)]
    if rows.empty:
        return {}
    stacks = ", ".join(sorted({g.stack for g in groups}))
    label = f"measured torch._grouped_mm table ({hardware}, {groups[0].dtype} on {stacks}, {len(rows):,} rows)"
    return {"grouped": build_table("grouped_gemm", GROUPED_AXES, rows[list(GROUPED_AXES)].to_numpy(float),
                                   rows["time_s"].to_numpy(float), label, exponents_above=(1.0, 1.0, None, None))}


def grouped_gemm_table(store: Path, hardware: str, dtype: str) -> KernelTable | None:
    """The measured grouped-GEMM table of ``hardware`` for a job's 16-bit ``dtype``, or None when the store has none."""
    if dtype not in SIXTEEN_BIT or not Path(store).is_file():
        return None
    return _cached(store, hardware, f"grouped-{dtype}", lambda: _build_grouped(store, hardware, dtype)).get("grouped")
