"""Which measured tables price a training step's memory-bound kernels and its optimizer step, read from the store.

paraplan's training suite (``paraplan profile --suite training``, measurements/profile_kernels.py) times a Llama
block's memory-bound ops by the bytes they must move, eager and through ``torch.compile``, and one fused AdamW step
by parameter count. Two tables come from them, cached beside the store as the GEMM tables are (kernel_source.py):

- **One kernel's seconds by bytes** (an effective HBM bandwidth curve): from the rows that time one kernel moving
  exactly the bytes the row names, the eager residual add (``torch.add``: two reads and a write). The eager norm,
  rotary and SwiGLU rows run several aten kernels through fp32 intermediates the row's bytes leave out (the step
  model counts those bytes itself, layer.py), and the compiled rows carry torch.compile's CPU dispatch per call
  (a compiled residual add of 403 MB takes 185 us against eager's 143 us on the shipped H100), which a compiled
  step pays once per graph, not per op. Monotone (a running minimum from above); outside the measured bytes the
  roofline prices (kernel_pricing.table_memory_seconds).
- **The fused AdamW step by parameter count**: ``torch.optim.AdamW(fused=True)`` over fp32 parameters, 28 bytes a
  parameter (profile_grids.ADAMW_BYTES_PER_PARAMETER). Its bandwidth is flat past 2**28 parameters (2.54 and 2.57
  TB/s at 2**28 and 2**30 on the shipped H100), so time grows linearly in parameters past the largest measured.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from paraplan.cost_models.kernel_source import _cached
from paraplan.cost_models.kernel_tables import KernelTable, build_table
from paraplan.measurements.kernel_rows import KernelGroup, group_rows, kernel_groups

BANDWIDTH_OPS = ("residual_add",)
"""The suite's element-wise ops whose eager row is one kernel moving exactly the row's bytes."""
OPTIMIZER_OP = "adamw_step"


def _suite_groups(store: Path, hardware: str, names: tuple[str, ...]) -> list[KernelGroup]:
    """Paraplan's own training-suite groups of element-wise ``names`` measured on ``hardware``."""
    return [g for g in kernel_groups(store, hardware, "elementwise") if g.stack.startswith("pytorch")
            and g.name in names]


def _suite_rows(store: Path, hardware: str, ops: tuple[str, ...], columns: tuple[str, ...], where: dict[str, str],
                size: str) -> tuple[pd.DataFrame, str]:
    """The training suite's rows of ``ops`` on ``hardware`` (``columns`` and the time, ``where`` matched) with a
    positive ``size`` and time, and the stacks they were measured on."""
    groups = _suite_groups(store, hardware, ops)
    frames = [group_rows(store, g, columns, where) for g in groups]
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if not rows.empty:
        rows = rows[(rows[size] > 0) & (rows["time_s"] > 0)]
    return rows, ", ".join(sorted({g.stack for g in groups}))


def _build_bandwidth(store: Path, hardware: str) -> dict[str, KernelTable]:
    rows, stacks = _suite_rows(store, hardware, BANDWIDTH_OPS, ("bytes", "compiled"), {"pass": "forward"}, "bytes")
    rows = rows[rows["compiled"] == 0] if not rows.empty else rows
    if rows.empty:
        return {}
    label = (f"measured one-kernel HBM time by bytes ({hardware}, eager {', '.join(BANDWIDTH_OPS)} on {stacks}, "
             f"{len(rows):,} rows, {rows['bytes'].min():.3g}-{rows['bytes'].max():.3g} B)")
    return {"bandwidth": build_table("memory_bound", ("bytes",), rows[["bytes"]].to_numpy(float),
                                     rows["time_s"].to_numpy(float), label, exponents_above=(None,))}


def elementwise_table(store: Path, hardware: str) -> KernelTable | None:
    """The measured one-kernel seconds-by-bytes curve of ``hardware``, or None when the store has none."""
    if not Path(store).is_file():
        return None
    return _cached(store, hardware, "elementwise", lambda: _build_bandwidth(store, hardware)).get("bandwidth")


def _build_optimizer(store: Path, hardware: str) -> dict[str, KernelTable]:
    rows, stacks = _suite_rows(store, hardware, (OPTIMIZER_OP,), ("parameters",), {"implementation": "fused"},
                               "parameters")
    if rows.empty:
        return {}
    label = (f"measured fused AdamW step by parameters ({hardware}, {stacks}, {len(rows):,} rows, "
             f"{rows['parameters'].min():.3g}-{rows['parameters'].max():.3g} parameters)")
    return {"adamw": build_table("optimizer_step", ("parameters",), rows[["parameters"]].to_numpy(float),
                                 rows["time_s"].to_numpy(float), label, exponents_above=(1.0,))}


def optimizer_table(store: Path, hardware: str) -> KernelTable | None:
    """The measured fused AdamW step of ``hardware`` by parameter count, or None when the store has none."""
    if not Path(store).is_file():
        return None
    return _cached(store, hardware, "optimizer", lambda: _build_optimizer(store, hardware)).get("adamw")
