"""Peak memory per GPU on the first and last pipeline stages, itemised in bytes.

Activations follow Korthikanti et al. 2022 (arXiv 2205.05198, section 4.1), generalised to GQA,
gated MLPs, FFN != 4h, optional dropout and fused (flash) attention. Bytes per token per layer:
  replicated across TP unless sequence parallel: norm inputs 2h + 2h, QKV and MLP inputs 2h + 2h,
    dropout masks h + h                                                       -> 10h for GPT
  sharded by TP: Q, K, V 2(q + 2kv), output-projection input 2q, activation input 2·g·f,
    down-projection input 2f                                                  -> 24h for GPT
  without fused attention: scores, softmax, dropout 5·a·s                     -> 5as/h·h
which is the paper's s·b·h·(34 + 5as/h) for GPT-3 shapes. Full recompute keeps only each
layer's input (2h, /tp with SP) plus one layer's working set during its backward. Layers whose
activations are offloaded (pp = 1 only) hold theirs in host memory instead: the GPU peak at the
end of the forward pass counts only the layers that stayed. All-gather context parallelism adds
the whole sequence's K, V and dK, dV of the layer in backward to the transient working set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.cost_models.context_parallel import gathered_kv_bytes
from paraplan.cost_models.layer import ACTIVATION_BYTES
from paraplan.cost_models.model_spec import ModelSpec
from paraplan.cost_models.moe import moe_activation_bytes_per_token
from paraplan.cost_models.stages import StageLayout
from paraplan.cost_models.table import ConfigTable, Workload
from paraplan.hardware_profiles.units import BYTES_PER_GIB

# CUDA context, cuBLAS workspaces and NCCL communicator buffers on each GPU: about 0.5 GiB of
# context plus NCCL's 4 MiB buffers per channel per peer across the TP/DP/PP communicators.
FIXED_RESERVE_BYTES = 2.0 * BYTES_PER_GIB
# The PyTorch caching allocator cannot use every byte it holds: fragmentation margin.
ALLOCATOR_FRAGMENTATION_FRAC = 0.07
LOGITS_BYTES = 4.0  # cross entropy is computed on fp32 logits (Korthikanti: 4·s·b·V/t)


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Bytes on one GPU of the most loaded stage (arrays over configs)."""

    weights_bytes: np.ndarray
    grads_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    activations_bytes: np.ndarray
    logits_bytes: np.ndarray
    transient_bytes: np.ndarray
    """FSDP-gathered weights and gradients, full-recompute working set, all-gather CP's whole-sequence K, V."""
    host_bytes: np.ndarray
    """Offloaded activations held in host memory per GPU (not part of the GPU peak)."""
    reserve_bytes: np.ndarray
    peak_bytes: np.ndarray
    worst_stage: np.ndarray
    """0 = first stage, 1 = last stage."""


def _attention_stored_widths(model: ModelSpec) -> tuple[int, int, int]:
    """(Q, K, V width; output-projection input width; latent width) one layer's attention saves.
    MLA materialises per-head K and V from its latents and also saves the latents (replicated)."""
    if model.is_mla:
        a = model.num_heads
        return a * (2 * model.qk_head_dim + model.v_head_dim), a * model.v_head_dim, \
            model.q_lora_rank + model.kv_lora_rank
    return model.q_width + 2 * model.kv_width, model.q_width, 0


def layer_activation_bytes_per_token(model: ModelSpec, tp, sp, recompute, gemm_input_bytes: float = 2.0, etp=1):
    """Activation bytes one layer stores per token for its backward, on one GPU (mean over dense
    and MoE layers; the MoE block's share is :func:`moe.moe_activation_bytes_per_token`).

    ``gemm_input_bytes``: the copy of each GEMM input saved for the weight gradient is kept in
    the GEMM precision (Transformer Engine saves the fp8 cast: 1 byte).
    """
    h, f = model.hidden_size, model.ffn_size
    qkv, out, latent = _attention_stored_widths(model)
    dense_frac, moe_frac = model.num_dense_layers / model.num_layers, model.num_moe_layers / model.num_layers
    gate = 2 if model.gated_mlp else 1
    seq_shard = np.where(np.asarray(sp) == 1, tp, 1)
    norm_inputs, gemm_inputs = ACTIVATION_BYTES * 2 * h, gemm_input_bytes * (2 * h + latent)
    replicated = norm_inputs + gemm_inputs + (2 * h if model.dropout else 0)
    sharded = ACTIVATION_BYTES * qkv + gemm_input_bytes * out + dense_frac * (ACTIVATION_BYTES * gate + gemm_input_bytes) * f
    moe = moe_frac * moe_activation_bytes_per_token(model, tp, etp, gemm_input_bytes) if model.is_moe else 0.0
    stored = replicated / seq_shard + sharded / np.asarray(tp, dtype=float) + moe
    # The ``modules`` set (layernorm, mla_up_proj, moe_act) keeps the norms' inputs, MLA's latents
    # and the up projections' outputs, and drops what it reruns: the norm outputs (the QKV and MLP
    # GEMM inputs), MLA's per-head Q, K, V, and the routed experts' activation output.
    rerun = gemm_input_bytes * 2 * h / seq_shard + (ACTIVATION_BYTES * qkv / np.asarray(tp, dtype=float)
                                                    if model.is_mla else 0.0)
    if model.is_moe:
        rerun = rerun + moe_frac * model.experts_per_token * gemm_input_bytes * model.expert_ffn_size / tp
    layer_input = ACTIVATION_BYTES * h / seq_shard
    recompute = np.asarray(recompute)
    return np.select([recompute == 2, recompute == 3], [layer_input, stored - rerun], stored)


def attention_scores_bytes_per_token(model: ModelSpec, seq_len: int, tp):
    """Unfused attention keeps the softmax output (2 B per score) and, with attention dropout, its
    1-byte mask and 2-byte output: 5·a·s bytes per token with dropout, 2·a·s without (/tp)."""
    per_score = 5.0 if model.dropout else 2.0
    return per_score * model.num_heads * seq_len / np.asarray(tp, dtype=float)


def expert_data_parallel(t: ConfigTable):
    """Size of the routed experts' data-parallel group: the tp·dp·cp ranks of a pipeline stage
    that hold the same expert shard (Megatron-core's expert_data_parallel_size)."""
    return t.tp * t.dp * t.cp // (t.ep * t.etp)


def _in_flight(pp, vpp, num_microbatches):
    """Micro-batches whose activations the first stage holds at the peak of 1F1B (interleaved: more)."""
    pp = np.asarray(pp, dtype=float)
    vpp = np.asarray(vpp, dtype=float)
    base = np.minimum(pp, num_microbatches)
    return base * np.where(vpp > 1, 1.0 + (pp - 1) / (pp * vpp), 1.0)


def _gemm_input_bytes(precision: str) -> float:
    """fp8 GEMM inputs are saved as 1-byte casts; fp4 recipes also keep 1 byte (MXFP8/NVFP4 TE
    recipes save an fp8 copy for the weight-gradient GEMM, which runs at higher precision)."""
    return 1.0 if precision in ("fp8", "fp4") else ACTIVATION_BYTES


def _scores_bytes(model: ModelSpec, work: Workload, t: ConfigTable, tokens):
    """Score matrices an unfused attention layer keeps for one micro-batch (zero for flash kernels)."""
    if work.attention != "unfused":
        return np.zeros(len(t))
    return tokens * attention_scores_bytes_per_token(model, work.seq_len, t.tp)


def stored_layer_bytes(model: ModelSpec, work: Workload, t: ConfigTable):
    """Activation bytes one layer keeps for its backward, per micro-batch, on one GPU: what an
    offloaded layer copies to the host and back."""
    tokens = t.mbs * work.seq_len / t.cp
    per_layer = tokens * layer_activation_bytes_per_token(model, t.tp, t.sp, t.recompute,
                                                          _gemm_input_bytes(work.precision), t.etp)
    # Unfused attention also stores its score matrices unless recompute redoes the attention core.
    return per_layer + np.where(t.recompute == 0, _scores_bytes(model, work, t, tokens), 0.0)


def memory_breakdown(model: ModelSpec, work: Workload, t: ConfigTable, layout: StageLayout,
                     num_microbatches, per_layer=None) -> MemoryBreakdown:
    """Itemised peak memory of the first and last stage; the larger one is reported.

    ``per_layer``: :func:`stored_layer_bytes`, when the caller has it already.
    """
    recipe = work.recipe
    tokens = t.mbs * work.seq_len / t.cp
    gemm_input_bytes = _gemm_input_bytes(work.precision)
    per_layer = stored_layer_bytes(model, work, t) if per_layer is None else per_layer
    scores = _scores_bytes(model, work, t, tokens)
    seq_shard = np.where(t.sp == 1, t.tp, 1)
    # Offload runs with pp = 1 only, so one micro-batch is in flight and the first stage is the model.
    resident_layers = layout.first_layers - t.offload
    first_acts = (per_layer * resident_layers + tokens * ACTIVATION_BYTES * model.hidden_size / seq_shard) \
        * _in_flight(t.pp, t.vpp, num_microbatches)
    last_acts = per_layer * layout.last_layers  # the last stage holds one micro-batch in 1F1B
    logits = LOGITS_BYTES * tokens * model.vocab_size / t.tp
    # While one layer is recomputed in backward: its whole activations (full) and its scores (both).
    recomputed_layer = tokens * layer_activation_bytes_per_token(model, t.tp, t.sp, np.zeros_like(t.recompute),
                                                                 gemm_input_bytes, t.etp)
    working_set = np.where(t.recompute == 2, recomputed_layer, 0.0) + np.where(np.isin(t.recompute, (1, 2)), scores, 0.0)
    # All-gather CP holds the whole sequence's K, V (and dK, dV) of the layer in backward.
    working_set = working_set + gathered_kv_bytes(model, tokens, t.tp, t.cp, t.cp_comm)
    # States shard over the data-parallel group including context parallel (Megatron's
    # dp-cp group, torchtitan's dp_shard x cp mesh): CP ranks hold the same weights.
    weights_frac, grads_frac, optim_frac = recipe.sharded_bytes_per_param(t.zero, t.dp * t.cp)
    # Routed experts shard over their own data-parallel group, edp = tp·dp·cp / (ep·etp).
    expert_fracs = recipe.sharded_bytes_per_param(t.zero, expert_data_parallel(t))
    # Sharded weights are gathered a layer at a time (the gathered copy, the prefetched next one and
    # its gradient); engines that gather per parameter tensor hold only the largest tensors.
    unit_params = model.largest_layer_tensor_params() if recipe.gathers_per_tensor else model.layer_params()
    gathered = np.where(t.zero >= recipe.weights_sharded_from_zero,
                        unit_params / t.tp * (2 * recipe.param_gather_bytes + recipe.grad_bytes), 0.0)
    # Reshard-after-backward only (FSDP SHARD_GRAD_OP): the whole stage stays gathered in compute.
    stage_gathered = np.where((t.zero == 2) & (recipe.weights_sharded_from_zero == 2), 1.0, 0.0)

    def stage_total(params, expert_params, acts, stage_logits):
        states = params * (weights_frac + grads_frac + optim_frac) + expert_params * sum(expert_fracs)
        transient = gathered + stage_gathered * params * recipe.param_gather_bytes + working_set
        return states + acts + stage_logits + transient

    pp1 = t.pp == 1
    first_total = stage_total(layout.first_params, layout.first_expert_params, first_acts, np.where(pp1, logits, 0.0))
    last_total = stage_total(layout.last_params, layout.last_expert_params, last_acts, logits)
    worst_last = (last_total > first_total) & ~pp1
    params = np.where(worst_last, layout.last_params, layout.first_params)
    experts = np.where(worst_last, layout.last_expert_params, layout.first_expert_params)
    acts = np.where(worst_last, last_acts, first_acts)
    used = np.maximum(first_total, np.where(pp1, 0.0, last_total))
    reserve = FIXED_RESERVE_BYTES + ALLOCATOR_FRAGMENTATION_FRAC * used
    return MemoryBreakdown(
        weights_bytes=params * weights_frac + experts * expert_fracs[0],
        grads_bytes=params * grads_frac + experts * expert_fracs[1],
        optimizer_bytes=params * optim_frac + experts * expert_fracs[2],
        activations_bytes=acts,
        logits_bytes=np.where(worst_last | pp1, logits, 0.0),
        transient_bytes=gathered + stage_gathered * params * recipe.param_gather_bytes + working_set,
        host_bytes=per_layer * t.offload,
        reserve_bytes=reserve,
        peak_bytes=used + reserve,
        worst_stage=worst_last.astype(np.int64),
    )
