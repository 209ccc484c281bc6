"""Published per-GPU memory measurements and paraplan's predictions of them.

The measurements (``memory_runs.csv``: torchtitan tables, Megatron-LM CI golden values,
Korthikanti et al. 2022 component values, torchtune, fit/OOM labels) are read from where the
user keeps them; paraplan ships only its reading of each row (``data/memory_reference.csv``):
the row's knobs in paraplan's vocabulary, which pipeline stage the number describes, and, for
rows that use techniques paraplan does not model (LoRA, 8-bit optimizers, CPU offload of states,
layouts the source leaves unstated), the reason it is out of scope. Each measurement is compared
with the matching prediction, never pooled across kinds: ``max_reserved`` with what the caching
allocator holds, ``max_allocated`` with live tensors, component values with the component, and
fit/OOM labels with the fit decision.

Readings that are paraplan's, not the source's: torchtitan's pipelined FSDP rows (tt24-13..18) run
torchtitan's default reshard policy under PP (never reshard after forward: paraplan's ZeRO-2 for
torchtitan) with its default micro-batch count then, one per pipeline stage (8: micro-batch 4 for the
local batch of 32, 1 for the local batch of 8).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from io import StringIO
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from paraplan.cost_models.device_memory import FRAGMENTATION_FRAC
from paraplan.cost_models.estimate import estimate
from paraplan.errors import InputError
from paraplan.files import one_line, read_user_text, shown
from paraplan.hardware_profiles import quick_cluster
from paraplan.hardware_profiles.units import BYTES_PER_GIB
from paraplan.limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_HEADS, MAX_LAYERS, MAX_SEQ_LEN, MAX_WIDTH
from paraplan.model_specs.hf_config import load_model
from paraplan.model_specs.model_spec import ModelSpec
from paraplan.planner.job import ParallelConfig, TrainingJob, configs_to_table

if TYPE_CHECKING:  # only the annotation of _stage_allocated names it
    from paraplan.cost_models.memory import MemoryBreakdown

MEMORY_RUNS_ENV = "PARAPLAN_MEMORY_RUNS"
DEFAULT_MEMORY_RUNS = Path("..") / "shared" / "calibration" / "memory_runs.csv"
MEASURED_COLUMNS = ("id", "source", "layers", "hidden", "heads", "kv_heads", "ffn", "seq_len", "num_gpus",
                    "tp", "pp", "dp", "cp", "gbs", "measured_memory_gib", "memory_metric")
METRICS = ("reserved", "allocated", "activations", "states", "fits", "oom")
MAX_MEMORY_RUNS_BYTES = 4 << 20
"""The measurements file: about 100 rows of 200 bytes today; 4 MiB is 200x that."""
# Counts every scored row must state (positive integers, each bounded as paraplan.limits bounds a job), and the
# shape columns a row without a preset model must state as well.
_JOB_COUNTS = {"seq_len": MAX_SEQ_LEN, "num_gpus": MAX_GPUS, "tp": MAX_GPUS, "pp": MAX_GPUS, "dp": MAX_GPUS,
               "cp": MAX_GPUS, "gbs": MAX_GLOBAL_BATCH}
_SHAPE_COUNTS = {"layers": MAX_LAYERS, "hidden": MAX_WIDTH, "heads": MAX_HEADS, "kv_heads": MAX_HEADS,
                 "ffn": MAX_WIDTH}


@dataclass(frozen=True, slots=True)
class MemoryPrediction:
    """One measured row beside its prediction (bytes), or the reason it is out of scope."""

    run_id: str
    source: str
    metric: str
    """What was measured: reserved, allocated, activations, states, fits or oom."""
    measured_bytes: float
    """NaN for fit/OOM labels."""
    predicted_bytes: float
    predicted_fits: bool
    out_of_scope: str = ""
    """Why the row is listed but not scored ('' when scored)."""

    @property
    def error_frac(self) -> float:
        """Signed relative error (+ = predicted more memory than measured)."""
        return self.predicted_bytes / self.measured_bytes - 1.0

    @property
    def label_right(self) -> bool:
        """For a fit/OOM label: the fit decision agrees with it."""
        return self.predicted_fits == (self.metric == "fits")


def memory_runs_path(path: str | Path | None = None) -> Path:
    """The measurements file: ``path``, else $PARAPLAN_MEMORY_RUNS, else ../shared/calibration/."""
    chosen = Path(path) if path is not None else Path(os.environ.get(MEMORY_RUNS_ENV, DEFAULT_MEMORY_RUNS))
    if not chosen.is_file():
        raise InputError(f"memory runs: {chosen} not found (pass --memory-runs PATH or set {MEMORY_RUNS_ENV})")
    return chosen


def load_memory_runs(path: str | Path | None = None) -> pd.DataFrame:
    """Measured rows joined with paraplan's reading of each (rows without a reading are refused)."""
    chosen = memory_runs_path(path)
    text = read_user_text(chosen, MAX_MEMORY_RUNS_BYTES, "memory runs file")
    try:
        measured = pd.read_csv(StringIO(text), dtype={"id": str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError, OverflowError) as exc:
        raise InputError(one_line(f"memory runs {chosen}: malformed CSV: {exc}")) from None
    missing = [c for c in MEASURED_COLUMNS if c not in measured.columns]
    if missing:
        raise InputError(f"memory runs {chosen}: missing column(s) {', '.join(missing)}")
    # The index may be a column (pandas makes the first one the index when rows are longer than the header).
    measured = pd.concat([measured, pd.Series(range(2, len(measured) + 2), index=measured.index, name="csv_line")],
                         axis=1)
    reading = pd.read_csv(StringIO(resources.files("paraplan.data").joinpath("memory_reference.csv").read_text()),
                          dtype={"id": str, "scope": str}, keep_default_na=False)
    merged = measured.drop_duplicates("id").merge(reading, on="id", how="inner", suffixes=("", "_paraplan"))
    for _, row in merged.iterrows():
        _check_row(row, chosen)
    return merged


def _check_row(row: pd.Series, path: Path) -> None:
    """InputError naming the line and column of a scored row's count or measurement that is not usable."""
    if row["scope"]:
        return
    where = f"memory runs {path}: line {row['csv_line']} (run {shown(row['id'], 30)})"
    counts = {**_JOB_COUNTS, **(_SHAPE_COUNTS if not row["model"] else {})}
    for column, bound in counts.items():
        value = _as_number(row[column])
        if not (pd.notna(value) and np.isfinite(value) and value >= 1 and value == int(value) and value <= bound):
            raise InputError(f"{where}: {column} must be a whole number from 1 to {bound:,}, "
                             f"got {shown(row[column], 30)}")
    if metric_of(str(row["memory_metric"])) not in ("fits", "oom"):
        gib = _as_number(row["measured_memory_gib"])
        if not (pd.notna(gib) and 0 < gib < 1e6):
            raise InputError(f"{where}: measured_memory_gib must be a positive number of GiB, got "
                             f"{shown(row['measured_memory_gib'], 30)}")


def _as_number(cell: Any) -> float:
    """A cell as a float; NaN when it is not a number (or an integer beyond float range)."""
    try:
        return float(cell)
    except (TypeError, ValueError, OverflowError):
        return float("nan")


def metric_of(memory_metric: str) -> str:
    """The kind of number a row holds, from the source's description of it."""
    text = memory_metric.strip().lower()
    for prefix, metric in (("max_reserved", "reserved"), ("max_allocated", "allocated"), ("activation", "activations"),
                           ("params+grads+optimizer", "states"), ("fits", "fits"), ("oom", "oom")):
        if text.startswith(prefix):
            return metric
    return "other"


def _megatron_gpt(row: pd.Series) -> ModelSpec:
    """A Megatron GPT model from the row's shapes: LayerNorm with biases, GeLU MLP, learned
    positions, untied output layer, dropout 0.1 (Megatron's defaults), vocab padded as Megatron pads it."""
    hidden, heads = int(row["hidden"]), int(row["heads"])
    return ModelSpec(name=f"{row['id']} (Megatron GPT)", model_type="gpt", num_layers=int(row["layers"]),
                     hidden_size=hidden, num_heads=heads, num_kv_heads=int(row["kv_heads"]),
                     head_dim=hidden // heads, ffn_size=int(row["ffn"]), vocab_size=int(row["vocab_paraplan"]),
                     gated_mlp=False, tied_embeddings=False, norm="layernorm", norm_bias=True, qkv_bias=True,
                     linear_bias=True, qk_norm=False, position="learned", max_positions=int(row["seq_len"]),
                     dropout=True)


MEMORY_MODELS = "memory_models"
"""Package-data folder of the config.json files of models a measured row ran that are no preset (the reading's
``model`` names one as ``memory_models/NAME.json``; each says where its shapes come from)."""


def _model(row: pd.Series) -> ModelSpec:
    name = str(row["model"])
    if name.startswith(MEMORY_MODELS + "/"):
        with resources.as_file(resources.files("paraplan.data").joinpath(name)) as path:
            return load_model(str(path))
    return load_model(name) if name else _megatron_gpt(row)


def _intish(value: Any) -> int:
    """A CSV cell holding a whole number, possibly written as a float (``8.0``), as an int."""
    return int(float(value))


def predict_memory_row(row: pd.Series) -> MemoryPrediction:
    """Predict one measured row at its stated configuration."""
    metric = metric_of(str(row["memory_metric"]))
    measured = float(row["measured_memory_gib"]) * BYTES_PER_GIB if pd.notna(row["measured_memory_gib"]) else np.nan
    if row["scope"]:
        return MemoryPrediction(row["id"], row["source"], metric, measured, np.nan, False, row["scope"])
    model = _model(row)
    mbs, dp = _intish(row["mbs_paraplan"]), _intish(row["dp"])
    job = TrainingJob(model=model, seq_len=_intish(row["seq_len"]), global_batch=_intish(row["gbs"]),
                      precision=row["precision_paraplan"], engine=row["engine"], attention=row["attention"],
                      compiled=bool(int(row["compile"])))
    # Expert parallelism as the run states it; every MoE row scored states --expert-tensor-parallel-size 1.
    ep = _intish(row["ep"]) if model.is_moe and pd.notna(row["ep"]) else 1
    config = ParallelConfig(tp=_intish(row["tp"]), pp=_intish(row["pp"]), dp=dp, cp=_intish(row["cp"]), ep=ep,
                            vpp=_intish(row["vpp_paraplan"]), mbs=mbs, zero=_intish(row["zero"]),
                            recompute=row["recompute_paraplan"], sp=bool(int(row["sp"])),
                            cp_comm="allgather" if row["engine"] == "torchtitan" else "p2p")
    cluster = quick_cluster(row["gpu_paraplan"], config.num_gpus)
    est = estimate(model, cluster, job.workload(), configs_to_table([config]))
    mem = est.memory
    stage = row["stage"]
    predicted = {
        "reserved": mem.reserved_bytes, "allocated": _stage_allocated(mem, stage),
        "activations": mem.first_activations_bytes, "states": mem.middle_states_bytes,
        "fits": mem.required_bytes, "oom": mem.required_bytes,
    }.get(metric, np.full(1, np.nan))
    return MemoryPrediction(row["id"], row["source"], metric, measured, float(predicted[0]), bool(est.fits[0]))


def _stage_allocated(mem: MemoryBreakdown, stage: str) -> np.ndarray:
    """Allocated bytes of the ``stage`` a row measured: last, first, else the most loaded."""
    return {"last": mem.last_allocated_bytes, "first": mem.first_allocated_bytes}.get(stage, mem.allocated_bytes)


def predict_memory_all(frame: pd.DataFrame) -> list[MemoryPrediction]:
    """Predict every row (out-of-scope rows carry their reason instead)."""
    return [predict_memory_row(row) for _, row in frame.iterrows()]


def summarize_memory(predictions: list[MemoryPrediction]) -> dict[str, dict[str, float]]:
    """Per (source, metric): rows scored, median and worst |error|; per source of labels: right/total."""
    groups: dict[str, dict[str, float]] = {}
    scored = [p for p in predictions if not p.out_of_scope]
    for key in dict.fromkeys((p.source, p.metric) for p in scored):
        rows = [p for p in scored if (p.source, p.metric) == key]
        name = f"{key[0]} [{key[1]}]"
        if key[1] in ("fits", "oom"):
            groups[name] = {"rows": len(rows), "labels_right": sum(p.label_right for p in rows)}
            continue
        errors = np.array([abs(p.error_frac) for p in rows])
        groups[name] = {"rows": len(rows), "median_abs_error_frac": float(np.median(errors)),
                        "max_abs_error_frac": float(errors.max())}
    return groups


def confusion(predictions: list[MemoryPrediction]) -> dict[str, int]:
    """Fit/OOM labels against the fit decision, over every scored label."""
    counts: dict[str, int] = {}
    for p in predictions:
        if p.out_of_scope or p.metric not in ("fits", "oom"):
            continue
        key = f"{'fits' if p.metric == 'fits' else 'OOM'} -> predicted {'fits' if p.predicted_fits else 'OOM'}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def leave_one_out_reserved(frame: pd.DataFrame) -> dict[str, float]:
    """Signed error of every scored max_reserved row when the allocator's fragmentation fraction for its
    mode (eager or compiled) is refitted on the other rows only. Reserved is (1 + f) x the live peak plus
    the gradients created after it; the refit takes the median of (measured - those gradients) over the
    predicted live peak."""
    rows = [row for _, row in frame.iterrows()
            if not row["scope"] and metric_of(str(row["memory_metric"])) == "reserved"]
    allocated = {row["id"]: _predicted_allocated(row) for row in rows}
    late = {}
    for row in rows:
        mode = "compiled" if int(row["compile"]) else "eager"
        late[row["id"]] = (predict_memory_row(row).predicted_bytes
                           - (1 + FRAGMENTATION_FRAC[mode]) * allocated[row["id"]])
    ratio = {row["id"]: (float(row["measured_memory_gib"]) * BYTES_PER_GIB - late[row["id"]]) / allocated[row["id"]]
             for row in rows}
    errors = {}
    for row in rows:
        same_mode = [ratio[r["id"]] for r in rows if r["id"] != row["id"] and r["compile"] == row["compile"]]
        if same_mode:
            predicted = float(np.median(same_mode)) * allocated[row["id"]] + late[row["id"]]
            errors[row["id"]] = predicted / (float(row["measured_memory_gib"]) * BYTES_PER_GIB) - 1.0
    return errors


def _predicted_allocated(row: pd.Series) -> float:
    """The predicted live-tensor peak of the row's most loaded stage (bytes)."""
    as_allocated = row.copy()
    as_allocated["memory_metric"], as_allocated["stage"] = "max_allocated", "max"
    return predict_memory_row(as_allocated).predicted_bytes
