"""Time of one decoder layer for one micro-batch on one GPU, itemised, vectorized over configs.

Op inventory per layer (forward), on the tokens one GPU holds, T = mbs · s / cp:
  GEMMs: QKV [T, (q + 2kv)/tp, h], output [T, h, q/tp], MLP up [T, g·f/tp, h], down [T, h, f/tp]
  attention core (flash-family kernels execute the causal half of 4·s·q per token; unfused
  attention computes every score, see compute.unfused_attention_time_s), rotary on q and k,
  norms, residual adds and the MLP activation (memory-bound; with sequence parallel the norms
  and adds see T/tp tokens), fp8/fp4 input casts.
Backward runs every GEMM twice (data and weight gradient) and flash attention at 2.5x forward.
Full recompute runs the forward again; where it stops early (PyTorch's non-reentrant checkpoint,
``torch.utils.checkpoint.set_checkpoint_early_stop``, on by default) it ends once the last saved
tensor exists, the down-projection input, so that GEMM and its all-reduce are not repeated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.arrays import Column, IntColumn
from paraplan.choices import PIPELINE_SCHEDULE_CODES, Precision
from paraplan.cost_models.collectives import collective_time_s
from paraplan.cost_models.compute import (
    ComputeRates,
    flash_attention_time_s,
    gemm_time_s,
    memory_bound_time_s,
    unfused_attention_time_s,
)
from paraplan.cost_models.context_parallel import cp_comm_s, cp_comm_variants_s
from paraplan.cost_models.moe import MoETimes, moe_block_times, routed_copies_per_rank
from paraplan.cost_models.moe_eager import eager_expert_ops_s
from paraplan.cost_models.table import ConfigTable, Workload
from paraplan.hardware_profiles import ClusterSpec
from paraplan.model_specs.model_spec import ModelSpec

ACTIVATION_BYTES = 2.0  # activations and their gradients are 16-bit in every recipe modelled
# Share of the SMs that expert all-to-all kernels occupy while they overlap compute: DeepSeek-V3
# (arXiv 2412.19437, section 3.2.2) dedicates 20 of the H800's 132 SMs to dispatch and combine.
COMM_SM_FRAC = 20.0 / 132.0
# SMs a pipelined GEMM -> reduce-scatter overlap holds for its reduction: Megatron-Bridge's userbuffers configs
# for H100 (megatron/bridge/training/comm_overlap.py) give the two reduce-scatter pipelines of a layer 16 and 24
# of the 132 SMs (PipelineOverlapCfg num_sm, set_sm_margin=True); 20 of 132 between them.
TP_OVERLAP_SM_FRAC = 20.0 / 132.0
# Element-wise kernels per layer forward: 2 norms, 2 residual adds, activation, rotary, bias/cast.
ELEMENTWISE_KERNELS_PER_LAYER = 8
QK_NORM_KERNELS = 2
"""A model with QK-norm (Qwen3, Gemma 3, OLMo 2) runs two more norms a layer, one over the queries and one over the
keys (Megatron's q_layernorm/k_layernorm, torchtitan's Qwen3 q_norm/k_norm: an nn.RMSNorm each)."""


@dataclass(frozen=True, slots=True)
class LayerTimes:
    """Seconds per layer per micro-batch on one GPU (arrays over configs)."""

    forward_compute_s: np.ndarray
    backward_compute_s: np.ndarray
    recompute_s: np.ndarray
    """Extra forward work done again in backward (selective: attention core; full: the layer)."""
    tp_comm_s: np.ndarray
    """Exposed tensor-parallel collectives, forward + backward (+ recomputed forward)."""
    cp_comm_s: np.ndarray
    """Exposed context-parallel traffic (what attention compute does not hide; context_parallel.py)."""
    ep_comm_s: np.ndarray
    """Expert dispatch and combine (all-to-all over ep, gathers over etp), layer mean."""
    weight_grad_s: np.ndarray
    """The part of ``backward_compute_s`` that computes weight gradients: one GEMM per forward GEMM, as long.
    Zero-bubble and DualPipe schedules run it apart from the input gradients (schedules.py)."""
    ep_comm_unpaired_s: np.ndarray
    """``ep_comm_s`` of a step whose forward or backward runs without a partner (the warm-up forwards and the
    cool-down backwards of the combined 1F1B schedule, ``unpaired_microbatches``): all of the expert traffic."""


def _attention_gemms_s(model: ModelSpec, tokens: Column, tp: IntColumn, rates: ComputeRates) -> np.ndarray:
    """Forward seconds of the attention projections. MLA (DeepSeek): the query and KV down
    projections to their latents are replicated across TP; the up projections and the output
    projection are split over heads."""
    h, a = model.hidden_size, model.num_heads
    if not model.is_mla:
        return gemm_time_s(tokens, (model.q_width + 2 * model.kv_width) / tp, h, rates) \
            + gemm_time_s(tokens, h, model.q_width / tp, rates)
    q_heads = a * model.qk_head_dim / tp
    query = (gemm_time_s(tokens, model.q_lora_rank, h, rates) + gemm_time_s(tokens, q_heads, model.q_lora_rank, rates)
             if model.q_lora_rank else gemm_time_s(tokens, q_heads, h, rates))
    kv_down = gemm_time_s(tokens, model.kv_lora_rank + model.qk_rope_head_dim, h, rates)
    kv_up = gemm_time_s(tokens, a * (model.qk_nope_head_dim + model.v_head_dim) / tp, model.kv_lora_rank, rates)
    return query + kv_down + kv_up + gemm_time_s(tokens, h, a * model.v_head_dim / tp, rates)


def _dense_mlp_gemms_s(model: ModelSpec, tokens: Column, tp: IntColumn,
                       rates: ComputeRates) -> tuple[np.ndarray, np.ndarray]:
    """(up + down, down alone) forward seconds of a dense layer's MLP."""
    h, f = model.hidden_size, model.ffn_size
    down = gemm_time_s(tokens, h, f / tp, rates)
    return gemm_time_s(tokens, f * (model.mlp_matrices - 1) / tp, h, rates) + down, down


def _alternate_matmuls_s(model: ModelSpec, tokens: Column, tp: IntColumn, rates: ComputeRates) -> np.ndarray:
    """Forward seconds of the matmuls torchtitan's op-level selective checkpointing reruns in backward: its policy
    saves every aten.mm output but every second one, counted per layer (memory.alternate_matmul_bytes_per_token),
    and the attention kernel's output, so the backward reruns the second, fourth and sixth matmuls of wq, wk, wv,
    wo, w1, w3, w2 (the key and output projections and the up projection w3; w2 where the MLP has two matrices)
    and the memory-bound ops, not the attention core. MLA layers rerun about half their projections (every other
    of a different sequence); MoE layers' experts run grouped matmuls the count does not see, priced as saved as
    the memory model keeps them."""
    h, f = model.hidden_size, model.ffn_size
    dense_frac = model.num_dense_layers / model.num_layers
    second_mlp = gemm_time_s(tokens, f / tp, h, rates) if model.mlp_matrices == 3 else gemm_time_s(tokens, h, f / tp,
                                                                                                      rates)
    if model.is_mla:
        attention = 0.5 * _attention_gemms_s(model, tokens, tp, rates)
    else:
        attention = gemm_time_s(tokens, model.kv_width / tp, h, rates) + gemm_time_s(tokens, h, model.q_width / tp,
                                                                                     rates)
    return attention + dense_frac * second_mlp


def _mla_up_projections_s(model: ModelSpec, tokens: Column, tp: IntColumn, rates: ComputeRates) -> np.ndarray:
    """Forward seconds of MLA's query and key/value up projections (latents to per-head Q, K, V)."""
    if not model.is_mla:
        return np.zeros_like(np.asarray(tokens, dtype=float))
    a = model.num_heads
    query = gemm_time_s(tokens, a * model.qk_head_dim / tp, model.q_lora_rank, rates) if model.q_lora_rank else 0.0
    return query + gemm_time_s(tokens, a * (model.qk_nope_head_dim + model.v_head_dim) / tp, model.kv_lora_rank, rates)


def _module_recompute_s(model: ModelSpec, work: Workload, tokens: np.ndarray, t: ConfigTable,
                        rates: ComputeRates) -> np.ndarray:
    """Seconds to rerun the ``modules`` recompute set in backward: the two norms (read the input,
    write the output), MLA's up projections and the routed experts' activation function."""
    h = model.hidden_size
    norms = memory_bound_time_s(tokens * 2 * 2 * h * ACTIVATION_BYTES / np.where(t.sp == 1, t.tp, 1), 2, rates)
    moe_frac = model.num_moe_layers / model.num_layers
    copies = routed_copies_per_rank(model, work, t)
    act = memory_bound_time_s(moe_frac * copies * model.mlp_matrices * model.expert_ffn_size / t.etp
                              * ACTIVATION_BYTES, 1, rates) if model.is_moe else 0.0
    # Megatron checkpoints the whole bias-activation function, the eager clamp before it included (moe_eager.py).
    clamp = moe_frac * eager_expert_ops_s(model, copies, model.num_experts / np.asarray(t.ep, dtype=float),
                                          model.expert_ffn_size / np.asarray(t.etp, dtype=float),
                                          work.fused_expert_mlp, rates).clamp_forward_s if model.is_moe else 0.0
    return norms + _mla_up_projections_s(model, tokens, t.tp, rates) + act + clamp


def _paired_expert_comm_s(moe: MoETimes, attention_forward_s: np.ndarray, attention_backward_s: np.ndarray,
                          full_recompute: np.ndarray) -> np.ndarray:
    """Seconds one MoE layer adds to a paired step (one micro-batch's forward run with another's backward).

    Megatron's combined 1F1B (``TransformerLayerSchedulePlan.run`` in
    megatron/core/models/common/model_chunk_schedule_plan.py) runs a layer's two passes as three slots of a
    communication stream beside a compute stream,

        comm:    combine_bwd | dispatch_fwd -> dispatch_bwd      | combine_fwd
        compute: attn_fwd    | mlp_bwd -> mlp_bwd_dw -> mlp_fwd  | attn_bwd

    and a slot ends when both streams have: the forward experts wait for their dispatch and the backward dispatch
    for the experts' input gradients. ``attention_*`` is everything of the layer outside the ``mlp`` node (attention,
    norms, router, permute). Full recompute replays the forward's two all-to-alls in backward. While a collective
    runs, its kernels hold COMM_SM_FRAC of the SMs and the compute beside it runs that much slower."""
    replay = np.where(full_recompute, 1.0, 0.0)
    combine_bwd = moe.combine_backward_comm_s + replay * moe.combine_forward_comm_s
    dispatch_bwd = moe.dispatch_backward_comm_s + replay * moe.dispatch_forward_comm_s
    dispatch_fwd, combine_fwd = moe.dispatch_forward_comm_s, moe.combine_forward_comm_s
    mlp_bwd, mlp_dw, mlp_fwd = moe.mlp_input_grad_s, moe.mlp_weight_grad_s, moe.mlp_forward_s
    first = np.maximum(combine_bwd, attention_forward_s)
    middle = np.maximum(np.maximum(mlp_bwd + mlp_dw, dispatch_fwd) + mlp_fwd,
                        np.maximum(mlp_bwd, dispatch_fwd) + dispatch_bwd)
    last = np.maximum(combine_fwd, attention_backward_s)
    compute = attention_forward_s + mlp_bwd + mlp_dw + mlp_fwd + attention_backward_s
    comm = combine_bwd + dispatch_fwd + dispatch_bwd + combine_fwd
    exposed = np.maximum(first + middle + last - compute, 0.0)
    return exposed + COMM_SM_FRAC * (comm - np.minimum(exposed, comm))


def _exposed_expert_comm_s(moe: MoETimes, attention_forward_s: np.ndarray, attention_backward_s: np.ndarray,
                           t: ConfigTable) -> np.ndarray:
    """Dispatch/combine of one MoE layer the step waits for: all of it (full recompute replays the forward's two
    all-to-alls), or with the combined 1F1B schedule (``ep_overlap``) what the other micro-batch's compute of the
    same layer does not hide (``_paired_expert_comm_s``). DeepSeek's DualPipe pairs the chunks of two micro-batches
    the same way (schedules.py); torchtitan 0.3's DualPipeV runs them without the hooks that would."""
    paired = _paired_expert_comm_s(moe, attention_forward_s, attention_backward_s, t.recompute == 2)
    return np.where((t.ep_overlap == 1) | (t.pp_schedule == PIPELINE_SCHEDULE_CODES["dualpipe"]), paired,
                    _unpaired_expert_comm_s(moe, t))


def _unpaired_expert_comm_s(moe: MoETimes, t: ConfigTable) -> np.ndarray:
    """The expert traffic of one MoE layer with nothing to pair it with (full recompute replays the forward's)."""
    return moe.expert_comm_s + np.where(t.recompute == 2, moe.dispatch_forward_comm_s + moe.combine_forward_comm_s,
                                        0.0)


def unpaired_microbatches(t: ConfigTable, num_microbatches: Column) -> np.ndarray:
    """Micro-batches of the first pipeline rank whose forward and backward the combined 1F1B schedule (``ep_overlap``)
    runs alone, so their expert all-to-alls are not hidden; 0 without ``ep_overlap``.

    Megatron (megatron/core/pipeline_parallel/combined_1f1b.py): with pp = 1 the first forward runs alone and the
    last backward alone ("Phases 0: 1st microbatch forward ... Phases 4: 4th microbatch backward"). Interleaved
    (schedules.py), rank r runs (pp − r − 1)·2 + (vpp − 1)·pp warm-up forwards, one more with the expert overlap
    ("add one more warmup microbatches for 1f1b overlaping"), and as many cool-down backwards, at most all m·vpp
    chunks. The first rank's are on the step's critical path: its warm-up starts the step and its cool-down ends
    it. In micro-batches: chunks / vpp."""
    pp, vpp = np.asarray(t.pp, dtype=float), np.asarray(t.vpp, dtype=float)
    m = np.asarray(num_microbatches, dtype=float)
    warmup_chunks = np.where(pp == 1, 1.0, np.minimum(2.0 * (pp - 1.0) + (vpp - 1.0) * pp + 1.0, m * vpp))
    return np.where(t.ep_overlap == 1, warmup_chunks / vpp, 0.0)


def _elementwise_bytes_per_token(model: ModelSpec, tp: IntColumn, sp: IntColumn, precision: Precision) -> np.ndarray:
    """HBM bytes moved per token by the memory-bound ops of one layer forward (the MoE block's own
    element-wise kernels are priced in moe.py; a dense MLP's activation counts here, layer mean)."""
    h, q, kv, f = model.hidden_size, model.q_width, model.kv_width, model.ffn_size
    dense_frac = model.num_dense_layers / model.num_layers
    replicated = np.where(sp == 1, tp, 1)
    norms_and_adds = (model.norms_per_layer * 2 + 2 * 3) * h * ACTIVATION_BYTES / replicated  # norm: r+w, add: 2r+w
    activation = dense_frac * (3 if model.gated_mlp else 2) * f * ACTIVATION_BYTES / tp
    rotary = 2 * (q + kv) * ACTIVATION_BYTES / tp if model.position == "rope" else 0.0
    # Low-precision GEMMs cast each input: read 16-bit, write the narrow copy (about 1 byte).
    casts = 3.0 * (2 * h + (q + dense_frac * f) / tp) if precision in ("fp8", "fp4") else 0.0
    return norms_and_adds + activation + rotary + casts + qk_norm_elements(model, tp) * 2 * ACTIVATION_BYTES


def _has_qk_norms(model: ModelSpec) -> bool:
    """The model normalises its queries and keys (MLA's latent norms are not query/key norms)."""
    return model.qk_norm and not model.is_mla


def qk_norm_elements(model: ModelSpec, tp: IntColumn) -> Column:
    """Elements per token one GPU's QK-norms normalise in a layer forward: every query and key element, q + kv
    over tp (a head-wide norm shared by the heads and a full-width one touch the same elements); 0 without them."""
    return (model.q_width + model.kv_width) / np.asarray(tp, dtype=float) if _has_qk_norms(model) else 0.0


def elementwise_kernels_per_layer(model: ModelSpec) -> int:
    """Fused element-wise kernels of one layer forward: ``ELEMENTWISE_KERNELS_PER_LAYER``, plus the QK-norms."""
    return ELEMENTWISE_KERNELS_PER_LAYER + (QK_NORM_KERNELS if _has_qk_norms(model) else 0)


# Eager PyTorch (torchtitan without torch.compile) runs each memory-bound op of its Llama model as the aten
# kernels it is written in, each reading and writing the whole tensor; a fused kernel (priced above) reads the
# input once and writes the output once, 2 B each. Bytes per element of the eager ops, counted from torchtitan's
# models/llama/model.py and models/norms.py at its Dec 2024 benchmark commit (9dec370):
EAGER_NORM_BYTES = 36.0
"""RMSNorm ``self._norm(x.float()).type_as(x) * self.weight``: upcast 2 r + 4 w, pow 4 + 4, mean 4 r,
x * rsqrt 4 + 4, type_as 4 + 2, * weight 2 + 2 (the eps add and rsqrt are per row)."""
EAGER_SWIGLU_BYTES = 10.0
"""Per element of f: ``F.silu(w1(x)) * w3(x)``: silu 2 r + 2 w, multiply 4 r + 2 w."""
EAGER_ROTARY_BYTES = 20.0
"""Per element of q and k: ``view_as_complex(x.float())`` 2 r + 4 w, complex multiply 4 r + 4 w (the
frequencies are small), ``.type_as`` 4 r + 2 w."""
EAGER_COPY_BYTES = 4.0
"""A materialising copy, 2 r + 2 w: ``repeat_kv``'s expand-reshape of K and V to the query width (GQA) and
the attention output's ``.transpose(1, 2).contiguous()``."""
EAGER_EXTRA_KERNELS_PER_LAYER = 19
"""Launches beyond the fused count: two norms of 6 kernels (2 priced), silu and multiply (1), three per
rotary tensor (1), repeat_kv's two copies and the output copy."""
EAGER_EXTRA_KERNELS_PER_NORM = 5
"""An eager RMSNorm's launches beyond its fused one: 6 kernels against 1 (``EAGER_NORM_BYTES``'s ops)."""


def _eager_extra_bytes_per_token(model: ModelSpec, tp: IntColumn, sp: IntColumn) -> Column:
    """HBM bytes the eager ops of one layer forward move beyond the fused kernels ``_elementwise_bytes_per_token``
    prices (dense Llama-style blocks; an MoE block's own kernels are moe.py's)."""
    h, q, kv, f = model.hidden_size, model.q_width, model.kv_width, model.ffn_size
    dense_frac = model.num_dense_layers / model.num_layers
    replicated = np.where(sp == 1, tp, 1)
    fused_norm, fused_act, fused_rotary = 2 * ACTIVATION_BYTES, (3 if model.gated_mlp else 2) * ACTIVATION_BYTES, \
        2 * ACTIVATION_BYTES
    norms = 2 * (EAGER_NORM_BYTES - fused_norm) * h / replicated if model.norm == "rmsnorm" else 0.0
    act = dense_frac * (EAGER_SWIGLU_BYTES - fused_act) * f / tp if model.gated_mlp else 0.0
    rotary = (EAGER_ROTARY_BYTES - fused_rotary) * (q + kv) / tp if model.position == "rope" else 0.0
    copies = EAGER_COPY_BYTES * ((q + kv if q > kv else 0) + q) / tp
    # QK-norms are the same nn.RMSNorm as the residual norms, over q + kv elements instead of h.
    qk_norms = (EAGER_NORM_BYTES - fused_norm) * qk_norm_elements(model, tp) if model.norm == "rmsnorm" else 0.0
    return norms + act + rotary + copies + qk_norms


def eager_extra_kernels_per_layer(model: ModelSpec) -> int:
    """Eager launches of one layer forward beyond the fused count: ``EAGER_EXTRA_KERNELS_PER_LAYER``, and the QK-norms'
    as many more per norm as each residual norm has (``EAGER_EXTRA_KERNELS_PER_NORM``)."""
    qk = QK_NORM_KERNELS * EAGER_EXTRA_KERNELS_PER_NORM if _has_qk_norms(model) and model.norm == "rmsnorm" else 0
    return EAGER_EXTRA_KERNELS_PER_LAYER + qk


def causal_keys_per_query(model: ModelSpec, seq_len: int) -> float:
    """Keys a causal query attends to, averaged over queries and layers: s/2 under full attention;
    w − w²/(2s) in a sliding window of w keys (query i sees min(i + 1, w))."""
    window = min(model.sliding_window, seq_len) if model.sliding_window else seq_len
    windowed = window - window * window / (2.0 * seq_len)
    full_layers = model.num_layers - model.sliding_layers
    return (model.sliding_layers * windowed + full_layers * seq_len / 2.0) / model.num_layers


def _tp_comm_s(model: ModelSpec, tokens: np.ndarray, t: ConfigTable, cluster: ClusterSpec,
               recompute_stops_early: bool) -> np.ndarray:
    """Two all-reduces (or all-gather + reduce-scatter pairs with SP) forward, two backward, and
    the recomputed forward's two (one when recompute stops before the down projection)."""
    size = tokens * model.hidden_size * ACTIVATION_BYTES
    per_collective = collective_time_s("all_reduce", size, t.tp, 1, cluster)
    # An MoE block without a shared expert has no TP collective: its tokens stay sequence-sharded.
    mlp = (model.num_dense_layers + (model.num_moe_layers if model.shared_expert_ffn_size else 0)) / model.num_layers
    recomputed = np.where(t.recompute == 2, 1.0 if recompute_stops_early else 1.0 + mlp, 0.0)
    return (2.0 * (1.0 + mlp) + recomputed) * per_collective


def _exposed_tp_comm_s(tp_comm_s: np.ndarray, gemm_s: np.ndarray, t: ConfigTable, async_tp: bool) -> np.ndarray:
    """TP communication the step waits for: all of it, or with the collectives pipelined under their GEMMs
    (torch's async TP, or Megatron's --tp-comm-overlap through Transformer Engine's userbuffers: ring-exchanged
    all-gather chunks into the GEMM, the GEMM's output reduce-scattered chunk by chunk) the first of the tp
    chunks each collective is cut into, which nothing precedes to hide it, plus whatever of the rest outlasts
    the layer's GEMMs (forward and both backward passes: 3x the forward GEMM time)."""
    tp = np.asarray(t.tp, dtype=float)
    hidden_part = tp_comm_s * (1.0 - 1.0 / tp)
    hidden = np.minimum(hidden_part, 3.0 * gemm_s)
    # Half the collectives are GEMM -> reduce-scatter pipelines, whose reduction kernels hold SMs the GEMM then
    # lacks (the all-gathers ring-exchange through copy engines): while they overlap, the GEMM runs
    # TP_OVERLAP_SM_FRAC slower.
    contention = TP_OVERLAP_SM_FRAC * 0.5 * hidden
    overlapped = np.where(tp > 1, tp_comm_s / tp + (hidden_part - hidden) + contention, tp_comm_s)
    return np.where(async_tp | (t.tp_overlap == 1), overlapped, tp_comm_s)


def _attention_core_s(model: ModelSpec, work: Workload, tokens: Column, t: ConfigTable,
                      rates: ComputeRates) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of the attention core for ``tokens`` local queries: a measured table where one
    covers the shape (whole sequences on one GPU: no context parallelism, no window, one head dim), else the
    flash rate (or the unfused kernels)."""
    if rates.attention_kernel == "unfused":
        score_elements = tokens * work.seq_len * model.num_heads / t.tp
        return unfused_attention_time_s(score_elements, work.seq_len, model.head_dim, model.dropout, rates)
    keys = causal_keys_per_query(model, work.seq_len)
    forward, backward = flash_attention_time_s(2.0 * tokens * keys * model.num_heads
                                               * (model.qk_head_dim + model.value_head_dim) / t.tp, rates)
    if rates.attention_table_fn is None or model.sliding_window or model.qk_head_dim != model.value_head_dim:
        return forward, backward
    sequences_heads = np.broadcast_to(np.asarray(tokens, dtype=float) / work.seq_len * model.num_heads / t.tp,
                                      np.shape(forward))
    measured_fwd, measured_bwd, covered = rates.attention_table_fn(sequences_heads, work.seq_len, model.qk_head_dim)
    covered = covered & (np.asarray(t.cp) == 1)
    return np.where(covered, measured_fwd, forward), np.where(covered, measured_bwd, backward)


def _cp_comm_s(model: ModelSpec, work: Workload, tokens: np.ndarray, t: ConfigTable, cluster: ClusterSpec,
               attention_fwd_s: np.ndarray, attention_bwd_s: np.ndarray) -> np.ndarray:
    """Exposed context-parallel traffic, forward + backward; recompute that reruns the attention core
    (selective, full) runs its forward communication again."""
    forward, backward = cp_comm_s(model, tokens, t.tp, t.cp, t.cp_comm, cluster, attention_fwd_s, attention_bwd_s,
                                  work.cp_gather_overlaps_local)
    return forward * _attention_forward_runs(t) + backward


def _attention_forward_runs(t: ConfigTable) -> np.ndarray:
    """Times the attention core's forward runs per step: twice when selective or full recompute reruns it."""
    return np.where((t.recompute == 1) | (t.recompute == 2), 2.0, 1.0)


def cp_comm_variants_per_layer_s(model: ModelSpec, work: Workload, t: ConfigTable, rates: ComputeRates,
                                 cluster: ClusterSpec) -> dict[int, np.ndarray]:
    """What ``layer_times(...).cp_comm_s`` would be under each CP variant (CP_COMM_CODES), per row.
    Nothing else in a layer, a stage or the memory depends on the variant, so the fastest one is the
    variant a search wants."""
    tokens = t.mbs * work.seq_len / t.cp
    attention, attention_bwd = _attention_core_s(model, work, tokens, t, rates)
    variants = cp_comm_variants_s(model, tokens, t.tp, t.cp, cluster, attention, attention_bwd,
                                  work.cp_gather_overlaps_local)
    return {code: forward * _attention_forward_runs(t) + backward for code, (forward, backward) in variants.items()}


def layer_times(model: ModelSpec, work: Workload, t: ConfigTable, rates: ComputeRates,
                cluster: ClusterSpec) -> LayerTimes:
    """Itemised time of one layer for one micro-batch (the mean over dense and MoE layers)."""
    tokens = t.mbs * work.seq_len / t.cp
    dense_frac, moe_frac = model.num_dense_layers / model.num_layers, model.num_moe_layers / model.num_layers
    mlp, down_projection = _dense_mlp_gemms_s(model, tokens, t.tp, rates)
    moe = moe_block_times(model, work, t, rates, cluster) if model.is_moe else None
    attention_gemms = _attention_gemms_s(model, tokens, t.tp, rates)
    gemm = attention_gemms + dense_frac * mlp
    attention, attention_bwd = _attention_core_s(model, work, tokens, t, rates)
    elementwise = memory_bound_time_s(
        tokens * _elementwise_bytes_per_token(model, t.tp, t.sp, work.precision), elementwise_kernels_per_layer(model),
        rates,
    )
    if work.eager_elementwise:
        elementwise = elementwise + memory_bound_time_s(tokens * _eager_extra_bytes_per_token(model, t.tp, t.sp),
                                                        eager_extra_kernels_per_layer(model), rates)
    forward = gemm + attention + elementwise + (moe_frac * moe.forward_compute_s if moe else 0.0)
    backward = 2.0 * (gemm + elementwise) + attention_bwd + (moe_frac * moe.backward_compute_s if moe else 0.0)
    # An MoE layer's own passes (the layer mean above also averages in the dense layers' MLPs).
    moe_layer_forward = attention_gemms + attention + elementwise + moe.forward_compute_s if moe else 0.0
    moe_layer_backward = 2.0 * (attention_gemms + elementwise) + attention_bwd + moe.backward_compute_s if moe else 0.0
    full_recompute = forward - (dense_frac * down_projection if work.recompute_stops_early else 0.0)
    selective = attention if work.selective_saves == "attention_core" else \
        _alternate_matmuls_s(model, tokens, t.tp, rates) + elementwise
    recompute = np.select([t.recompute == 2, t.recompute == 1, t.recompute == 3],
                          [full_recompute, selective, _module_recompute_s(model, work, tokens, t, rates)], 0.0)
    return LayerTimes(
        forward_compute_s=forward,
        backward_compute_s=backward,
        recompute_s=recompute,
        tp_comm_s=_exposed_tp_comm_s(_tp_comm_s(model, tokens, t, cluster, work.recompute_stops_early),
                                     gemm, t, work.async_tp),
        cp_comm_s=_cp_comm_s(model, work, tokens, t, cluster, attention, attention_bwd),
        ep_comm_s=moe_frac * _exposed_expert_comm_s(moe, moe_layer_forward - moe.mlp_forward_s,
                                                    moe_layer_backward + recompute - moe.mlp_input_grad_s
                                                    - moe.mlp_weight_grad_s, t)
        if moe else np.zeros(len(t)),
        weight_grad_s=gemm + (moe_frac * moe.gemm_s if moe else 0.0),
        ep_comm_unpaired_s=moe_frac * _unpaired_expert_comm_s(moe, t) if moe else np.zeros(len(t)),
    )
