"""Each source's error with measured kernel tables and without: ``paraplan validate --kernel-tables STORE``.

For every published reference run on a GPU the profile store holds a 16-bit GEMM table for (16-bit runs only: the
tables price no fp8 recipe yet), and every step of paraplan's own H100 probe, the analytical prediction beside the
one priced by ``--cost-model measured`` (kernel tables where they cover a term, GEMMs, attention and NCCL
collectives inside a node, analytical elsewhere). Nothing is
fitted here: the tables are out of sample for every row; the analytical column is in sample for the reference runs
its efficiency fractions were fitted to (hardware_profiles/efficiency.yaml).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from paraplan.cost_models.compute import ComputeRates
from paraplan.cost_models.learned.provider import compute_rates, has_gemm_table, learned_cluster
from paraplan.hardware_profiles import ClusterSpec
from paraplan.hardware_profiles.run_factor import gpu_at_scale
from paraplan.planner.job import TrainingJob
from paraplan.validation import serving_runs as sr
from paraplan.validation.memory_probe import PROBE_GPU, load_probe_rows, predict_probe_step_s
from paraplan.validation.reference import Prediction, load_reference_runs, predict_row

PROBE_SOURCE = "paraplan H100 probe (torchtitan 0.2.2, PyTorch 2.11, 1 GPU; step time)"


@dataclass(frozen=True, slots=True)
class TableRow:
    """One run's signed error under both models (throughput for reference runs, step time for the probe;
    + = predicted faster for throughput, slower for step time)."""

    run_id: str
    source: str
    gpu: str
    analytical_error: float
    tables_error: float


def _measured_rates(store: Path) -> Callable[[TrainingJob, ClusterSpec], ComputeRates]:
    """The measured cost model's rates for a reference run's job and cluster."""
    def rates_for(job: TrainingJob, cluster: ClusterSpec) -> ComputeRates:
        work = job.workload()
        gpu = gpu_at_scale(cluster.gpu, cluster.num_gpus)
        return compute_rates("measured", gpu, work.precision, work.attention, work.kernel_stack, store)
    return rates_for


def reference_rows(store: Path, analytical: dict[str, Prediction] | None = None) -> list[TableRow]:
    """The 16-bit reference runs on GPUs the store (or paraplan's shipped tables) has a GEMM table for, under both
    models (``analytical``: the runs' analytical predictions by id where the caller already made them, as
    ``validate`` has)."""
    runs = load_reference_runs()
    runs = runs[runs["precision"].isin(["bf16", "fp16"])]
    covered = {gpu for gpu in runs["gpu"].unique() if has_gemm_table(store, gpu, "bf16")}
    rows = []
    for _, run in runs[runs["gpu"].isin(covered)].iterrows():
        plain = (analytical or {}).get(run["id"]) or predict_row(run)
        measured = predict_row(run, _measured_rates(store), lambda cluster: learned_cluster("measured", cluster, store))
        rows.append(TableRow(run["id"], plain.group, run["gpu"], plain.error_frac, measured.error_frac))
    return rows


def probe_rows(store: Path) -> list[TableRow]:
    """The own H100 probe steps under both models (none when neither the store nor the shipped tables have an H100
    table)."""
    if not has_gemm_table(store, PROBE_GPU, "bf16"):
        return []
    probe = load_probe_rows()
    probe = probe[probe["error"] != "oom"]
    return [TableRow(f"{r['shape']} s{r['seq']} b{r['batch']} {r['ac']}", PROBE_SOURCE, PROBE_GPU,
                     predict_probe_step_s(r, "analytical") / float(r["step_s"]) - 1.0,
                     predict_probe_step_s(r, "measured", store) / float(r["step_s"]) - 1.0)
            for _, r in probe.iterrows()]


def summarize(rows: list[TableRow]) -> dict[str, dict[str, float]]:
    """Per source (and over all rows): rows, median and worst |error| under each model."""
    frame = pd.DataFrame([asdict(r) for r in rows])
    out: dict[str, dict[str, float]] = {}
    for source, part in [*frame.groupby("source", sort=False), ("all", frame)] if len(frame) else []:
        a, t = part["analytical_error"].abs(), part["tables_error"].abs()
        out[str(source)] = {"rows": float(len(part)), "analytical_median": float(np.nanmedian(a)),
                            "analytical_max": float(np.nanmax(a)), "tables_median": float(np.nanmedian(t)),
                            "tables_max": float(np.nanmax(t))}
    return out


SERVING_SPLITS = {"engine": "backend", "GPU": "system", "model kind": "kind"}
"""How ``validate --serving --kernel-tables`` splits the rows: per engine, per GPU, dense beside MoE models."""
MODE_SLICES = ("aggregated", "disaggregated, worker counts stated", "disaggregated, worker counts not stated")
"""And per mode, as ``serving_runs.slice_masks`` names them."""


def _errors(grid: sr.OverheadGrid) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(TPOT, TTFT) |relative error| per row in sample (constants fitted on every row), then with each model left
    out of the fit."""
    ttft, tpot = sr.relative_errors(sr.apply_constants(grid, sr.fit_constants(grid, np.ones(len(grid.rows), bool))))
    held_ttft, held_tpot = sr.relative_errors(sr.held_out(grid, "model_path"))
    return tpot, ttft, held_tpot, held_ttft


def _median(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if len(finite) else float("nan")


def serving_comparison(store: Path, path: str | Path | None = None) -> dict[str, Any]:
    """``validate --serving --kernel-tables STORE``: TPOT and TTFT median |error| of the same rows analytical and
    priced with the store's tables (each mode fits its own step and request overheads), in sample and with each
    model left out, per engine, GPU and dense/MoE model, with the share of step time the tables priced."""
    with sr.serving_data(path) as folder:
        rows = sr.load_measurements(folder)
        plain, priced = sr.overhead_grid(rows, folder), sr.overhead_grid(rows, folder, store)
        shares = sr.table_shares(rows, folder, store)
    errors = {"analytical": _errors(plain), "tables": _errors(priced)}
    frame = rows[["backend", "system"]].assign(kind=np.where(shares["moe"], "MoE", "dense"))
    groups = [("all", "all", np.ones(len(rows), dtype=bool))]
    for split, column in SERVING_SPLITS.items():
        groups += [(split, str(value), (frame[column] == value).to_numpy()) for value in sorted(frame[column].unique())]
    modes = sr.slice_masks(rows, shares["moe"].to_numpy(dtype=bool))  # issue 31's target reads the aggregated rows
    groups += [("mode", name, modes[name]) for name in MODE_SLICES]
    table = []
    for split, value, mask in groups:
        record: dict[str, Any] = {"split": split, "value": value, "rows": int(mask.sum()),
                                  "tables_rows_frac": float((shares["tables"][mask] != "").mean()),
                                  "decode_table_frac": _median(shares["decode_table_frac"].to_numpy()[mask]),
                                  "prefill_table_frac": _median(shares["prefill_table_frac"].to_numpy()[mask])}
        for mode, (tpot, ttft, held_tpot, held_ttft) in errors.items():
            record |= {f"tpot_{mode}": _median(tpot[mask]), f"ttft_{mode}": _median(ttft[mask]),
                       f"tpot_{mode}_model_out": _median(held_tpot[mask]),
                       f"ttft_{mode}_model_out": _median(held_ttft[mask])}
        table.append(record)
    provenance = sorted({label for label in shares["tables"] if label})
    return {"store": str(store), "groups": table, "tables": provenance}
