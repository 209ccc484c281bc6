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

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from paraplan.choices import CP_COMM_CODES, MEGATRON_CP_COMM_TYPES, RECOMPUTE_CODES, Precision
from paraplan.cost_models.compute import ComputeRates
from paraplan.cost_models.estimate import estimate
from paraplan.cost_models.recipes import MEGATRON_LOW_PRECISION, MEGATRON_MIXED
from paraplan.cost_models.table import ConfigTable, Workload
from paraplan.errors import InputError
from paraplan.files import one_line, shown
from paraplan.hardware_profiles import quick_cluster
from paraplan.model_specs.hf_config import model_from_config
from paraplan.model_specs.model_spec import ModelSpec

REQUIRED = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "world_size", "micro_batch_size",
            "global_batch_size", "seq_length", "num_layers", "hidden_size", "num_attention_heads",
            "padded_vocab_size")
_MAX_COUNT = 2**40
"""Largest count a logged argument may state (tokens, sequences, widths): beyond it nothing is a real run."""
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


def _int(config: dict, key: str) -> int:
    """The logged argument ``key`` as a positive integer (a log writes ``8``; a store may hold ``8.0``);
    InputError for anything else, a 1,000-digit count included."""
    value = config.get(key)
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if isinstance(value, str) and re.fullmatch(r"\s*[0-9]{1,18}(\.0*)?\s*", value):
        number = float(value) if "." in value else int(value)
    if isinstance(number, float) and number.is_integer() and abs(number) < 2**62:
        number = int(number)
    if not isinstance(number, int) or not 1 <= number <= _MAX_COUNT:
        raise InputError(f"Megatron run argument {key} expects an integer from 1 to {_MAX_COUNT:,}, "
                         f"got {shown(value)}")
    return number


def is_moe(config: dict) -> bool:
    """True for a run with routed experts (its arguments name ``num_experts``)."""
    return _flag(config.get("num_experts"))


def _model(config: dict) -> ModelSpec:
    """The dense model the run's arguments describe (GPT-2 style, or Llama style with SwiGLU)."""
    gated = _flag(config.get("swiglu", False))
    hidden = _int(config, "hidden_size")
    hf = {"model_type": "llama" if gated else "gpt2", "hidden_size": hidden,
          "num_attention_heads": _int(config, "num_attention_heads"),
          "num_key_value_heads": _int(config, "num_query_groups") if config.get("num_query_groups") else
          _int(config, "num_attention_heads"),
          "intermediate_size": _int(config, "ffn_hidden_size") if config.get("ffn_hidden_size") else 4 * hidden,
          "num_hidden_layers": _int(config, "num_layers"), "vocab_size": _int(config, "padded_vocab_size"),
          "max_position_embeddings": _int(config, "seq_length")}
    return model_from_config(hf, "megatron-run")


def _table(config: dict) -> ConfigTable:
    """The run's parallel layout as a one-row candidate table."""
    tp, pp = _int(config, "tensor_model_parallel_size"), _int(config, "pipeline_model_parallel_size")
    cp = _int(config, "context_parallel_size") if config.get("context_parallel_size") else 1
    per_stage = _int(config, "num_layers") // pp
    vpp = per_stage // _int(config, "num_layers_per_virtual_pipeline_stage") if _flag(
        config.get("num_layers_per_virtual_pipeline_stage")) else 1
    recompute = _RECOMPUTE_BY_GRANULARITY.get(str(config.get("recompute_granularity")), 0)
    ep = _int(config, "expert_model_parallel_size") if config.get("expert_model_parallel_size") else 1
    etp = (_int(config, "expert_tensor_parallel_size") if config.get("expert_tensor_parallel_size") else tp) \
        if ep > 1 else 1
    dp = _int(config, "world_size") // (tp * pp * cp)
    if vpp < 1 or dp < 1:
        raise InputError(f"the Megatron run's layout does not fit: {dp} data-parallel replicas of tp·pp·cp = "
                         f"{tp * pp * cp}, {vpp} virtual stages of {per_stage} layers per stage")
    named = {spelling: name for name, spelling in MEGATRON_CP_COMM_TYPES.items()}
    cp_comm = CP_COMM_CODES[named.get(str(config.get("cp_comm_type") or "p2p"), "p2p")]
    return ConfigTable.from_columns(tp=tp, pp=pp, dp=dp, cp=cp,
                                    cp_comm=cp_comm if cp > 1 else 0, ep=ep, etp=etp,
                                    vpp=vpp,
                                    mbs=_int(config, "micro_batch_size"), recompute=recompute, offload=0,
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
    work = Workload(seq_len=_int(config, "seq_length"), global_batch=_int(config, "global_batch_size"),
                    precision=precision, recipe=MEGATRON_LOW_PRECISION if precision == "fp8" else MEGATRON_MIXED)
    cluster = quick_cluster(hardware, _int(config, "world_size"))
    try:
        return float(np.atleast_1d(estimate(_model(config), cluster, work, _table(config), rates).step_time_s)[0])
    except InputError:
        raise
    except ValueError as exc:  # a layout the log states that no table or job can hold (vpp 0, dp 0, ...)
        raise InputError(f"the Megatron run's arguments describe no layout paraplan can price: "
                         f"{one_line(str(exc), 160)}") from None


def runs_from_steps(steps: pd.DataFrame) -> list[MegatronRun]:
    """One run per source file with at least two logged iterations (the first is dropped)."""
    runs = []
    for run, frame in steps.groupby("file_sha256"):
        frame = frame.sort_values("iteration")
        if len(frame) >= 2:
            config = {k: v for k, v in frame.iloc[0].items() if isinstance(v, (str, int, float)) and not pd.isna(v)}
            runs.append(MegatronRun(run=run, measured_step_s=float(frame["time_s"].iloc[1:].median()), config=config))
    return runs
