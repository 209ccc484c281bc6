"""Published measured runs (data/reference_runs.csv) and paraplan's predictions of them.

Each row is predicted through the same search as ``paraplan plan``, with every knob the source
states fixed; knobs it leaves unstated (micro-batch, recompute, ZeRO, vpp, sp) are chosen by
the search, and the row says which were chosen. How context parallelism communicates is a
launch flag sources do not print: an optional ``cp_comm`` column states it, and without it the
engine's default applies (Megatron ``--cp-comm-type p2p``, torchtitan's all-gather), not the
search's favourite.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from io import StringIO
from typing import Any, cast

import numpy as np
import pandas as pd

from paraplan.choices import CP_COMM_CODES, PIPELINE_SCHEDULE_CODES, RECOMPUTE_CODES, CpComm
from paraplan.cost_models.compute import ComputeRates
from paraplan.errors import InputError
from paraplan.hardware_profiles import ClusterSpec, load_cluster, quick_cluster
from paraplan.hardware_profiles.catalog import with_nic
from paraplan.hardware_profiles.units import BYTES_PER_S_PER_GBIT_S, FLOPS_PER_TFLOP
from paraplan.model_specs.hf_config import load_model
from paraplan.model_specs.model_spec import ModelSpec
from paraplan.planner.engines import engine_rules
from paraplan.planner.job import TrainingJob
from paraplan.planner.plan import config_at
from paraplan.planner.search import SearchResult, search

KNOBS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "zero", "recompute", "sp", "ep_overlap", "offload",
         "tp_overlap")
REQUIRED = ("id", "source", "model", "gpu", "num_gpus", "seq_len", "global_batch", "precision", "engine", "attention",
            "measured_tokens_per_s_per_gpu", "measured_tflops_per_gpu", "flops_convention") + KNOBS


@dataclass(frozen=True, slots=True)
class Prediction:
    """One reference row predicted."""

    run_id: str
    source: str
    measured_tokens_per_s_per_gpu: float
    predicted_tokens_per_s_per_gpu: float
    chosen: str
    """Knobs the search chose because the source left them unstated, e.g. 'mbs=2 recompute=none'."""
    moe: bool = False
    """The run trains a Mixture-of-Experts model (reported as its own group)."""

    @property
    def group(self) -> str:
        """The summary group: the source, with MoE runs apart from dense ones."""
        return f"{self.source} (MoE)" if self.moe else self.source

    @property
    def error_frac(self) -> float:
        """Signed relative error of predicted throughput (+ = predicted faster)."""
        return self.predicted_tokens_per_s_per_gpu / self.measured_tokens_per_s_per_gpu - 1.0


def load_reference_runs(text: str | None = None) -> pd.DataFrame:
    """The shipped reference runs (or ``text`` in the same CSV format)."""
    if text is None:
        text = resources.files("paraplan.data").joinpath("reference_runs.csv").read_text()
    try:
        frame = pd.read_csv(StringIO(text), dtype={"id": str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise InputError(f"reference runs: malformed CSV: {exc}") from None
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise InputError(f"reference runs: missing column(s) {', '.join(missing)}")
    return frame


def _eq3_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Narayanan et al. 2021 Eq. 3 per token: 96·l·h²·(1 + s/6h + V/16lh) (counts the recompute pass)."""
    layers, h, v = model.num_layers, model.hidden_size, model.vocab_size
    return 96.0 * layers * h * h * (1 + seq_len / (6 * h) + v / (16 * layers * h))


def measured_tokens_per_s_per_gpu(row: pd.Series, model: ModelSpec) -> float:
    """The row's measured throughput, derived from TFLOP/s with the source's formula if needed."""
    if pd.notna(row["measured_tokens_per_s_per_gpu"]):
        return float(row["measured_tokens_per_s_per_gpu"])
    if row["flops_convention"] == "megatron2021_eq3":
        return float(row["measured_tflops_per_gpu"]) * FLOPS_PER_TFLOP / _eq3_flops_per_token(model,
                                                                                              int(row["seq_len"]))
    raise InputError(f"reference run {row['id']}: no tokens/s and no known FLOP convention to derive it")


def _fixed_knobs(row: pd.Series) -> dict[str, list[int]]:
    stated = row.get("cp_comm")
    default = engine_rules(row["engine"]).cp_comm_types[:1] or ("p2p",)
    # A CSV cell: the cast only names its type; an unknown name still fails the lookup (KeyError).
    cp_comm = cast(CpComm, stated if isinstance(stated, str) and stated else default[0])
    fixed = {"cp_comm": [CP_COMM_CODES[cp_comm]]}
    # Every published run here ran 1F1B or the interleaved schedule; a row may name another one.
    schedule = row.get("pp_schedule")
    schedule = schedule if isinstance(schedule, str) and schedule else "1f1b"
    if schedule not in PIPELINE_SCHEDULE_CODES:
        raise InputError(f"run {row['id']}: pp_schedule {schedule!r} is none of {', '.join(PIPELINE_SCHEDULE_CODES)}")
    fixed["pp_schedule"] = [PIPELINE_SCHEDULE_CODES[schedule]]
    for knob in KNOBS:
        value = row[knob]
        if pd.isna(value):
            continue
        fixed[knob] = [RECOMPUTE_CODES[value]] if knob == "recompute" else [int(value)]
    return fixed


def _cluster(row: pd.Series) -> ClusterSpec:
    num_gpus = int(row["num_gpus"])
    if isinstance(row.get("cluster"), str) and row["cluster"]:
        cluster = load_cluster(row["cluster"], num_gpus=num_gpus)
    else:
        cluster = quick_cluster(row["gpu"], num_gpus)
    nic = row.get("nic_gbps_per_gpu")
    return with_nic(cluster, float(nic) * BYTES_PER_S_PER_GBIT_S) if pd.notna(nic) else cluster


def reference_job(row: pd.Series) -> TrainingJob:
    """The training job of one reference run (model, sequence, batch, precision, engine, kernels)."""
    imbalance = row.get("expert_imbalance")
    compiled, async_tp = (pd.notna(row.get(k)) and str(row.get(k)).strip() not in ("", "0", "0.0")
                          for k in ("compile", "async_tp"))
    recipe = row.get("fp8_recipe")
    recipe = recipe.strip() if isinstance(recipe, str) and recipe.strip() else "tensorwise"
    # An optional ``dispatcher`` column: how the source's recipe moved tokens (Megatron's flex dispatcher with the
    # DeepEP backend is ``deepep``); without it the engine's default (Megatron: the NCCL all-to-all).
    dispatcher = row.get("dispatcher")
    dispatcher = dispatcher.strip() if isinstance(dispatcher, str) and dispatcher.strip() else "auto"
    # An optional ``expert_mlp`` column: ``fused`` where the source's recipe ran the routed experts through
    # Transformer Engine's fused grouped MLP (Megatron use_transformer_engine_op_fuser); else Megatron's eager ops.
    fused_expert_mlp = str(row.get("expert_mlp", "")).strip() == "fused"
    # A 2024 torchtitan run compiled the transformer blocks, not the loss (components came later).
    return TrainingJob(model=load_model(row["model"]), seq_len=int(row["seq_len"]),
                       global_batch=int(row["global_batch"]), precision=row["precision"], fp8_recipe=recipe,
                       engine=row["engine"],
                       attention=row["attention"], dispatcher=dispatcher,
                       expert_imbalance=float(imbalance) if pd.notna(imbalance) else None,
                       fused_kernels=str(row.get("kernels", "")) == "fused", compiled=compiled, async_tp=async_tp,
                       fused_expert_mlp=fused_expert_mlp)


RatesFor = Callable[[TrainingJob, ClusterSpec], ComputeRates | None]
"""The compute rates to price a reference run with (None: the analytical default)."""


def search_row(row: pd.Series, rates_for: RatesFor | None = None,
               cluster_for: Callable[[ClusterSpec], ClusterSpec] | None = None
               ) -> tuple[TrainingJob, ClusterSpec, SearchResult, dict[str, list[int]]]:
    """The job, cluster and search of one reference run, its published knobs fixed (and those knobs); ``rates_for``
    and ``cluster_for`` swap in another cost model's rates and collectives."""
    job = reference_job(row)
    fixed = _fixed_knobs(row)
    cluster = _cluster(row) if cluster_for is None else cluster_for(_cluster(row))
    rates = rates_for(job, cluster) if rates_for is not None else None
    return job, cluster, search(job, cluster, fixed, rates=rates), fixed


def predict_row(row: pd.Series, rates_for: RatesFor | None = None,
                cluster_for: Callable[[ClusterSpec], ClusterSpec] | None = None) -> Prediction:
    """Predict one reference run through the planner's search (priced by ``rates_for`` and ``cluster_for``, else
    analytically)."""
    job, _, result, fixed = search_row(row, rates_for, cluster_for)
    model = job.model
    measured = measured_tokens_per_s_per_gpu(row, model)
    if len(result.ranked) == 0:
        return Prediction(row["id"], row["source"], measured, float("nan"), "infeasible", model.is_moe)
    best = int(result.ranked[0])
    config = config_at(result.table, best)
    chosen = " ".join(f"{k}={getattr(config, k)}" for k in ("etp", "vpp", "mbs", "zero", "recompute", "sp", "offload")
                      if k not in fixed and (k != "etp" or model.is_moe))
    return Prediction(row["id"], row["source"], measured,
                      float(result.estimates.tokens_per_s_per_gpu[best]), chosen, model.is_moe)


PUBLISHED_CONFIG_COLUMNS = ("model", "gpu", "cluster", "num_gpus", "nic_gbps_per_gpu", "seq_len", "global_batch",
                            "precision", "fp8_recipe", "engine", "attention", "kernels", "compile", "async_tp",
                            "tp", "pp", "dp", "cp", "ep", "vpp", "mbs", "zero", "recompute")


def distinct_published(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per published configuration (repeated measurements of it ask the same question)."""
    return frame.drop_duplicates(subset=[c for c in PUBLISHED_CONFIG_COLUMNS if c in frame.columns])


LAYOUT_AXES = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "sp")
"""What the published-layout check lets the search choose; the rest stays as the source ran it."""


@dataclass(frozen=True, slots=True)
class LayoutGap:
    """A reference run's published layout against the best layout the search finds for the same job."""

    run_id: str
    moe: bool
    published_step_s: float
    best_step_s: float
    best: str
    """The search's best layout, e.g. 'tp2 pp4 dp8 cp1 ep1 vpp5 mbs1'."""

    @property
    def ratio(self) -> float:
        """Predicted step of the published layout over the best one's (1 = the search agrees)."""
        return self.published_step_s / self.best_step_s


def published_layout_gap(row: pd.Series,
                         cache: dict[tuple[Any, ...], SearchResult] | None = None) -> LayoutGap | None:
    """How far the search ranks a run's published layout from its best, holding the memory and sharding
    knobs (ZeRO, recompute, offload, expert overlap) at those of the published plan, so the comparison is
    between layouts (tp, pp, dp, cp, ep, etp, vpp, mbs, sp) a user of that stack would pick among. None
    where the published configuration does not fit. ``cache`` shares free searches between rows of one job."""
    job, cluster, result, fixed = search_row(row)
    if len(result.ranked) == 0:
        return None
    chosen = int(result.ranked[0])
    kept = {axis: [int(getattr(result.table, axis)[chosen])] for axis in ("zero", "recompute", "offload", "ep_overlap",
                                                                                  "tp_overlap")}
    kept["cp_comm"] = fixed["cp_comm"]
    key = (repr(job), repr(cluster), tuple(sorted((k, tuple(v)) for k, v in kept.items())))
    cache = {} if cache is None else cache
    if key not in cache:
        cache[key] = search(job, cluster, kept)
    free = cache[key]
    best = int(free.ranked[0])
    layout = " ".join(f"{axis}{int(getattr(free.table, axis)[best])}" for axis in LAYOUT_AXES[:-1])
    return LayoutGap(row["id"], job.model.is_moe, float(result.estimates.step_time_s[chosen]),
                     float(free.estimates.step_time_s[best]), layout)


def predict_all(frame: pd.DataFrame) -> list[Prediction]:
    """Predict every row."""
    return [predict_row(row) for _, row in frame.iterrows()]


def summarize(predictions: list[Prediction]) -> dict[str, float]:
    """Median and worst absolute error over the feasible predictions, and how many were infeasible."""
    errors = np.array([abs(p.error_frac) for p in predictions if np.isfinite(p.predicted_tokens_per_s_per_gpu)])
    return {
        "rows": len(predictions),
        "infeasible": sum(1 for p in predictions if not np.isfinite(p.predicted_tokens_per_s_per_gpu)),
        "median_abs_error_frac": float(np.median(errors)) if len(errors) else float("nan"),
        "max_abs_error_frac": float(errors.max()) if len(errors) else float("nan"),
    }


@dataclass(frozen=True, slots=True)
class BreakdownRow:
    """One reference run beside its prediction, with what the per-row breakdown groups and sorts by."""

    run_id: str
    model: str
    gpu: str
    container: str
    """The release the source measured it with (a NeMo container such as '26.06.01'), or '' where unstated."""
    layout: str
    """The published knobs, e.g. 'tp1 pp4 vpp12 ep32 mbs2 ov1 mxfp8' (ov: expert all-to-all overlap)."""
    measured_tokens_per_s_per_gpu: float
    predicted_tokens_per_s_per_gpu: float
    error_frac: float
    """Signed relative error of predicted throughput (+ = predicted faster)."""


def container_of(table: str) -> str:
    """The release a row's ``table`` cell names ('performance-summary.md; 26.08 NeMo container; ...' -> '26.08')."""
    for part in str(table).split(";"):
        words = part.split()
        if len(words) >= 2 and words[1] == "NeMo":
            return words[0]
    return ""


def _layout_of(row: pd.Series) -> str:
    knobs = " ".join(f"{k}{int(row[k])}" for k in ("tp", "pp", "vpp", "ep", "mbs") if pd.notna(row[k]))
    overlap = f" ov{int(row['ep_overlap'])}" if pd.notna(row["ep_overlap"]) else ""
    recipe = row.get("fp8_recipe")
    precision = recipe if row["precision"] == "fp8" and isinstance(recipe, str) and recipe else row["precision"]
    return f"{knobs}{overlap} {precision}"


def breakdown(frame: pd.DataFrame, predictions: list[Prediction], group: str) -> list[BreakdownRow]:
    """The rows of one summary group (``Prediction.group``), sorted by model, GPU and container."""
    by_id = frame.set_index("id", drop=False)
    rows = [BreakdownRow(p.run_id, str(by_id.loc[p.run_id, "model"]), str(by_id.loc[p.run_id, "gpu"]),
                         container_of(by_id.loc[p.run_id, "table"]) if "table" in by_id.columns else "",
                         _layout_of(by_id.loc[p.run_id]), p.measured_tokens_per_s_per_gpu,
                         p.predicted_tokens_per_s_per_gpu, p.error_frac)
            for p in predictions if p.group == group]
    return sorted(rows, key=lambda r: (r.model, r.gpu, r.container, r.run_id))


def grouped_errors(rows: list[BreakdownRow]) -> dict[tuple[str, str, str], tuple[int, float, float]]:
    """(rows, median signed error, largest |error|) per (model, GPU, container), over the feasible rows."""
    groups: dict[tuple[str, str, str], list[float]] = {}
    for r in rows:
        if np.isfinite(r.error_frac):
            groups.setdefault((r.model, r.gpu, r.container), []).append(r.error_frac)
    return {key: (len(errors), float(np.median(errors)), float(np.max(np.abs(errors))))
            for key, errors in sorted(groups.items())}
