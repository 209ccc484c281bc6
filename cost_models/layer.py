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

from paraplan.cost_models.collectives import collective_time_s, p2p_time_s
from paraplan.cost_models.compute import (
    ComputeRates,
    flash_attention_time_s,
    gemm_time_s,
    memory_bound_time_s,
    unfused_attention_time_s,
)
from paraplan.cost_models.model_spec import ModelSpec
from paraplan.cost_models.table import ConfigTable, Workload
from paraplan.hardware_profiles import ClusterSpec

ACTIVATION_BYTES = 2.0  # activations and their gradients are 16-bit in every recipe modelled
# Element-wise kernels per layer forward: 2 norms, 2 residual adds, activation, rotary, bias/cast.
ELEMENTWISE_KERNELS_PER_LAYER = 8


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
    """Exposed context-parallel ring traffic (what attention compute does not hide)."""


def _gemm_forward_s(model: ModelSpec, tokens, tp, rates: ComputeRates):
    """(all weight GEMMs, the down projection alone) forward seconds."""
    h, q, kv, f = model.hidden_size, model.q_width, model.kv_width, model.ffn_size
    up_width = f * (model.mlp_matrices - 1)
    down = gemm_time_s(tokens, h, f / tp, rates)
    return (gemm_time_s(tokens, (q + 2 * kv) / tp, h, rates)
            + gemm_time_s(tokens, h, q / tp, rates)
            + gemm_time_s(tokens, up_width / tp, h, rates)
            + down), down


def _elementwise_bytes_per_token(model: ModelSpec, tp, sp, precision: str):
    """HBM bytes moved per token by the memory-bound ops of one layer forward."""
    h, q, kv, f = model.hidden_size, model.q_width, model.kv_width, model.ffn_size
    replicated = np.where(sp == 1, tp, 1)
    norms_and_adds = (2 * 2 + 2 * 3) * h * ACTIVATION_BYTES / replicated  # norm: r+w, add: 2r+w
    activation = (3 if model.gated_mlp else 2) * f * ACTIVATION_BYTES / tp
    rotary = 2 * (q + kv) * ACTIVATION_BYTES / tp if model.position == "rope" else 0.0
    # Low-precision GEMMs cast each input: read 16-bit, write the narrow copy (about 1 byte).
    casts = 3.0 * (2 * h + (q + f) / tp) if precision in ("fp8", "fp4") else 0.0
    return norms_and_adds + activation + rotary + casts


def _tp_comm_s(model: ModelSpec, tokens, t: ConfigTable, cluster: ClusterSpec, recompute_stops_early: bool):
    """Two all-reduces (or all-gather + reduce-scatter pairs with SP) forward, two backward, and
    the recomputed forward's two (one when recompute stops before the down projection)."""
    size = tokens * model.hidden_size * ACTIVATION_BYTES
    per_collective = collective_time_s("all_reduce", size, t.tp, 1, cluster)
    recomputed = np.where(t.recompute == 2, 1.0 if recompute_stops_early else 2.0, 0.0)
    return (4.0 + recomputed) * per_collective


def _attention_core_s(model: ModelSpec, work: Workload, tokens, tp, rates: ComputeRates):
    """(forward, backward) seconds of the attention core for ``tokens`` local queries."""
    if rates.attention_kernel == "unfused":
        score_elements = tokens * work.seq_len * model.num_heads / tp
        return unfused_attention_time_s(score_elements, work.seq_len, model.head_dim, model.dropout, rates)
    return flash_attention_time_s(2.0 * tokens * work.seq_len * model.q_width / tp, rates)  # causal half of 4·s·q


def _cp_comm_s(model: ModelSpec, tokens, t: ConfigTable, cluster: ClusterSpec, attention_fwd_s, attention_bwd_s):
    """Ring attention: cp-1 hops of the local K and V forward, of K, V, dK, dV backward."""
    kv_bytes = 2.0 * tokens * model.kv_width / t.tp * ACTIVATION_BYTES
    hop = p2p_time_s(kv_bytes, t.cp, t.tp, cluster)
    forward = (t.cp - 1) * hop
    backward = 2.0 * forward
    exposed_fwd = np.maximum(forward - attention_fwd_s, 0.0)
    exposed_bwd = np.maximum(backward - attention_bwd_s, 0.0)
    return exposed_fwd + exposed_bwd


def layer_times(model: ModelSpec, work: Workload, t: ConfigTable, rates: ComputeRates,
                cluster: ClusterSpec) -> LayerTimes:
    """Itemised time of one layer for one micro-batch."""
    tokens = t.mbs * work.seq_len / t.cp
    gemm, down_projection = _gemm_forward_s(model, tokens, t.tp, rates)
    attention, attention_bwd = _attention_core_s(model, work, tokens, t.tp, rates)
    elementwise = memory_bound_time_s(
        tokens * _elementwise_bytes_per_token(model, t.tp, t.sp, work.precision), ELEMENTWISE_KERNELS_PER_LAYER,
        rates,
    )
    forward = gemm + attention + elementwise
    backward = 2.0 * gemm + attention_bwd + 2.0 * elementwise
    full_recompute = forward - (down_projection if work.recompute_stops_early else 0.0)
    recompute = np.select([t.recompute == 2, t.recompute == 1], [full_recompute, attention], 0.0)
    return LayerTimes(
        forward_compute_s=forward,
        backward_compute_s=backward,
        recompute_s=recompute,
        tp_comm_s=_tp_comm_s(model, tokens, t, cluster, work.recompute_stops_early),
        cp_comm_s=_cp_comm_s(model, tokens, t, cluster, attention, attention_bwd),
    )
