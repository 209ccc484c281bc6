"""Full Megatron-LM runs from the store: the run's configuration as paraplan's model, and its prediction.

A Megatron log's ``arguments`` block (stored on every ``step`` row) names the model shape and the
parallel layout. This module turns it into a ModelSpec, a one-row ConfigTable, a Workload and a
cluster, and predicts the step with paraplan's own ``estimate`` on the analytical (or given) rates,
so the step-level calibration can compare it with the measured iteration time.

Megatron facts used here are the ones planner/engines.py holds for engine ``megatron``: the
Transformer Engine kernel stack, the Megatron state recipes, full recompute re-running the whole
layer (no early stop). cost_models cannot import the planner, so they are restated, not derived.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from paraplan.choices import CP_COMM_CODES, MEGATRON_CP_COMM_TYPES, RECOMPUTE_CODES, Precision
from paraplan.cost_models.compute import ComputeRates
from paraplan.cost_models.estimate import estimate
from paraplan.cost_models.recipes import MEGATRON_LOW_PRECISION, MEGATRON_MIXED
from paraplan.cost_models.table import ConfigTable, Workload
from paraplan.errors import InputError
from paraplan.hardware_profiles import quick_cluster
from paraplan.model_specs.hf_config import model_from_config
from paraplan.model_specs.model_spec import ModelSpec

REQUIRED = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "world_size", "micro_batch_size",
            "global_batch_size", "seq_length", "num_layers", "hidden_size", "num_attention_heads",
            "padded_vocab_size")
_RECOMPUTE_BY_GRANULARITY: dict[str, int] = {name: code for name, code in RECOMPUTE_CODES.items()}
"""Megatron's --recompute-granularity (selective, full; None when off) as the table's recompute code."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MegatronRun:
    """One run's measured step and what paraplan needs to predict it."""

    run: str
    """The source file's hash: one run per log."""
    measured_step_s: float
    """Median iteration time of the logged iterations after the first (which includes start-up)."""
    config: dict
    """The Megatron arguments that describe the run."""


def _flag(value: object) -> bool:
    """Whether a logged Megatron argument is set (False, None, 0 and the empty string are not)."""
    return str(value) not in ("False", "None", "0", "0.0", "")


def is_moe(config: dict) -> bool:
    """True for a run with routed experts (its arguments name ``num_experts``)."""
    return _flag(config.get("num_experts"))


def _model(config: dict) -> ModelSpec:
    """The dense model the run's arguments describe (GPT-2 style, or Llama style with SwiGLU)."""
    gated = _flag(config.get("swiglu", False))
    hf = {"model_type": "llama" if gated else "gpt2", "hidden_size": int(config["hidden_size"]),
          "num_attention_heads": int(config["num_attention_heads"]),
          "num_key_value_heads": int(config.get("num_query_groups") or config["num_attention_heads"]),
          "intermediate_size": int(config.get("ffn_hidden_size") or 4 * int(config["hidden_size"])),
          "num_hidden_layers": int(config["num_layers"]), "vocab_size": int(config["padded_vocab_size"]),
          "max_position_embeddings": int(config["seq_length"])}
    return model_from_config(hf, "megatron-run")


def _table(config: dict) -> ConfigTable:
    """The run's parallel layout as a one-row candidate table."""
    tp, pp = int(config["tensor_model_parallel_size"]), int(config["pipeline_model_parallel_size"])
    cp = int(config.get("context_parallel_size") or 1)
    per_stage = int(config["num_layers"]) // pp
    vpp = per_stage // int(config["num_layers_per_virtual_pipeline_stage"]) if _flag(
        config.get("num_layers_per_virtual_pipeline_stage")) else 1
    recompute = _RECOMPUTE_BY_GRANULARITY.get(str(config.get("recompute_granularity")), 0)
    ep = int(config.get("expert_model_parallel_size") or 1)
    etp = int(config.get("expert_tensor_parallel_size") or tp if ep > 1 else 1)
    named = {spelling: name for name, spelling in MEGATRON_CP_COMM_TYPES.items()}
    cp_comm = CP_COMM_CODES[named.get(str(config.get("cp_comm_type") or "p2p"), "p2p")]
    return ConfigTable.from_columns(tp=tp, pp=pp, dp=int(config["world_size"]) // (tp * pp * cp), cp=cp,
                                    cp_comm=cp_comm if cp > 1 else 0, ep=ep, etp=etp,
                                    vpp=vpp,
                                    mbs=int(config["micro_batch_size"]), recompute=recompute, offload=0,
                                    zero=int(_flag(config.get("use_distributed_optimizer"))),
                                    sp=int(_flag(config.get("sequence_parallel"))),
                                    ep_overlap=int(_flag(config.get("overlap_moe_expert_parallel_comm"))),
                                    tp_overlap=int(_flag(config.get("tp_comm_overlap")) and tp > 1
                                                   and _flag(config.get("sequence_parallel"))))


def predict_step_s(config: dict, hardware: str, rates: ComputeRates | None = None) -> float:
    """The step time paraplan predicts for the run ``config`` describes on ``hardware``."""
    missing = [key for key in REQUIRED if key not in config]
    if missing:
        raise InputError(f"a Megatron run needs its arguments block to predict it; missing {', '.join(missing)}")
    if is_moe(config):
        raise InputError("MoE Megatron runs are not mapped to paraplan's model yet; only dense runs are predicted")
    precision: Precision = "fp8" if _flag(config.get("fp8")) else "bf16"
    work = Workload(seq_len=int(config["seq_length"]), global_batch=int(config["global_batch_size"]),
                    precision=precision, recipe=MEGATRON_LOW_PRECISION if precision == "fp8" else MEGATRON_MIXED)
    cluster = quick_cluster(hardware, int(config["world_size"]))
    return float(np.atleast_1d(estimate(_model(config), cluster, work, _table(config), rates).step_time_s)[0])


def runs_from_steps(steps: pd.DataFrame) -> list[MegatronRun]:
    """One run per source file with at least two logged iterations (the first is dropped)."""
    runs = []
    for run, frame in steps.groupby("file_sha256"):
        frame = frame.sort_values("iteration")
        if len(frame) >= 2:
            config = {k: v for k, v in frame.iloc[0].items() if isinstance(v, (str, int, float)) and not pd.isna(v)}
            runs.append(MegatronRun(run=run, measured_step_s=float(frame["time_s"].iloc[1:].median()), config=config))
    return runs
