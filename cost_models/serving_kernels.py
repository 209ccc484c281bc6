"""Serving-engine kernel tables that price an inference step's terms where they cover them.

A :class:`ServingKernels` holds the tables one deployment's kernels were measured in (NVIDIA aiconfigurator's per-op
database for one GPU, engine, engine version and quantization; ``cost_models.serving_kernel_source`` picks them from
the profile store). ``ClusterSpec.serving_kernels`` carries it and ``inference_step.step_time`` reads it: each term a
table covers (a weight GEMM's shape, a layer's routed experts, the attention core of full-attention layers, MLA's
included, the TP all-reduce) takes the table's seconds, every other term keeps the analytical roofline. Each function
here returns (seconds, covered) per query, seconds NaN where not covered; nothing falls back silently.

Shapes are per GPU, as the engines' collectors measured them: a GEMM of m tokens by a linear layer's [n, k] shard,
attention over the heads and KV heads one attention-TP rank holds, the MoE layer of one rank under moe_tp x moe_ep
sharding fed every token of the MoE group (aiconfigurator's MoE query scales tokens by the attention-DP size).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from paraplan.arrays import Column
from paraplan.cost_models.kernel_pricing import table_seconds
from paraplan.cost_models.kernel_tables import KernelTable
from paraplan.model_specs.model_spec import ModelSpec

HeadsKey = tuple[int, int]
"""(query heads, KV heads) on one attention-TP rank."""
ShardKey = tuple[int, int]
"""(moe_tp, moe_ep) of a routed-expert table."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingKernels:
    """Measured tables of one deployment's kernels on one GPU (any may be absent: that term stays analytical)."""

    dense_gemm: KernelTable | None = None
    """The deployment's GEMMs in its dense quantization (dense MLPs, shared experts), over (m, n, k)."""
    attention_gemm: KernelTable | None = None
    """The attention projections' GEMMs (16-bit where the checkpoint keeps attention unquantized), over (m, n, k)."""
    head_gemm: KernelTable | None = None
    """16-bit GEMMs (output head, router), over (m, n, k)."""
    moe: dict[ShardKey, KernelTable] = field(default_factory=dict)
    """One MoE layer's routed experts for the model's expert shape, by (moe_tp, moe_ep), over tokens entering it."""
    decode_attention: dict[HeadsKey, KernelTable] = field(default_factory=dict)
    """Decode attention for the model's head dim and KV dtype, no window (an MLA model: the MLA kernel of its latent
    shape, keyed (heads, 1)), over (sequences, keys per sequence)."""
    prefill_attention: dict[HeadsKey, KernelTable] = field(default_factory=dict)
    """Causal prefill attention, no cached prefix, over (sequences, new tokens per sequence)."""
    all_reduce: tuple[KernelTable, ...] = ()
    """16-bit all-reduce tables in the engine's order of use (its custom all-reduce, then NCCL), over (buffer bytes,
    group size), inside one NVLink domain."""
    label: str = ""
    """Provenance: GPU, engine, version and which table priced which term."""


Priced = tuple[np.ndarray, np.ndarray]
"""(seconds, covered) per query; seconds NaN where not covered."""


def _none(*columns: Column) -> Priced:
    shape = np.broadcast(*(np.asarray(c, dtype=float) for c in columns)).shape
    return np.full(shape, np.nan), np.zeros(shape, dtype=bool)


def gemm_s(table: KernelTable | None, m: Column, n: Column, k: Column) -> Priced:
    """Seconds of GEMMs (m, n, k) from ``table``."""
    return _none(m, n, k) if table is None else table_seconds(table, m, n, k)


def gemms_s(table: KernelTable | None, m: Column, shapes: list[tuple[Column, Column]]) -> Priced:
    """Seconds of the GEMMs of ``shapes`` ((n, k) each) run one after another on m tokens; covered where all are."""
    total, covered = 0.0 * np.asarray(m, dtype=float), np.ones(np.shape(m), dtype=bool)
    for n, k in shapes:
        seconds, ok = gemm_s(table, m, n, k)
        total, covered = total + seconds, covered & ok
    return np.where(covered, total, np.nan), covered


def keyed_s(tables: dict[tuple[int, int], KernelTable], keys: tuple[Column, Column], *axes: Column) -> Priced:
    """Seconds from the table of each query's key (e.g. its heads per GPU), at its ``axes``; not covered where no
    table has the key (keys are whole numbers; a fractional key matches none)."""
    arrays = np.broadcast_arrays(*(np.asarray(c, dtype=float) for c in (*keys, *axes)))
    key_arrays, axis_arrays = arrays[:len(keys)], arrays[len(keys):]
    seconds, covered = np.full(arrays[0].shape, np.nan), np.zeros(arrays[0].shape, dtype=bool)
    if not tables:
        return seconds, covered
    stacked = np.stack([a.ravel() for a in key_arrays], axis=1)
    for key in np.unique(stacked, axis=0):
        whole = (int(key[0]), int(key[1]))
        table = tables.get(whole)
        if table is None or not np.allclose(key, whole):
            continue
        here = np.all(stacked == key, axis=1).reshape(seconds.shape)
        found, ok = table_seconds(table, *(a[here] for a in axis_arrays))
        seconds[here], covered[here] = found, ok
    return seconds, covered


def attention_projection_s(kernels: ServingKernels, model: ModelSpec, tokens: Column, tp: Column) -> Priced:
    """One layer's attention projections (QKV, then output) on ``tokens``: standard multi-head or grouped-query
    attention only (MLA's low-rank projections and an indexer are not priced from tables)."""
    if model.is_mla or model.indexer_params:
        return _none(tokens, tp)
    tp = np.asarray(tp, dtype=float)
    h = model.hidden_size
    qkv = model.q_width * (1 + model.attention_output_gate) / tp + 2 * model.head_dim * np.maximum(
        model.num_kv_heads / tp, 1.0)
    return gemms_s(kernels.attention_gemm, tokens, [(qkv, h), (h, model.q_width / tp)])


def mlp_s(table: KernelTable | None, model: ModelSpec, tokens: Column, width: float, tp: Column) -> Priced:
    """An MLP of intermediate ``width`` split over tp: gate and up as one GEMM (gated) or up alone, then down."""
    local = width / np.asarray(tp, dtype=float)
    return gemms_s(table, tokens, [((model.mlp_matrices - 1) * local, model.hidden_size),
                                   (model.hidden_size, local)])


def shared_expert_s(kernels: ServingKernels, model: ModelSpec, tokens: Column, tp: Column) -> Priced:
    """One MoE layer's shared expert (dense quantization; none: zero seconds) and its 16-bit router."""
    router, router_ok = gemm_s(kernels.head_gemm, tokens, model.num_experts, model.hidden_size)
    if not model.shared_expert_ffn_size:
        return router, router_ok
    shared, shared_ok = mlp_s(kernels.dense_gemm, model, tokens, model.shared_expert_ffn_size, tp)
    covered = router_ok & shared_ok
    return np.where(covered, router + shared, np.nan), covered


def experts_s(kernels: ServingKernels, moe_tokens: Column, moe_tp: Column, moe_ep: Column) -> Priced:
    """One MoE layer's routed experts on one rank, fed the MoE group's ``moe_tokens``."""
    return keyed_s(kernels.moe, (moe_tp, moe_ep), moe_tokens)


def heads_per_gpu(model: ModelSpec, tp: Column) -> tuple[np.ndarray, np.ndarray]:
    """(query heads, KV heads) one attention-TP rank holds (KV heads replicated once tp exceeds them); under MLA the
    one latent KV head every rank holds whole, as aiconfigurator's MLA tables are keyed."""
    tp = np.asarray(tp, dtype=float)
    if model.is_mla:
        return model.num_heads / tp, np.ones_like(tp)
    return model.num_heads / tp, np.maximum(model.num_kv_heads / tp, 1.0)


def _attention_ok(model: ModelSpec) -> bool:
    """Tables price the full-attention layers of multi-head, grouped-query or multi-head latent attention (whose
    tables ``serving_kernel_source`` picks from MLA rows of the model's latent shape), not a sparse-attention
    indexer's top-k attention."""
    return not model.mixers.index_topk


def _per_batch_s(table: dict[HeadsKey, KernelTable], model: ModelSpec, tp: Column, sequences: Column,
                 per_sequence: Column) -> Priced:
    """A table of whole batches (heads, batch, per-sequence length) at a mean of ``sequences`` sequences: a fractional
    batch (the mean of a round robin) runs at the next whole one's time, scaled back to its share."""
    seqs = np.asarray(sequences, dtype=float)
    whole = np.maximum(np.ceil(seqs - 1e-9), 1.0)
    seconds, covered = keyed_s(table, heads_per_gpu(model, tp), whole, per_sequence)
    return seconds * seqs / whole, covered


def decode_attention_s(kernels: ServingKernels, model: ModelSpec, tp: Column, sequences: Column,
                       keys: Column) -> Priced:
    """One full-attention layer's decode attention over ``sequences`` holding ``keys`` cached keys in all."""
    if not _attention_ok(model):
        return _none(tp, sequences, keys)
    per_sequence = np.asarray(keys, dtype=float) / np.maximum(np.asarray(sequences, dtype=float), 1e-9)
    return _per_batch_s(kernels.decode_attention, model, tp, sequences, per_sequence)


def prefill_attention_s(kernels: ServingKernels, model: ModelSpec, tp: Column, sequences: Column,
                        tokens: Column) -> Priced:
    """One full-attention layer's causal attention over ``tokens`` new tokens of ``sequences`` prompts (each
    tokens/sequences long; a fraction of a prompt, a chunk's share, takes that share of a whole prompt's time)."""
    if not _attention_ok(model):
        return _none(tp, sequences, tokens)
    length = np.asarray(tokens, dtype=float) / np.maximum(np.asarray(sequences, dtype=float), 1e-9)
    return _per_batch_s(kernels.prefill_attention, model, tp, sequences, length)


def all_reduce_s(kernels: ServingKernels, size_bytes: Column, group: Column) -> Priced:
    """A 16-bit all-reduce of ``size_bytes`` over ``group`` GPUs of one NVLink domain: the first table (in the
    engine's order) that covers it; a group of one runs none (not covered: the roofline's zero stands)."""
    group = np.asarray(group, dtype=float)
    seconds, covered = _none(size_bytes, group)
    for table in kernels.all_reduce:
        found, ok = table_seconds(table, size_bytes, group)
        take = ok & ~covered
        seconds, covered = np.where(take, found, seconds), covered | take
    solo = group <= 1
    return np.where(solo, np.nan, seconds), covered & ~solo
