"""Plans: a job, a configuration and its prediction, serialised as schema-checked JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from importlib import resources
from typing import TYPE_CHECKING, Any

import numpy as np

from paraplan.choices import CP_COMM_NAMES, PIPELINE_SCHEDULE_NAMES, RECOMPUTE_NAMES
from paraplan.cost_models.device_memory import FIT_MARGIN_FRAC, driver_visible_bytes, usable_capacity_bytes
from paraplan.cost_models.estimate import EstimateTable
from paraplan.cost_models.memory import MemoryBreakdown
from paraplan.cost_models.table import ConfigTable
from paraplan.errors import InputError
from paraplan.hardware_profiles import ClusterSpec
from paraplan.model_specs.model_spec import ModelSpec, WeightFormat
from paraplan.planner.engines import engine_rules
from paraplan.planner.job import ParallelConfig, TrainingJob
from paraplan.planner.json_schema import validate_own
from paraplan.planner.layout import RANK_ORDER, stage_layers
from paraplan.version import __version__

if TYPE_CHECKING:
    from paraplan.planner.search import SearchResult

SCHEMA_VERSION = 1
_BREAKDOWN = ("compute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_comm_s", "bubble_s", "dp_comm_s", "offload_s",
              "optimizer_s")
_MEMORY = ("weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "logits_bytes",
           "transient_bytes", "reserve_bytes")


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """One ranked answer: what to run and what it will do."""

    job: TrainingJob
    cluster: ClusterSpec
    config: ParallelConfig
    estimate: dict[str, Any]
    """Scalar predictions in SI units (see plan.schema.json)."""
    fits: bool
    rank: int
    """1 = best under the search objective."""


def config_at(table: ConfigTable, row: int) -> ParallelConfig:
    """The ParallelConfig of one table row."""
    return ParallelConfig(
        tp=int(table.tp[row]), pp=int(table.pp[row]), dp=int(table.dp[row]), cp=int(table.cp[row]),
        cp_comm=CP_COMM_NAMES[int(table.cp_comm[row])],
        ep=int(table.ep[row]), etp=int(table.etp[row]),
        vpp=int(table.vpp[row]), mbs=int(table.mbs[row]), zero=int(table.zero[row]),
        recompute=RECOMPUTE_NAMES[int(table.recompute[row])], sp=bool(table.sp[row]),
        ep_overlap=bool(table.ep_overlap[row]),
        offload=int(table.offload[row]), pp_schedule=PIPELINE_SCHEDULE_NAMES[int(table.pp_schedule[row])],
        tp_overlap=bool(table.tp_overlap[row]),
    )


def plan_at(job: TrainingJob, cluster: ClusterSpec, result: SearchResult, row: int, rank: int) -> Plan:
    """The Plan of one row of a search result (the CLI's and the API's)."""
    return Plan(job=job, cluster=cluster, config=config_at(result.table, row),
                estimate=estimate_at(result.estimates, row), fits=bool(row in result.ranked), rank=rank)


def estimate_at(est: EstimateTable, row: int) -> dict[str, Any]:
    """Scalar predictions of one row, with breakdowns."""
    memory = est.memory
    return {
        "step_time_s": float(est.step_time_s[row]),
        "tokens_per_s": float(est.tokens_per_s[row]),
        "tokens_per_s_per_gpu": float(est.tokens_per_s_per_gpu[row]),
        "mfu": float(est.mfu[row]),
        "hfu": float(est.hfu[row]),
        "model_tflops_per_gpu": float(est.model_flops_per_s_per_gpu[row]) / 1e12,
        "num_microbatches": int(est.num_microbatches[row]),
        "peak_memory_bytes": float(memory.peak_bytes[row]),
        "allocated_memory_bytes": float(memory.allocated_bytes[row]),
        "reserved_memory_bytes": float(memory.reserved_bytes[row]),
        "peak_memory_stage": ("first", "last", "middle")[int(memory.worst_stage[row])],
        "host_memory_bytes": float(memory.host_bytes[row]),
        "step_time_breakdown_s": {name: float(getattr(est, name)[row]) for name in _BREAKDOWN},
        "memory_breakdown_bytes": {name: float(np.asarray(getattr(memory, name))[row]) for name in _MEMORY},
        "stage_memory_bytes": stage_memory(memory, row),
    }


def stage_memory(memory: MemoryBreakdown, row: int) -> list[dict[str, Any]]:
    """Live tensors and saved activations at the peak of the first, the busiest middle (pp >= 3) and the last
    (pp >= 2) pipeline stage of ``row``. The middle total is 0 without a middle stage; the last stage is the
    first one's own values at pp 1."""
    entries = [("first", memory.first_allocated_bytes, memory.first_activations_bytes)]
    if float(memory.middle_allocated_bytes[row]) > 0:
        entries.append(("middle", memory.middle_allocated_bytes, memory.middle_activations_bytes))
    if float(memory.last_activations_bytes[row]) != float(memory.first_activations_bytes[row]) \
            or float(memory.last_allocated_bytes[row]) != float(memory.first_allocated_bytes[row]):
        entries.append(("last", memory.last_allocated_bytes, memory.last_activations_bytes))
    return [{"stage": name, "allocated_bytes": float(total[row]), "activations_bytes": float(acts[row])}
            for name, total, acts in entries]


def plan_to_json(plan: Plan, cost_model: str, run: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan as a JSON-ready dict, validated against the shipped schema; ``run`` (planner.run.cost.run_document)
    adds the whole run's time, cost and goodput when a budget was given."""
    job, cluster = plan.job, plan.cluster
    document = {
        "schema_version": SCHEMA_VERSION,
        "rank": plan.rank,
        "model": {"name": job.model.name, "params": job.model.total_params(), "shape": model_shape(job.model)},
        "cluster": {"name": cluster.name, "gpu": cluster.gpu.name, "num_gpus": cluster.num_gpus,
                    "gpus_per_node": cluster.gpus_per_node, "nvlink_domain_gpus": cluster.nvlink_domain_gpus},
        "job": {"seq_len": job.seq_len, "global_batch": job.global_batch, "precision": job.precision,
                "engine": job.engine, "attention": job.attention_kernel,
                "flops_convention": job.flops_convention,
                **({"capacity_factor": job.capacity_factor} if job.capacity_factor is not None else {}),
                **({"dispatcher": job.token_dispatcher} if job.model.is_moe else {}),
                **({"fused_expert_mlp": True} if job.model.is_moe and job.fused_expert_mlp else {}),
                **({"fp8_recipe": job.fp8_recipe} if job.precision == "fp8" else {}),
                **({"compiled": job.compiled, "async_tp": job.async_tp} if job.engine == "torchtitan" else {})},
        "config": plan.config.as_dict(),
        "estimate": plan.estimate,
        "fits": plan.fits,
        # rank_map null = the default order RANK_ORDER; 'paraplan export --format json' writes it out.
        "placement": {"rank_order": RANK_ORDER, "rank_map": None,
                      "stage_layers": stage_layers(job.model.num_layers, plan.config.pp, plan.config.vpp,
                                                   engine_rules(job.engine).pipeline_split)},
        "provenance": {"paraplan_version": __version__, "cost_model": cost_model,
                       "calibration": "hardware_profiles/efficiency.yaml",
                       # A user GPU's numbers live in the user's file, its efficiency is borrowed: say both.
                       "hardware": {"gpu": cluster.gpu.name, "origin": cluster.gpu.origin,
                                    "efficiency_from": cluster.gpu.efficiency_from},
                       "efficiency_calibration": cluster.gpu.calibration(
                           job.precision, job.attention_kernel, engine_rules(job.engine).kernel_stack).as_dict(),
                       "memory_capacity": memory_capacity(job, cluster)},
        **({"run": run} if run is not None else {}),
    }
    validate_own(document, plan_schema())
    return document


def memory_capacity(job: TrainingJob, cluster: ClusterSpec) -> dict[str, float]:
    """The per-GPU memory the plan was checked against and how it is reached: the HBM the driver exposes, less
    paraplan's fit margin (cost_models.device_memory.FIT_MARGIN_FRAC), less the job's own headroom (bytes, 0-1)."""
    capacity = float(usable_capacity_bytes(cluster.gpu.hbm_bytes)) * (1.0 - job.memory_headroom_frac)
    return {"driver_visible_bytes": float(driver_visible_bytes(cluster.gpu.hbm_bytes)), "margin_frac": FIT_MARGIN_FRAC,
            "headroom_frac": job.memory_headroom_frac, "capacity_bytes": capacity}


def plan_schema() -> dict[str, Any]:
    """The JSON Schema every plan file is checked against."""
    text = (resources.files("paraplan.planner") / "schemas" / "plan.schema.json").read_text()
    return json.loads(text)


UNSTORED_MODEL_FIELDS = ("name", "mixers")
"""ModelSpec fields a plan's ``model.shape`` leaves out: the name, stored beside it, and the mixer shapes,
which only serving prices (``model_shape`` says why)."""


def model_shape(spec: ModelSpec) -> dict[str, Any]:
    """Every architecture field of the model (all but its name and mixer shapes: ``UNSTORED_MODEL_FIELDS``), so
    a plan file alone can be launched."""
    # mixers stays out: training does not price linear attention or a sparse-attention indexer (the model lists
    # them in unpriced_features and planning refuses it), so a training plan never needs their shapes; leaving
    # them out also keeps the plan schema and every plan document as they were.
    shape = {field.name: getattr(spec, field.name) for field in fields(spec)
             if field.name not in UNSTORED_MODEL_FIELDS}
    shape["moe_layers"] = list(spec.moe_layers)
    shape["unpriced_features"] = list(spec.unpriced_features)
    shape["weights"] = spec.weights.to_json() if spec.weights else None
    return shape


def model_from_shape(name: str, shape: dict[str, Any]) -> ModelSpec:
    """The ModelSpec a plan's ``model.shape`` describes (without mixer shapes, as ``model_shape`` stores it);
    InputError when the shape is inconsistent."""
    if "mixers" in shape:  # model_shape never writes it; a dict here would not be a MixerShapes
        raise InputError(f"plan model {name!r}: mixers is not a plan field (model_shape leaves it out)")
    try:
        weights = shape.get("weights")
        return ModelSpec(name=name, **{**shape, "moe_layers": tuple(shape.get("moe_layers", ())),
                                       "unpriced_features": tuple(shape.get("unpriced_features", ())),
                                       "weights": WeightFormat.from_json(weights) if weights else None})
    except (TypeError, ValueError) as exc:
        raise InputError(f"plan model {name!r}: {exc}") from None
