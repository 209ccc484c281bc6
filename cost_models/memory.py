"""Peak memory per GPU on the first, the busiest middle and the last pipeline stage, itemised in bytes.

Activations follow Korthikanti et al. 2022 (arXiv 2205.05198, section 4.1), generalised to GQA,
gated MLPs, FFN != 4h, optional dropout and fused (flash) attention. Bytes per token per layer:
  replicated across TP unless sequence parallel: norm inputs 2h + 2h, QKV and MLP inputs 2h + 2h,
    dropout masks h + h                                                       -> 10h for GPT
  sharded by TP: Q, K, V 2(q + 2kv), output-projection input 2q, activation input 2·g·f,
    down-projection input 2f                                                  -> 24h for GPT
    (with QK-norm, the norms' inputs 2(q + kv) more)
  without fused attention: scores, softmax, dropout 5·a·s                     -> 5as/h·h
which is the paper's s·b·h·(34 + 5as/h) for GPT-3 shapes. Full recompute keeps only each
layer's input (2h, /tp with SP) plus one layer's working set during its backward. Layers whose
activations are offloaded (pp = 1 only) hold theirs in host memory instead: the GPU peak at the
end of the forward pass counts only the layers that stayed. All-gather context parallelism adds
the whole sequence's K, V and dK, dV of the layer in backward to the transient working set.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from paraplan.arrays import Column, IntColumn
from paraplan.choices import Precision
from paraplan.cost_models.context_parallel import gathered_kv_bytes
from paraplan.cost_models.device_memory import non_torch_bytes, reserved_bytes
from paraplan.cost_models.layer import ACTIVATION_BYTES, qk_norm_elements
from paraplan.cost_models.moe import eager_clamp_bytes_per_token, moe_activation_bytes_per_token
from paraplan.cost_models.schedules import RankWork, in_flight_microbatches
from paraplan.cost_models.stages import StageLayout
from paraplan.cost_models.table import ConfigTable, Workload
from paraplan.model_specs.model_spec import ModelSpec


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
    allocated_bytes: np.ndarray
    """Live tensors at the peak of the most loaded stage (what max_memory_allocated reports)."""
    first_allocated_bytes: np.ndarray
    """Live tensors at the peak of the first pipeline stage."""
    last_allocated_bytes: np.ndarray
    """Live tensors at the peak of the last pipeline stage (the rank Megatron logs memory from)."""
    first_activations_bytes: np.ndarray
    """Saved activations of the first stage at its peak (Korthikanti et al.'s reported component)."""
    last_activations_bytes: np.ndarray
    """Saved activations of the last stage at its peak."""
    middle_allocated_bytes: np.ndarray
    """Live tensors at the peak of the busiest middle rank (rank 1; 0 where pp < 3)."""
    middle_activations_bytes: np.ndarray
    """Saved activations of the busiest middle rank at its peak (0 where pp < 3)."""
    middle_states_bytes: np.ndarray
    """Weights, gradients and optimizer states of a stage holding only decoder layers."""
    reserved_bytes: np.ndarray
    """What PyTorch's caching allocator holds at the peak (max_memory_reserved)."""
    non_torch_bytes: np.ndarray
    """CUDA context and NCCL buffers, outside PyTorch's allocator."""
    reserve_bytes: np.ndarray
    """Everything beyond the live tensors: allocator cache and fragmentation plus non_torch_bytes."""
    peak_bytes: np.ndarray
    """Device memory in use at the peak: reserved plus non-PyTorch (capped at usable capacity by
    cost_models.estimate where the allocator would have to trim its cache to run)."""
    required_bytes: np.ndarray
    """What must fit in usable capacity for the step to run: the device peak, or less where the caching
    allocator, failing an allocation, releases its cached blocks and retries (PyTorch's
    ``release_cached_blocks``): then the live tensors, non-PyTorch memory, and one largest tensor's worth
    of contiguous space the retry may still not find between live blocks."""
    worst_stage: np.ndarray
    """0 = first stage, 1 = last stage, 2 = the busiest middle rank (rank 1)."""


def _attention_stored_widths(model: ModelSpec) -> tuple[int, int, int]:
    """(Q, K, V width; output-projection input width; latent width) one layer's attention saves.
    MLA materialises per-head K and V from its latents and also saves the latents (replicated)."""
    if model.is_mla:
        a = model.num_heads
        return a * (2 * model.qk_head_dim + model.v_head_dim), a * model.v_head_dim, \
            model.q_lora_rank + model.kv_lora_rank
    return model.q_width + 2 * model.kv_width, model.q_width, 0


def layer_activation_bytes_per_token(model: ModelSpec, tp: IntColumn, sp: IntColumn, recompute: IntColumn,
                                     gemm_input_bytes: float = 2.0, etp: IntColumn = 1,
                                     selective_saves: str = "attention_core",
                                     gathered_gemm_inputs: bool = False, fused_expert_mlp: bool = False) -> np.ndarray:
    """Activation bytes one layer stores per token for its backward, on one GPU (mean over dense
    and MoE layers; the MoE block's share is :func:`moe.moe_activation_bytes_per_token`).

    ``gemm_input_bytes``: the copy of each GEMM input saved for the weight gradient is kept in
    the GEMM precision (Transformer Engine saves the fp8 cast: 1 byte). ``fused_expert_mlp``: the routed experts
    run a fused grouped MLP (TrainingJob.fused_expert_mlp), so a clamped GLU keeps no eager copy.
    """
    h, f = model.hidden_size, model.ffn_size
    qkv, out, latent = _attention_stored_widths(model)
    dense_frac, moe_frac = model.num_dense_layers / model.num_layers, model.num_moe_layers / model.num_layers
    gate = 2 if model.gated_mlp else 1
    seq_shard = np.where(np.asarray(sp) == 1, tp, 1)
    # Each residual-width norm keeps its input (2 pre-norms; Gemma 2/3 and GLM-4 add 2 post-norms; Cohere has 1).
    norm_inputs, gemm_inputs = ACTIVATION_BYTES * model.norms_per_layer * h, gemm_input_bytes * (2 * h + latent)
    replicated = norm_inputs + (0.0 if gathered_gemm_inputs else gemm_inputs) + (2 * h if model.dropout else 0)
    whole_sequence = gemm_inputs if gathered_gemm_inputs else 0.0  # kept all-gathered: never divided by tp
    # A QK-norm keeps its input, the projections' 16-bit Q and K before the norm (the attention core keeps them after
    # the norm and rotary): q + kv more elements a token.
    sharded = ACTIVATION_BYTES * (qkv + qk_norm_elements(model, 1)) + gemm_input_bytes * out \
        + dense_frac * (ACTIVATION_BYTES * gate + gemm_input_bytes) * f
    moe = moe_frac * moe_activation_bytes_per_token(model, tp, etp, gemm_input_bytes, fused_expert_mlp) \
        if model.is_moe else 0.0
    stored = replicated / seq_shard + sharded / np.asarray(tp, dtype=float) + moe + whole_sequence
    # The ``modules`` set (layernorm, mla_up_proj, moe_act) keeps the norms' inputs, MLA's latents
    # and the up projections' outputs, and drops what it reruns: the norm outputs (the QKV and MLP
    # GEMM inputs), MLA's per-head Q, K, V, and the routed experts' activation output.
    rerun = gemm_input_bytes * 2 * h / seq_shard + (ACTIVATION_BYTES * qkv / np.asarray(tp, dtype=float)
                                                    if model.is_mla else 0.0)
    if model.is_moe:
        # moe_act reruns the whole activation, the eager clamp before it included (moe_eager.CLAMP_SAVED_BYTES).
        rerun = rerun + moe_frac * (model.experts_per_token * gemm_input_bytes * model.expert_ffn_size / tp
                                    + eager_clamp_bytes_per_token(model, tp, fused_expert_mlp))
    layer_input = ACTIVATION_BYTES * h / seq_shard
    recompute = np.asarray(recompute)
    selective = stored if selective_saves == "attention_core" else \
        alternate_matmul_bytes_per_token(model, tp, seq_shard) + moe
    return np.select([recompute == 2, recompute == 3, recompute == 1], [layer_input, stored - rerun, selective], stored)


def alternate_matmul_bytes_per_token(model: ModelSpec, tp: IntColumn, seq_shard: IntColumn) -> np.ndarray:
    """What torchtitan's op-level selective checkpointing keeps of a dense layer per token: the layer's
    input (the checkpoint's argument) and the outputs its policy saves. The policy saves every aten.mm
    output except every second one (counted per layer) and the attention kernel's output and
    log-sum-exp, and recomputes the rest. The layer's matmuls run wq, wk, wv, wo, w1, w3, w2, so it
    keeps Q (#1), V (#3), the gate projection w1 (#5) and the down projection w2 (#7, before the TP
    reduce-scatter: full hidden width), all bf16; the log-sum-exp is 4 B per head."""
    tp = np.asarray(tp, dtype=float)
    dense_frac = model.num_dense_layers / model.num_layers  # MoE blocks keep what moe_activation_bytes says
    attention = ACTIVATION_BYTES * (2 * model.q_width + model.kv_width) + 4.0 * model.num_heads
    mlp = dense_frac * ACTIVATION_BYTES * (model.ffn_size / tp + model.hidden_size)
    return ACTIVATION_BYTES * model.hidden_size / seq_shard + attention / tp + mlp


def attention_scores_bytes_per_token(model: ModelSpec, seq_len: int, tp: IntColumn) -> np.ndarray:
    """Unfused attention keeps the softmax output (2 B per score) and, with attention dropout, its
    1-byte mask and 2-byte output: 5·a·s bytes per token with dropout, 2·a·s without (/tp)."""
    per_score = 5.0 if model.dropout else 2.0
    return per_score * model.num_heads * seq_len / np.asarray(tp, dtype=float)


def expert_data_parallel(t: ConfigTable) -> np.ndarray:
    """Size of the routed experts' data-parallel group: the tp·dp·cp ranks of a pipeline stage
    that hold the same expert shard (Megatron-core's expert_data_parallel_size)."""
    return t.tp * t.dp * t.cp // (t.ep * t.etp)


def _gemm_input_bytes(precision: Precision) -> float:
    """fp8 GEMM inputs are saved as 1-byte casts; fp4 recipes also keep 1 byte (MXFP8/NVFP4 TE
    recipes save an fp8 copy for the weight-gradient GEMM, which runs at higher precision)."""
    return 1.0 if precision in ("fp8", "fp4") else ACTIVATION_BYTES


def _scores_bytes(model: ModelSpec, work: Workload, t: ConfigTable, tokens: np.ndarray) -> np.ndarray:
    """Score matrices an unfused attention layer keeps for one micro-batch (zero for flash kernels)."""
    if work.attention != "unfused":
        return np.zeros(len(t))
    return tokens * attention_scores_bytes_per_token(model, work.seq_len, t.tp)


def stored_layer_bytes(model: ModelSpec, work: Workload, t: ConfigTable) -> np.ndarray:
    """Activation bytes one layer keeps for its backward, per micro-batch, on one GPU: what an
    offloaded layer copies to the host and back."""
    tokens = t.mbs * work.seq_len / t.cp
    per_layer = tokens * layer_activation_bytes_per_token(model, t.tp, t.sp, t.recompute,
                                                          _gemm_input_bytes(work.precision), t.etp,
                                                          work.selective_saves, work.saves_gathered_gemm_inputs,
                                                          work.fused_expert_mlp)
    # Unfused attention also stores its score matrices unless recompute redoes the attention core.
    return per_layer + np.where(t.recompute == 0, _scores_bytes(model, work, t, tokens), 0.0)


def _per_row(value: Column, size: tuple[int]) -> np.ndarray:
    """``value`` (a scalar or an array over rows) as its own writable array of ``size``."""
    return np.array(np.broadcast_to(value, size), dtype=float)


@dataclass(frozen=True, slots=True)
class LayerMemory:
    """Bytes per row that the layer's shape alone decides (tp, sp, cp, cp_comm, etp, mbs, recompute): computed once
    per distinct shape by a caller pricing many rows (cost_models.estimate)."""

    per_layer_bytes: np.ndarray
    """:func:`stored_layer_bytes`."""
    embedding_output_bytes: np.ndarray
    loss_bytes: np.ndarray
    """The loss's logits of one micro-batch, on a rank that runs it."""
    working_set_bytes: np.ndarray
    """:func:`_working_set_bytes`."""
    largest_logits_bytes: np.ndarray
    largest_layer_tensor_bytes: np.ndarray


def layer_memory(model: ModelSpec, work: Workload, t: ConfigTable) -> LayerMemory:
    """The :class:`LayerMemory` of every row of ``t``."""
    tokens = t.mbs * work.seq_len / t.cp
    seq_shard = np.where(t.sp == 1, t.tp, 1)
    size = (len(t),)
    return LayerMemory(
        per_layer_bytes=_per_row(stored_layer_bytes(model, work, t), size),
        embedding_output_bytes=_per_row(tokens * ACTIVATION_BYTES * model.hidden_size / seq_shard, size),
        loss_bytes=_per_row(loss_logits_bytes(model, work, tokens, t.tp), size),
        working_set_bytes=_per_row(_working_set_bytes(model, work, t, tokens), size),
        largest_logits_bytes=_per_row(_largest_logits_bytes(model, work, t, tokens), size),
        largest_layer_tensor_bytes=_per_row(_largest_layer_tensor_bytes(model, t, tokens), size))


@dataclass(frozen=True, slots=True)
class StateShares:
    """Bytes per parameter of each model state one GPU holds, and the buffers ZeRO/FSDP gathers, per row: what
    the ZeRO stage and the parallel degrees alone decide (zero, tp, pp, dp, cp, ep, etp)."""

    weights_frac: np.ndarray
    grads_frac: np.ndarray
    optimizer_frac: np.ndarray
    expert_weights_frac: np.ndarray
    expert_grads_frac: np.ndarray
    expert_optimizer_frac: np.ndarray
    gathered_bytes: np.ndarray
    """:func:`_gathered_bytes`."""
    root_gathered_frac: np.ndarray
    """Bytes per embedding/output parameter kept gathered (FSDP2's root)."""
    non_torch_bytes: np.ndarray


def state_shares(model: ModelSpec, work: Workload, t: ConfigTable) -> StateShares:
    """The :class:`StateShares` of every row of ``t``."""
    recipe, size = work.recipe, (len(t),)
    # States shard over the data-parallel group including context parallel (Megatron's
    # dp-cp group, torchtitan's dp_shard x cp mesh): CP ranks hold the same weights.
    dense = recipe.sharded_bytes_per_param(t.zero, t.dp * t.cp)
    # Routed experts shard over their own data-parallel group, edp = tp·dp·cp / (ep·etp).
    experts = recipe.sharded_bytes_per_param(t.zero, expert_data_parallel(t))
    root_gathered = np.where(work.fsdp_root_stays_gathered & (t.zero >= recipe.weights_sharded_from_zero),
                             recipe.param_gather_bytes / t.tp, 0.0)
    return StateShares(weights_frac=_per_row(dense[0], size), grads_frac=_per_row(dense[1], size),
                       optimizer_frac=_per_row(dense[2], size), expert_weights_frac=_per_row(experts[0], size),
                       expert_grads_frac=_per_row(experts[1], size),
                       expert_optimizer_frac=_per_row(experts[2], size),
                       gathered_bytes=_per_row(_gathered_bytes(model, work, t), size),
                       root_gathered_frac=_per_row(root_gathered, size),
                       non_torch_bytes=_per_row(non_torch_bytes(t.tp, t.pp, t.dp, t.cp, t.ep), size))


def memory_breakdown(model: ModelSpec, work: Workload, t: ConfigTable, layout: StageLayout,
                     num_microbatches: Column, per_layer: np.ndarray | None = None, ranks: RankWork | None = None,
                     layer: LayerMemory | None = None, shares: StateShares | None = None) -> MemoryBreakdown:
    """Itemised peak memory of the first and last stage and the busiest middle rank; the largest is reported.

    ``per_layer``: :func:`stored_layer_bytes`, when the caller has it already. ``ranks``: the schedule's
    per-rank work (schedules.rank_work) whose ``layout`` is ``layout``; None = 1F1B's placement. ``layer``
    and ``shares``: :func:`layer_memory` and :func:`state_shares` of ``t``, when the caller has them.
    """
    layer = layer_memory(model, work, t) if layer is None else layer
    shares = state_shares(model, work, t) if shares is None else shares
    per_layer = layer.per_layer_bytes if per_layer is None else per_layer
    grads_held = grads_held_frac(work, t, num_microbatches)
    holdings = rank_holdings(model, work, t, layout, num_microbatches, ranks, shares, grads_held)
    first, last, middle = _stage_peaks(t, num_microbatches, per_layer, layer, holdings)
    rank = _worst_rank(work, t, layer, shares.non_torch_bytes, grads_held, holdings, first, last, middle)
    return _breakdown_at_worst(t, layout, _middle_rank_params(model, t, layout, ranks), layer, shares, grads_held,
                               per_layer, rank, first, last, middle)


def required_and_host_bytes(work: Workload, t: ConfigTable, num_microbatches: Column, layer: LayerMemory,
                            holdings: RankHoldings, non_torch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(``required_bytes``, ``host_bytes``) of :func:`memory_breakdown` of rows whose layer terms are ``layer``,
    whose pipeline ranks hold ``holdings`` (:func:`rank_holdings`) and whose CUDA context and NCCL buffers take
    ``non_torch``: the same numbers without the rest of the breakdown, what a fit decision reads
    (cost_models/screening.py)."""
    grads_held = grads_held_frac(work, t, num_microbatches)
    first, last, middle = _stage_peaks(t, num_microbatches, layer.per_layer_bytes, layer, holdings)
    return (_worst_rank(work, t, layer, non_torch, grads_held, holdings, first, last, middle).required_bytes,
            layer.per_layer_bytes * t.offload)


@dataclass(frozen=True, slots=True)
class RankHolding:
    """What one pipeline rank holds besides activations, logits and the working set, bytes on one GPU per row."""

    states_bytes: np.ndarray
    """Weights, gradients (where they exist at the activation peak) and optimizer states (:func:`_states_bytes`)."""
    step_bytes: np.ndarray
    """Weights, every gradient and optimizer states: what the optimizer step holds."""
    buffers_bytes: np.ndarray
    """Weights gathered a layer at a time, the stage kept gathered and FSDP2's gathered root: the transient bytes
    less the working set."""
    late_grads_bytes: np.ndarray
    """Every gradient of the rank: what gradients created after the activation peak take (:func:`_worst_rank`)."""
    layers: np.ndarray
    """Decoder layers whose activations the rank keeps per micro-batch in flight (StageLayout's)."""


@dataclass(frozen=True, slots=True)
class RankHoldings:
    """What the first, the last and the busiest middle pipeline rank hold besides activations, logits and the
    working set, per row: decided by the stage axes (tp, pp, dp, cp, ep, etp, vpp, pp_schedule, zero), by whether
    gradients exist at the peak (grads_held_frac) and by whether the stage stays gathered
    (_stage_gathered_bytes_per_param), which only an engine that frees gradients or keeps pipelined FSDP stages
    unsharded decides per micro-batch count (:func:`holdings_by_stage`)."""

    first: RankHolding
    last: RankHolding
    middle: RankHolding
    loss_on_first: np.ndarray
    """The first rank runs the output layer and the loss."""
    loss_on_last: np.ndarray | bool
    """The last rank runs them."""


def holdings_by_stage(work: Workload) -> bool:
    """Whether :func:`rank_holdings` reads nothing but the stage axes for ``work``: its engine holds every gradient
    at the activation peak and gathers its stages whatever the micro-batch count."""
    return not (work.frees_grads_between_steps or work.pipeline_fsdp_unsharded)


def rank_holdings(model: ModelSpec, work: Workload, t: ConfigTable, layout: StageLayout, num_microbatches: Column,
                  ranks: RankWork | None, shares: StateShares, grads_held: Column) -> RankHoldings:
    """The :class:`RankHoldings` of the rows of ``t`` (``grads_held``: :func:`grads_held_frac`; ``ranks`` None =
    1F1B's placement)."""
    stage_gathered = _stage_gathered_bytes_per_param(work, t, num_microbatches)
    middle_params, middle_experts = _middle_rank_params(model, t, layout, ranks)
    loss_on_first, loss_on_last = _loss_ranks(t, ranks)

    def holding(params: np.ndarray, expert_params: np.ndarray, root_params: Column, layers: np.ndarray) -> RankHolding:
        return RankHolding(
            states_bytes=_states_bytes(shares, params, expert_params, grads_held),
            step_bytes=_states_bytes(shares, params, expert_params, grads=1.0),
            buffers_bytes=shares.gathered_bytes + stage_gathered * params + shares.root_gathered_frac * root_params,
            late_grads_bytes=params * shares.grads_frac + expert_params * shares.expert_grads_frac, layers=layers)
    first_root = model.embedding_params() + np.where(t.pp == 1, model.output_params(), 0.0)
    return RankHoldings(
        first=holding(layout.first_params, layout.first_expert_params, first_root, layout.first_layers),
        last=holding(layout.last_params, layout.last_expert_params, model.output_params(), layout.last_layers),
        middle=holding(middle_params, middle_experts, 0.0, layout.middle_layers), loss_on_first=loss_on_first,
        loss_on_last=loss_on_last)


@dataclass(frozen=True, slots=True)
class StagePeak:
    """One pipeline rank at the peak of its activations, per row, on one GPU."""

    activations_bytes: np.ndarray
    """Saved activations of the micro-batches in flight (:func:`_activation_bytes`)."""
    transient_bytes: np.ndarray
    """Gathered weights and working set (RankHolding.buffers_bytes and LayerMemory.working_set_bytes)."""
    runs_loss: np.ndarray | bool
    """The rank runs the output layer and the loss, so it also holds the logits."""
    allocated_bytes: np.ndarray
    """Live tensors at the peak: model states, activations, transient buffers and the logits where it runs the
    loss (the last rank: the first rank's where pp = 1; the middle rank: 0 where pp < 3)."""


def _stage_peaks(t: ConfigTable, num_microbatches: Column, per_layer: np.ndarray, layer: LayerMemory,
                 holdings: RankHoldings) -> tuple[StagePeak, StagePeak, StagePeak]:
    """The :class:`StagePeak` of the first rank, the last rank and the busiest middle rank."""
    first_acts, last_acts, middle_acts = _activation_bytes(t, holdings, per_layer, layer.embedding_output_bytes,
                                                           num_microbatches)
    loss = layer.loss_bytes
    first, last, middle = holdings.first, holdings.last, holdings.middle
    first_transient = first.buffers_bytes + layer.working_set_bytes
    last_transient = last.buffers_bytes + layer.working_set_bytes
    middle_transient = middle.buffers_bytes + layer.working_set_bytes
    first_total = first.states_bytes + first_acts + first_transient + np.where(holdings.loss_on_first, loss, 0.0)
    last_total = np.where(t.pp == 1, first_total, last.states_bytes + last_acts + last_transient
                          + np.where(holdings.loss_on_last, loss, 0.0))
    middle_total = np.where(t.pp >= 3, middle.states_bytes + middle_acts + middle_transient, 0.0)
    return (StagePeak(activations_bytes=first_acts, transient_bytes=first_transient,
                      runs_loss=holdings.loss_on_first, allocated_bytes=first_total),
            StagePeak(activations_bytes=last_acts, transient_bytes=last_transient, runs_loss=holdings.loss_on_last,
                      allocated_bytes=last_total),
            StagePeak(activations_bytes=middle_acts, transient_bytes=middle_transient, runs_loss=False,
                      allocated_bytes=middle_total))


def _activation_bytes(t: ConfigTable, holdings: RankHoldings, per_layer: np.ndarray,
                      embedding_output_bytes: np.ndarray,
                      num_microbatches: Column) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first, last, busiest middle) rank's saved activations at its peak, bytes on one GPU: the layers' stored
    bytes (``per_layer`` each) times the micro-batches in flight, the first rank's with the embedding output and
    without its offloaded layers. Offload runs with pp = 1 only, so one micro-batch is in flight and the first
    stage is the model."""
    # In floats once for the three ranks (in_flight_chunks_at computes in floats; the integers convert exactly).
    pp, vpp, m = (np.asarray(column, dtype=float) for column in (t.pp, t.vpp, num_microbatches))
    first_in_flight = in_flight_microbatches(t.pp_schedule, pp, m, in_flight_chunks(pp, vpp, m, last_rank=False) / vpp)
    last_in_flight = in_flight_microbatches(t.pp_schedule, pp, m, in_flight_chunks(pp, vpp, m, last_rank=True) / vpp)
    middle_in_flight = in_flight_microbatches(t.pp_schedule, pp, m, in_flight_chunks_at(pp, vpp, m, 1) / vpp)
    first = (per_layer * (holdings.first.layers - t.offload) + embedding_output_bytes) * first_in_flight
    return (first, per_layer * holdings.last.layers * last_in_flight,
            per_layer * holdings.middle.layers * middle_in_flight)


def _loss_ranks(t: ConfigTable, ranks: RankWork | None) -> tuple[np.ndarray, np.ndarray | bool]:
    """(whether the first rank runs the loss, whether the last does): the last under 1F1B; the first under
    DualPipeV; both edges under DualPipe; the one stage where pp = 1."""
    loss_on_first = (t.pp == 1) | (ranks is not None and ranks.output_on_first > 0)
    loss_on_last = ranks.output_on_last > 0 if ranks is not None else True
    return loss_on_first, loss_on_last


def grads_held_frac(work: Workload, t: ConfigTable, num_microbatches: Column) -> np.ndarray:
    """1 where gradients exist at the activation peak, else 0. Gradients freed after every step exist at the
    first micro-batch's activation peak only when an earlier micro-batch's backward has run (accumulation or a
    pipeline schedule)."""
    return np.where(work.frees_grads_between_steps & (num_microbatches <= 1) & (t.pp == 1), 0.0, 1.0)


def _stage_gathered_bytes_per_param(work: Workload, t: ConfigTable, num_microbatches: Column) -> np.ndarray:
    """Bytes per parameter of the stage kept gathered (unsharded) through compute: the gathered weights under
    reshard-after-backward only (FSDP SHARD_GRAD_OP), the gathered weights and the unsharded fp32 gradients
    under pipelined FSDP2; 0 otherwise."""
    recipe = work.recipe
    # Reshard-after-backward only (FSDP SHARD_GRAD_OP): the whole stage stays gathered in compute.
    stage_gathered = np.where((t.zero == 2) & (recipe.weights_sharded_from_zero == 2), recipe.param_gather_bytes, 0.0)
    # Pipelined FSDP2 (torchtitan): after the first micro-batch's backward the stage's weights stay gathered
    # (ZeRO-3 too) and its gradients accumulate unsharded in fp32 (the recipe's gradient bytes).
    pipelined_fsdp = work.pipeline_fsdp_unsharded & (t.pp != 1) & (t.zero >= recipe.weights_sharded_from_zero) \
        & (np.asarray(num_microbatches) > 1)
    return np.where(pipelined_fsdp, recipe.param_gather_bytes + recipe.grad_bytes, stage_gathered)


def _middle_rank_params(model: ModelSpec, t: ConfigTable, layout: StageLayout,
                        ranks: RankWork | None) -> tuple[np.ndarray, np.ndarray]:
    """(parameters outside the routed experts, routed-expert parameters) on one GPU of the busiest middle rank:
    rank 1, which holds the most layers of any middle rank (every engine's split gives extra layers to the first
    chunks) and the most in-flight micro-batches (pp − 1) among them."""
    middle_param_layers = layout.middle_layers if ranks is None else ranks.middle_param_layers
    return (middle_param_layers * model.shared_params_per_layer_mean() / t.tp,
            middle_param_layers * model.routed_params_per_layer_mean() / (t.ep * t.etp))


def _states_bytes(shares: StateShares, params: np.ndarray, expert_params: np.ndarray, grads: Column) -> np.ndarray:
    """Weights, gradients (times ``grads``: 1 held, 0 not yet created) and optimizer states of ``params`` and
    ``expert_params`` parameters, bytes on one GPU."""
    held = shares.weights_frac + grads * shares.grads_frac + shares.optimizer_frac
    return params * held + expert_params * (shares.expert_weights_frac + grads * shares.expert_grads_frac
                                            + shares.expert_optimizer_frac)


def _pick(at_first: np.ndarray, at_last: np.ndarray, first: Column | bool, last: Column | bool,
          middle: Column | bool) -> np.ndarray:
    """Per row, ``first`` where ``at_first``, else ``last`` where ``at_last``, else ``middle`` (np.where, not
    np.choose: the same values, several times faster)."""
    return np.where(at_first, first, np.where(at_last, last, middle))


@dataclass(frozen=True, slots=True)
class _WorstRank:
    """The rank whose live tensors peak highest, per row, and what its peak holds and requires."""

    worst: np.ndarray
    """0 = first stage, 1 = last stage, 2 = the busiest middle rank."""
    at_first: np.ndarray
    at_last: np.ndarray
    activation_peak_bytes: np.ndarray
    """The largest live tensors of the three ranks at their activation peaks."""
    allocated_bytes: np.ndarray
    """Live tensors at the peak: the activation peak, or the optimizer step's where that holds more."""
    reserved_bytes: np.ndarray
    holds_loss: np.ndarray
    required_bytes: np.ndarray
    """MemoryBreakdown.required_bytes."""


def _worst_rank(work: Workload, t: ConfigTable, layer: LayerMemory, non_torch: np.ndarray, grads_held: Column,
                holdings: RankHoldings, first: StagePeak, last: StagePeak, middle: StagePeak) -> _WorstRank:
    """The :class:`_WorstRank` of every row: which rank peaks highest, and its allocator's reserve."""
    # Worst stage: 0 first, 1 last, 2 the busiest middle rank (ties go to the earlier label).
    worst = np.argmax(np.stack([first.allocated_bytes, np.where(t.pp == 1, 0.0, last.allocated_bytes),
                                middle.allocated_bytes]), axis=0)
    at_first, at_last = worst == 0, worst == 1
    activation_peak = np.maximum(np.maximum(first.allocated_bytes, last.allocated_bytes), middle.allocated_bytes)
    # The optimizer step holds every state at once, gradients included, and no activations: it is the
    # peak where gradients are freed between steps and activations are small.
    step_peak = _pick(at_first, at_last, holdings.first.step_bytes, holdings.last.step_bytes,
                      holdings.middle.step_bytes)
    allocated = np.maximum(activation_peak, step_peak)
    # Gradients created after the activation peak find the allocator's cached blocks cut to activation
    # sizes and take new segments: reserved holds them on top of the activation peak's blocks (the H100
    # probe, bench/gpu_memory_probe.py: max_reserved exceeds the fragmented activation peak by about the
    # gradient bytes; torchtitan's 8 -> 128 rank rows fall by 16 B per parameter, not 12).
    late_grads = (1.0 - grads_held) * _pick(at_first, at_last, holdings.first.late_grads_bytes,
                                            holdings.last.late_grads_bytes, holdings.middle.late_grads_bytes)
    reserved = np.maximum(reserved_bytes(activation_peak, work.allocator) + late_grads,
                          reserved_bytes(step_peak, work.allocator))
    holds_loss = _pick(at_first, at_last, first.runs_loss, last.runs_loss, False)
    largest = np.where(holds_loss, layer.largest_logits_bytes, layer.largest_layer_tensor_bytes)
    return _WorstRank(worst=worst, at_first=at_first, at_last=at_last, activation_peak_bytes=activation_peak,
                      allocated_bytes=allocated, reserved_bytes=reserved, holds_loss=holds_loss,
                      required_bytes=np.minimum(reserved + non_torch, allocated + largest + non_torch))


def _breakdown_at_worst(t: ConfigTable, layout: StageLayout, middle_params: tuple[np.ndarray, np.ndarray],
                        layer: LayerMemory, shares: StateShares, grads_held: Column, per_layer: np.ndarray,
                        rank: _WorstRank, first: StagePeak, last: StagePeak, middle: StagePeak) -> MemoryBreakdown:
    """The :class:`MemoryBreakdown` of ``rank``, the rank whose live tensors peak highest (``middle_params``: the
    busiest middle rank's parameters and routed-expert parameters, :func:`_middle_rank_params`)."""
    at_first, at_last = rank.at_first, rank.at_last
    params = _pick(at_first, at_last, layout.first_params, layout.last_params, middle_params[0])
    experts = _pick(at_first, at_last, layout.first_expert_params, layout.last_expert_params, middle_params[1])
    allocated, reserved, outside = rank.allocated_bytes, rank.reserved_bytes, shares.non_torch_bytes
    expert_fracs = shares.expert_weights_frac, shares.expert_grads_frac, shares.expert_optimizer_frac
    return MemoryBreakdown(
        weights_bytes=params * shares.weights_frac + experts * shares.expert_weights_frac,
        grads_bytes=np.where(allocated > rank.activation_peak_bytes, 1.0, grads_held)
        * (params * shares.grads_frac + experts * shares.expert_grads_frac),
        optimizer_bytes=params * shares.optimizer_frac + experts * shares.expert_optimizer_frac,
        activations_bytes=_pick(at_first, at_last, first.activations_bytes, last.activations_bytes,
                                middle.activations_bytes),
        logits_bytes=np.where(rank.holds_loss, layer.loss_bytes, 0.0),
        transient_bytes=_pick(at_first, at_last, first.transient_bytes, last.transient_bytes,
                              middle.transient_bytes),
        host_bytes=per_layer * t.offload,
        allocated_bytes=allocated,
        first_allocated_bytes=first.allocated_bytes,
        last_allocated_bytes=last.allocated_bytes,
        first_activations_bytes=first.activations_bytes,
        last_activations_bytes=np.where(t.pp == 1, first.activations_bytes, last.activations_bytes),
        middle_allocated_bytes=middle.allocated_bytes,
        middle_activations_bytes=np.where(t.pp >= 3, middle.activations_bytes, 0.0),
        middle_states_bytes=middle_params[0] * (shares.weights_frac + shares.grads_frac + shares.optimizer_frac)
        + middle_params[1] * sum(expert_fracs),
        reserved_bytes=reserved,
        non_torch_bytes=outside,
        reserve_bytes=reserved - allocated + outside,
        peak_bytes=reserved + outside,
        required_bytes=rank.required_bytes,
        worst_stage=rank.worst.astype(np.int64),
    )


def in_flight_chunks(pp: IntColumn, vpp: IntColumn, num_microbatches: Column, last_rank: bool) -> np.ndarray:
    """:func:`in_flight_chunks_at` of the first or the last pipeline rank."""
    return in_flight_chunks_at(pp, vpp, num_microbatches, np.asarray(pp) - 1 if last_rank else 0)


def in_flight_chunks_at(pp: IntColumn, vpp: IntColumn, num_microbatches: Column, rank: IntColumn) -> np.ndarray:
    """Model chunks whose activations a pipeline rank holds at its peak. Megatron's interleaved
    schedule runs (pp − r − 1)·2 + (vpp − 1)·pp warm-up forwards on rank r before its first backward,
    so rank r holds that many chunks plus one, at most every chunk of the step (m·vpp); 1F1B holds
    pp − r micro-batches, at most m. On the first rank this is Korthikanti et al.'s
    p·(1 + (p − 1)/(p·v)) micro-batches' worth; the last rank holds one micro-batch without interleaving."""
    pp = np.asarray(pp, dtype=float)
    vpp = np.asarray(vpp, dtype=float)
    m = np.asarray(num_microbatches, dtype=float)
    rank = np.minimum(np.asarray(rank, dtype=float), pp - 1)
    interleaved = np.minimum((pp - rank - 1) * 2 + (vpp - 1) * pp + 1, m * vpp)
    return np.where(vpp > 1, interleaved, np.minimum(pp - rank, m))


def _working_set_bytes(model: ModelSpec, work: Workload, t: ConfigTable, tokens: np.ndarray) -> np.ndarray:
    """Transient activations while one layer is recomputed in backward: its whole activations (full
    recompute) and its score matrices (unfused attention under selective or full); all-gather CP holds the
    whole sequence's K, V (and dK, dV) of the layer in backward."""
    recomputed_layer = tokens * layer_activation_bytes_per_token(model, t.tp, t.sp, np.zeros_like(t.recompute),
                                                                 _gemm_input_bytes(work.precision), t.etp,
                                                                 gathered_gemm_inputs=work.saves_gathered_gemm_inputs,
                                                                 fused_expert_mlp=work.fused_expert_mlp)
    scores = _scores_bytes(model, work, t, tokens)
    working_set = np.where(t.recompute == 2, recomputed_layer, 0.0) \
        + np.where(np.isin(t.recompute, (1, 2)), scores, 0.0)
    return working_set + gathered_kv_bytes(model, tokens, t.tp, t.cp, t.cp_comm)


def loss_logits_bytes(model: ModelSpec, work: Workload, tokens: Column, tp: IntColumn) -> np.ndarray:
    """The logits one micro-batch's losses hold on a rank that runs them: the main loss and each trained MTP module's
    keep their buffers until backward, ``loss_bytes_per_logit`` per logit element of the rank's vocabulary shard."""
    return np.asarray((1 + work.mtp_layers) * work.loss_bytes_per_logit * tokens * model.vocab_size / np.asarray(tp))


def _largest_logits_bytes(model: ModelSpec, work: Workload, t: ConfigTable, tokens: np.ndarray) -> np.ndarray:
    """The largest single tensor of a stage that runs the loss: the logits in fp32 (the loss's upcast copy
    or its gradient), or in bf16 where a fused loss never upcasts them (loss_bytes_per_logit below 4)."""
    return tokens * model.vocab_size / t.tp * np.minimum(4.0, work.loss_bytes_per_logit / 2)


def _largest_layer_tensor_bytes(model: ModelSpec, t: ConfigTable, tokens: np.ndarray) -> np.ndarray:
    """The largest single tensor of a stage without the loss: the MLP's up-projection output in bf16
    (gate and up together for gated MLPs), sharded by TP."""
    return tokens * model.ffn_size * (2 if model.gated_mlp else 1) * ACTIVATION_BYTES / t.tp


def _gathered_bytes(model: ModelSpec, work: Workload, t: ConfigTable) -> np.ndarray:
    """Sharded weights gathered a layer at a time: the gathered copy, the prefetched next one and its
    gradient; engines that gather per parameter tensor hold only the largest tensors."""
    recipe = work.recipe
    unit_params = model.largest_layer_tensor_params() if recipe.gathers_per_tensor else model.layer_params()
    return np.where(t.zero >= recipe.weights_sharded_from_zero,
                    unit_params / t.tp * (2 * recipe.param_gather_bytes + recipe.grad_bytes), 0.0)


def trimmed_to_capacity(memory: MemoryBreakdown, usable_bytes: Column) -> MemoryBreakdown:
    """The breakdown as the device would show it: where the fragmented peak would pass usable capacity
    but what must fit does fit, the allocator trims its cache and holds the capacity instead (the H100
    probe's near-capacity rows report max_reserved within 0.3 GiB of capacity less non-PyTorch memory)."""
    trimmed = (memory.peak_bytes > usable_bytes) & (memory.required_bytes <= usable_bytes)
    reserved = np.where(trimmed, usable_bytes - memory.non_torch_bytes, memory.reserved_bytes)
    return replace(memory, reserved_bytes=reserved, peak_bytes=reserved + memory.non_torch_bytes,
                   reserve_bytes=reserved - memory.allocated_bytes + memory.non_torch_bytes)
