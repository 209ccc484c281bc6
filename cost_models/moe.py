"""Time and memory of one Mixture-of-Experts MLP block for one micro-batch on one GPU.

Token flow (Megatron-core's all-to-all dispatcher; MoE with tp > 1 requires sequence parallel, so
each rank routes its T/tp tokens, T = mbs·s/cp):
  router GEMM [T/tp, E, h] and top-k → permute (copy each token k times, grouped by expert) →
  all-to-all over the ep group (dispatch) → all-gather over etp → grouped expert GEMMs over the
  E/ep local experts, [n_e, g·f_e/etp, h] and [n_e, h, f_e/etp] each, rows padded to the tile → reduce-scatter
  over etp → all-to-all back (combine) → unpermute (weighted sum of the k copies).
  The shared expert is a dense, tensor-parallel MLP on all T tokens of the TP group.
Backward runs the router and shared-expert GEMMs twice, the experts' input- and weight-gradient grouped
GEMMs at their own shapes, and both all-to-alls once more. With a balanced router each rank
receives k·T/tp token copies; the busiest rank sets the pace (``expert_imbalance``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.arrays import Column, IntColumn
from paraplan.choices import Precision
from paraplan.cost_models.collectives import (
    all_to_all_time_s,
    collective_time_s,
    deduplicated_dispatch_time_s,
    members_per_domain,
)
from paraplan.cost_models.compute import ComputeRates, gemm_time_s, memory_bound_time_s
from paraplan.cost_models.moe_eager import eager_clamp_saved_bytes_per_copy, eager_expert_ops_s
from paraplan.cost_models.moe_torch_native import eager_dispatch_s
from paraplan.cost_models.table import ConfigTable, Workload
from paraplan.hardware_profiles import ClusterSpec
from paraplan.model_specs.model_spec import ModelSpec

HIDDEN_BYTES = 2.0  # tokens travel and are permuted in 16-bit (Megatron's all-to-all dispatcher)
ROUTER_PROB_BYTES = 4.0  # router logits, softmax and top-k run in fp32 (Megatron moe_router_dtype)
DISPATCHERS = ("alltoall", "deepep")
"""How routed tokens reach their experts: ``alltoall`` sends each of a token's k copies to its expert's GPU
(Megatron's all-to-all dispatcher); ``deepep`` sends a token once per destination NVLink domain and fans it
out there (DeepEP's normal kernels, Megatron's flex dispatcher)."""
FP8_DISPATCH_BYTES = 1.0 + 4.0 / 128
"""DeepEP's fp8 dispatch: an e4m3 byte per element plus one fp32 scale per 128-element block (the
DeepSeek-V3 report, section 3.3: dispatch in fp8, combine in bf16)."""
# Element-wise MoE kernels per forward: router softmax + top-k, permute, unpermute, activation,
# and the probability scaling of expert outputs.
MOE_ELEMENTWISE_KERNELS = 5
# Tiles of the grouped expert GEMM. PyTorch's torch._grouped_mm (aten/src/ATen/native/cuda/GroupMM.cu,
# dispatch_bf16_grouped_kernel_on_tile_size) runs CUTLASS's grouped kernel on Hopper with 128x256x64 tiles
# (M x N x K) for groups above 128 rows and 64x128x128 below (and on Blackwell); every one of them executes
# the output in whole 128-wide column blocks and a large group in 128-row tiles. The K step is 128 bytes of
# operand (64 bf16 or 128 fp8 elements: the 128-byte TMA swizzle row those tiles load). Transformer Engine's
# grouped linear (Megatron) launches cuBLAS GEMMs per expert, assumed tiled alike (128-row, 128/256-column
# Hopper tiles; not read from cuBLAS's heuristics). The 64-row tile of small groups is not modelled: a group
# below 128 rows pays for a 128-row tile.
GROUPED_TILE_ROWS = 128
GROUPED_TILE_COLS = 128
GROUPED_TILE_K_BYTES = 128.0


@dataclass(frozen=True, slots=True)
class MoETimes:
    """Seconds of one MoE block per micro-batch on one GPU (arrays over configs)."""

    forward_compute_s: np.ndarray
    backward_compute_s: np.ndarray
    expert_comm_s: np.ndarray
    """Dispatch and combine all-to-alls (and the etp gathers), forward and backward, not overlapped: the sum of
    the four ``*_comm_s`` parts below."""
    gemm_s: np.ndarray
    """The weight-gradient GEMMs of backward (router, experts, shared expert): the part a zero-bubble or
    DualPipe schedule can defer (layer.LayerTimes.weight_grad_s)."""
    mlp_forward_s: np.ndarray
    """The part of ``forward_compute_s`` between dispatch and combine: the routed experts' grouped GEMMs and the
    shared expert (Megatron's ``mlp`` node of a layer's schedule plan); the rest (router, permute) runs with the
    attention node."""
    mlp_input_grad_s: np.ndarray
    """The input-gradient GEMMs of that part (backward)."""
    mlp_weight_grad_s: np.ndarray
    """The weight-gradient GEMMs of that part (backward)."""
    dispatch_forward_comm_s: np.ndarray
    """Forward dispatch (and the etp all-gather after it)."""
    combine_forward_comm_s: np.ndarray
    """Forward combine (and the etp reduce-scatter before it)."""
    dispatch_backward_comm_s: np.ndarray
    """Backward of the dispatch: the input gradients sent back to the tokens' ranks (and an etp reduce-scatter)."""
    combine_backward_comm_s: np.ndarray
    """Backward of the combine: the output gradients sent to the experts (and an etp all-gather)."""


def routed_copies_per_rank(model: ModelSpec, work: Workload, t: ConfigTable) -> np.ndarray:
    """Token copies one GPU's experts process per micro-batch with a balanced router: k·T/tp·etp."""
    tokens = t.mbs * work.seq_len / t.cp
    return model.experts_per_token * tokens / t.tp * t.etp


def expert_imbalance(work: Workload, t: ConfigTable, copies_per_rank: np.ndarray) -> np.ndarray:
    """The busiest EP rank's routed tokens over the mean rank's (≥ 1 when dropless), per config.

    With token dropping padded to capacity, the capacity factor itself. Otherwise (dropless):
    from ingested routing statistics when the job has them (mean over MoE layers of the
    contiguous placement's imbalance); a fixed factor when given (1 for force-balanced
    benchmarks); else a balanced router's sampling noise: each copy picks a rank with
    probability 1/ep, so a rank's count is Binomial(ep·μ, 1/ep) with σ = √(μ(1 − 1/ep)), and the
    largest of ep near-normal counts sits about √(2 ln ep) σ above the mean μ.
    """
    ep = np.asarray(t.ep, dtype=float)
    if work.capacity_factor is not None:
        # Padded to capacity: every expert holds capacity_factor × its balanced share, dropped or padded.
        return np.full(len(t), work.capacity_factor)
    if work.routing is not None:
        values = {int(e): float(work.routing.rank_imbalance(int(e)).mean()) for e in np.unique(t.ep)}
        return np.vectorize(values.__getitem__, otypes=[float])(t.ep)
    if work.expert_imbalance is not None:
        return np.full(len(t), work.expert_imbalance)
    sigma_over_mean = np.sqrt((1.0 - 1.0 / ep) / np.maximum(copies_per_rank / t.etp, 1.0))
    return 1.0 + np.sqrt(2.0 * np.log(ep)) * sigma_over_mean


def _padded(dim: Column, tile: Column) -> np.ndarray:
    """``dim`` rounded up to a whole number of tiles: what a tiled kernel executes along it."""
    return np.ceil(np.asarray(dim, dtype=float) / tile) * tile


def grouped_gemm_time_s(rows_per_group: Column, groups: Column, n: Column, k: Column, rates: ComputeRates,
                        measured: bool = True) -> np.ndarray:
    """Seconds of one grouped GEMM: ``groups`` GEMMs [rows_per_group, n, k], each with its own weight, in one launch.
    Where ``rates`` carry a measured grouped-GEMM table that covers the shape (and ``measured``: the layout the table
    timed, tokens as the rows), the table prices it; elsewhere the model below.

    The kernel walks the output tiles of every group as one persistent grid, so it runs like one dense GEMM
    over the stacked rows, except that each group's rows are padded to the row tile (the last tile of a
    group computes its empty rows too) and n and k are executed in whole tiles (a width of 2,880 = 22.5
    tiles of 128 runs 23). Compute: the dense GEMM model (``gemm_time_s``, its shape saturation included)
    of [groups·⌈rows/128⌉·128, ⌈n/128⌉·128, ⌈k/k_tile⌉·k_tile]. Memory: the real bytes, every group's own
    weight [k, n] read once, the rows and their 16-bit outputs once (padding is never loaded).
    """
    rows = np.asarray(groups, dtype=float) * np.asarray(rows_per_group, dtype=float)
    executed_rows = np.asarray(groups, dtype=float) * _padded(rows_per_group, GROUPED_TILE_ROWS)
    k_tile = GROUPED_TILE_K_BYTES / rates.gemm_element_bytes
    compute = gemm_time_s(executed_rows, _padded(n, GROUPED_TILE_COLS), _padded(k, k_tile), rates)
    weights = np.asarray(groups, dtype=float) * np.asarray(k, dtype=float) * n
    memory = (rates.gemm_element_bytes * (rows * k + weights) + HIDDEN_BYTES * rows * n) / rates.memory_bytes_per_s
    modelled = np.maximum(compute, memory + rates.kernel_overhead_s)
    if rates.grouped_gemm_table_fn is None or not measured:
        return modelled
    seconds, covered = rates.grouped_gemm_table_fn(rows_per_group, groups, n, k)
    return np.where(covered, seconds, modelled)


def _grouped_expert_gemms_s(model: ModelSpec, copies: np.ndarray, t: ConfigTable,
                            rates: ComputeRates) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(forward, input-gradient, weight-gradient) seconds of the local experts' up and down projections,
    each pass two grouped GEMMs over the E/ep local experts with m = their share of the rank's routed copies.

    Forward [m, g·f, h] and [m, h, f]; input gradients [m, h, g·f] and [m, f, h]; weight gradients
    [h, g·f, m] and [f, h, m]: there the tokens per expert are the reduction, so few tokens per expert
    make a short main loop (the K saturation of the GEMM curve) where forward and input gradients lose
    only their padded rows. A measured ``torch._grouped_mm`` table (tokens as the rows) prices the forward and
    input-gradient GEMMs it covers; the weight gradients, a reduction over the tokens, it never timed.
    """
    h, f = model.hidden_size, model.expert_ffn_size / t.etp
    up_width = (model.mlp_matrices - 1) * f
    local_experts = model.num_experts / t.ep
    m = copies / local_experts
    forward = grouped_gemm_time_s(m, local_experts, up_width, h, rates) \
        + grouped_gemm_time_s(m, local_experts, h, f, rates)
    input_grad = grouped_gemm_time_s(m, local_experts, h, up_width, rates) \
        + grouped_gemm_time_s(m, local_experts, f, h, rates)
    weight_grad = grouped_gemm_time_s(h, local_experts, up_width, m, rates, measured=False) \
        + grouped_gemm_time_s(f, local_experts, h, m, rates, measured=False)
    return forward, input_grad, weight_grad


def _shared_expert_gemms_s(model: ModelSpec, tokens: Column, tp: IntColumn, rates: ComputeRates) -> np.ndarray:
    """Forward seconds of the shared expert: a dense MLP, tensor-parallel like the attention."""
    if not model.shared_expert_ffn_size:
        return np.zeros_like(np.asarray(tokens, dtype=float))
    h, f = model.hidden_size, model.shared_expert_ffn_size / np.asarray(tp, dtype=float)
    return gemm_time_s(tokens, (model.mlp_matrices - 1) * f, h, rates) + gemm_time_s(tokens, h, f, rates)


def _elementwise_s(model: ModelSpec, routed_tokens: np.ndarray, copies: np.ndarray, t: ConfigTable,
                   precision: Precision, rates: ComputeRates) -> np.ndarray:
    """Forward seconds of router softmax/top-k, permute, unpermute, the expert activation and the
    fp8/fp4 casts of the expert GEMM inputs (read 16-bit, write the narrow copy)."""
    h, f = model.hidden_size, model.expert_ffn_size / t.etp
    router = routed_tokens * model.num_experts * ROUTER_PROB_BYTES * 3  # logits write, softmax read + write
    permute = (routed_tokens + copies) * h * HIDDEN_BYTES * 2  # permute and unpermute: read one side, write other
    activation = copies * model.mlp_matrices * f * HIDDEN_BYTES  # read the g·f up output, write f
    casts = 3.0 * copies * (h + f) if precision in ("fp8", "fp4") else 0.0
    return memory_bound_time_s(router + permute + activation + casts, MOE_ELEMENTWISE_KERNELS, rates)


def expected_remote_domains(model: ModelSpec, ep: IntColumn, stride: IntColumn, cluster: ClusterSpec) -> np.ndarray:
    """Distinct NVLink domains other than its own that one routed token's k experts sit on, on average.

    The ep ranks hold the experts in expert order, so each of the D domains of the group holds E/D
    consecutive experts. Group-limited routing picks ``groups_per_token`` (M) of ``expert_groups`` (G)
    consecutive groups first: aligned with the domains (G a multiple of D, or D of G) that caps the domains
    a token can reach at min(D, M·max(1, D/G)), DeepSeek-V3's node limit; otherwise nothing caps them.
    Over c reachable domains, k experts land on c·(1 - (1 - 1/c)^k) distinct ones (uniform routing), a
    fraction (D - 1)/D of them remote.
    """
    domains = np.asarray(ep, dtype=float) / members_per_domain(ep, stride, cluster)
    reach = domains
    groups, per_token = model.expert_groups, model.groups_per_token
    if groups:
        aligned = (groups % domains == 0) | (domains % groups == 0)
        reach = np.where(aligned, np.minimum(domains, per_token * np.maximum(1.0, domains / groups)), domains)
    distinct = reach * (1.0 - (1.0 - 1.0 / reach) ** model.experts_per_token)
    return distinct * (domains - 1.0) / domains


def fp8_dispatch(work: Workload) -> bool:
    """DeepEP's forward dispatch moves fp8 tokens: the GEMMs run in fp8 or fp4 and the engine quantizes before
    the dispatch (Megatron with Transformer Engine, as the DeepSeek-V3 report does). PyTorch-native stacks
    (torchtitan, NeMo Automodel) dispatch the bf16 hidden states and cast inside the expert GEMM (torchao)."""
    return work.precision in ("fp8", "fp4") and work.kernel_stack == "transformer_engine"


ExpertComm = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""(dispatch forward, combine forward, dispatch backward, combine backward) seconds."""


def _expert_comm_s(model: ModelSpec, work: Workload, routed_tokens: np.ndarray, t: ConfigTable,
                   cluster: ClusterSpec, imbalance: np.ndarray) -> ExpertComm:
    """(dispatch forward, combine forward, dispatch backward, combine backward) seconds: each an all-to-all of the
    k copies of each routed token over ep (members etp apart, Megatron's expert rank order etp-ep-edp-pp), with an
    all-gather (dispatch forward, combine backward) or a reduce-scatter (combine forward, dispatch backward) over
    etp around the expert GEMMs. With the ``deepep`` dispatcher each moves a token once per remote domain, the
    forward dispatch in fp8 where ``fp8_dispatch``."""
    sent = model.experts_per_token * routed_tokens * model.hidden_size * HIDDEN_BYTES
    if work.dispatcher == "deepep":
        remote = expected_remote_domains(model, t.ep, t.etp, cluster)
        dispatch_bytes = FP8_DISPATCH_BYTES if fp8_dispatch(work) else HIDDEN_BYTES
        dispatch, other = (deduplicated_dispatch_time_s(routed_tokens * imbalance, model.hidden_size * size,
                                                        model.experts_per_token, remote, t.ep, t.etp, cluster)
                           for size in (dispatch_bytes, HIDDEN_BYTES))
    else:
        dispatch = other = all_to_all_time_s(sent * imbalance, t.ep, t.etp, cluster)
    etp_gathered = sent * t.etp * imbalance
    gather = collective_time_s("all_gather", etp_gathered, t.etp, 1, cluster)
    scatter = collective_time_s("reduce_scatter", etp_gathered, t.etp, 1, cluster)
    return dispatch + gather, other + scatter, other + scatter, other + gather


def moe_block_times(model: ModelSpec, work: Workload, t: ConfigTable, rates: ComputeRates,
                    cluster: ClusterSpec) -> MoETimes:
    """Itemised time of one MoE block (router to unpermute, shared expert included)."""
    tokens = t.mbs * work.seq_len / t.cp
    routed_tokens = tokens / t.tp
    copies = routed_copies_per_rank(model, work, t)
    imbalance = expert_imbalance(work, t, copies)
    router = gemm_time_s(routed_tokens, model.num_experts, model.hidden_size, rates)
    experts, experts_input_grad, experts_weight_grad = (
        imbalance * times for times in _grouped_expert_gemms_s(model, copies, t, rates))
    shared = _shared_expert_gemms_s(model, tokens, t.tp, rates)
    elementwise = _elementwise_s(model, routed_tokens, copies * imbalance, t, work.precision, rates)
    # The clamp and the down projection's bias outside a fused grouped MLP run between dispatch and combine.
    eager = eager_expert_ops_s(model, copies * imbalance, model.num_experts / np.asarray(t.ep, dtype=float),
                               model.expert_ffn_size / np.asarray(t.etp, dtype=float), work.fused_expert_mlp, rates)
    # torchtitan's eager PyTorch indexing around the experts (moe_torch_native.py).
    indexing = eager_dispatch_s(copies * imbalance, model.hidden_size, work.eager_elementwise, work.dispatcher, rates)
    dense = router + shared  # dense GEMMs: backward runs each twice, as long as forward
    comm = _expert_comm_s(model, work, routed_tokens, t, cluster, imbalance)
    return MoETimes(
        forward_compute_s=dense + experts + elementwise + eager.forward_s + indexing.forward_s,
        backward_compute_s=2.0 * dense + experts_input_grad + experts_weight_grad + 2.0 * elementwise
        + eager.backward_s + indexing.backward_s,
        expert_comm_s=comm[0] + comm[1] + comm[2] + comm[3],
        gemm_s=dense + experts_weight_grad,
        mlp_forward_s=experts + shared + eager.forward_s, mlp_input_grad_s=experts_input_grad + shared
        + eager.backward_s,
        mlp_weight_grad_s=experts_weight_grad + shared,
        dispatch_forward_comm_s=comm[0], combine_forward_comm_s=comm[1], dispatch_backward_comm_s=comm[2],
        combine_backward_comm_s=comm[3],
    )


def eager_clamp_bytes_per_token(model: ModelSpec, tp: IntColumn, fused_expert_mlp: bool) -> np.ndarray:
    """Bytes the eager clamp of a GPT-OSS-style expert GLU keeps per token of the micro-batch, on one GPU: k routed
    copies per token over tp ranks, each etp-gathered with an f_e/etp-wide up projection (so etp cancels)."""
    copies_per_token = model.experts_per_token / np.asarray(tp, dtype=float)
    return copies_per_token * eager_clamp_saved_bytes_per_copy(model, float(model.expert_ffn_size), fused_expert_mlp)


def moe_activation_bytes_per_token(model: ModelSpec, tp: IntColumn, etp: IntColumn,
                                   gemm_input_bytes: float, fused_expert_mlp: bool = False) -> np.ndarray:
    """Bytes one MoE block stores per token of the micro-batch for its backward, on one GPU.

    Per routed copy (k per token, T/tp tokens routed per rank, etp-gathered): the permuted
    input saved for the up projection's weight gradient, the up output (activation input,
    g·f_e/etp wide), the activation output saved for the down projection, and the expert output
    kept for the routing-probability gradient; outside a fused grouped MLP, a clamped GLU (GPT-OSS) keeps a
    second copy of the up output (moe_eager.CLAMP_SAVED_BYTES). Per routed token: fp32 router probabilities.
    The shared expert keeps what a dense TP-sharded MLP keeps (its input is the block input,
    counted with the layer).
    """
    h, k = model.hidden_size, model.experts_per_token
    tp = np.asarray(tp, dtype=float)
    etp = np.asarray(etp, dtype=float)
    f = model.expert_ffn_size / etp
    gate = model.mlp_matrices - 1
    per_copy = etp * (gemm_input_bytes * h + HIDDEN_BYTES * gate * f + gemm_input_bytes * f + HIDDEN_BYTES * h)
    routed = (k * per_copy + ROUTER_PROB_BYTES * model.num_experts) / tp \
        + eager_clamp_bytes_per_token(model, tp, fused_expert_mlp)
    shared_f = model.shared_expert_ffn_size / tp
    shared = HIDDEN_BYTES * gate * shared_f + gemm_input_bytes * shared_f
    return routed + shared
