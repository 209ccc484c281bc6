"""Which measured engine tables priced a serving plan (``--cost-model measured``): per setup, the engine versions and
the table behind each term, and per pool of a plan the share of its decode step and of one prompt's prefill that
the tables priced (the rest stays analytical: terms without a table, and shapes outside the tables' grids)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from paraplan.cost_models.inference_step import Sharding, prefill_attention_flops, step_time
from paraplan.planner.serving.problem import MeasuredTables, SetupKey

if TYPE_CHECKING:
    from paraplan.cost_models.serving_kernel_source import DeploymentTables
    from paraplan.planner.serving.pool_shape import PoolRole
    from paraplan.planner.serving.pools import ServingSetup

MEASURED_PROVENANCE = ("measured engine kernel tables (aiconfigurator's per-op database in the profile store: "
                       "GEMMs, MoE, attention, TP all-reduce) for each term and shape they cover, analytical for the "
                       "rest (kernel_tables: per setup, and per pool the share of the step they priced); otherwise "
                       "the ")


def setup_json(key: SetupKey, tables: DeploymentTables | None) -> dict[str, Any]:
    """One setup's tables: the engine versions they were measured under and what priced each term they cover (no
    versions and no terms: the store holds none, every term analytical)."""
    gpu, engine, kv_dtype = key
    return {"gpu": gpu, "engine": engine, "kv_cache_dtype": kv_dtype,
            "versions": [] if tables is None else list(tables.versions),
            "terms": {} if tables is None else dict(tables.terms)}


def measured_json(measured: MeasuredTables) -> dict[str, Any]:
    """The document's ``provenance.kernel_tables``: the store and every setup's tables."""
    return {"store": measured.store, "setups": [setup_json(key, tables) for key, tables in measured.by_setup]}


def table_fracs(setup: ServingSetup, shard: Sharding, batch: float) -> tuple[float, float]:
    """(decode, prefill): the share (0-1) of a decode step of ``batch`` sequences per attention-DP rank at the mean
    context, and of one prompt's prefill, that ``setup.cluster.serving_kernels`` priced (one token per sequence)."""
    model, prec = setup.model, setup.precision
    b = max(batch / float(shard.pp[0]), 1.0)  # a stage runs batch/pp sequences at a time (pools._decode)
    context = setup.context_tokens
    window = min(context, model.sliding_window) if model.sliding_window else context
    decode = step_time(model, setup.cluster, prec, shard, tokens_per_rank=b, sequences_per_rank=b,
                       attended_keys=(b * context, b * window), attention_flops=(0.0, 0.0), decode=True)
    full, sliding = prefill_attention_flops(model, setup.isl)
    prefill = step_time(model, setup.cluster, prec, shard, tokens_per_rank=setup.isl, sequences_per_rank=1.0,
                        attended_keys=(0.0, 0.0), attention_flops=(full, sliding), decode=False)
    return (float(np.asarray(decode.table_s / decode.total_s).ravel()[0]),
            float(np.asarray(prefill.table_s / prefill.total_s).ravel()[0]))


def pool_tables_json(measured: MeasuredTables, role: PoolRole, setup: ServingSetup, shard: Sharding,
                     running_batch: float) -> dict[str, Any]:
    """One pool's entry of a plan's ``kernel_tables``: its setup's tables and the share of its steps they priced
    (the decode step at the plan's running batch for aggregated and decode pools, a prefill for aggregated and
    prefill pools; None where the pool runs no such step)."""
    key = (setup.cluster.gpu.name, setup.engine.name, setup.kv_dtype)
    decode, prefill = table_fracs(setup, shard, running_batch)
    return {"role": role, **setup_json(key, measured.of(*key)),
            "decode_step_table_frac": None if role == "prefill" else decode,
            "prefill_table_frac": None if role == "decode" else prefill}
