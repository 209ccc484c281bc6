"""Memory-bound kernels of an expert MLP with biases and a clamped GLU (GPT-OSS) outside a fused grouped MLP.

Megatron-core's ``TEGroupedMLP.forward`` (megatron/core/transformer/moe/experts.py, at the commits Megatron-Bridge
v0.3.0-v0.6.0 pin for the NeMo 26.02-26.08 containers: b0cc270, d728871, d0b3b77, cd4afff) runs two parts of such a
block as eager PyTorch ops when Transformer Engine's op fuser (``use_transformer_engine_op_fuser``, the CuTe DSL
grouped MLP) does not run the block:

- the clamp: ``weighted_bias_quick_geglu_impl`` (megatron/core/fusions/fused_bias_geglu.py) clamps the two halves of
  the up projection's output and concatenates them again before the fused activation kernel
  (``x_glu.clamp(max=limit)``, ``x_linear.clamp(-limit, limit)``, ``torch.cat``);
- the down projection's bias: built with ``skip_bias_add=True``, it is added by ``TEGroupedMLP._apply_bias``,
  ``torch.cat([t + b * p for t, b, p in zip(split(out), biases, split(probs))]).to(out.dtype)``: per local expert
  a bias-times-probability product and an add, promoted to fp32 by the fp32 router probabilities, then one
  concatenation and a cast back to 16-bit.

The up projection's bias runs inside the GEMM (Transformer Engine's GroupedLinear: cuBLAS's bias epilogue, its
gradient fused in the weight-gradient GEMM or ``bgrad_quantize``), so it costs nothing here. Byte counts are per
element of one routed copy's up-projection half (f = expert width / etp) or hidden state (h): 16-bit activations,
fp32 products, reads and writes of whole tensors (each op an HBM round trip).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.arrays import Column
from paraplan.cost_models.compute import ComputeRates, memory_bound_time_s
from paraplan.model_specs.model_spec import ModelSpec

CLAMP_FORWARD_BYTES = 16.0
"""Per element of f: two clamps over f elements each (read 2 B, write 2 B) and the concatenation of the 2f
results (read 2 B, write 2 B per element of 2f)."""
CLAMP_BACKWARD_BYTES = 20.0
"""Per element of f: two clamp backwards (read the gradient and the saved input, write the gradient: 6 B each) and
the concatenation of their gradients into the up output's gradient (8 B as forward)."""
CLAMP_KERNELS = 3
"""Forward: two clamps and a concatenation; backward: two masked gradients and a concatenation."""
CLAMP_SAVED_BYTES = 4.0
"""Per element of f, kept for backward per routed copy beyond what a fused or unclamped activation keeps: the two
clamps save their inputs (``clamp_backward`` reads ``self``), which are views of the up projection's 16-bit output
(2f elements, 2 B), while the activation kernel (``WeightedQuickGeGLUFunction``) saves the concatenation of the
clamped halves (another 2f elements): two copies of the up output where a block without the clamp keeps one. The
clamps' outputs are freed after the concatenation (``cat`` saves no tensor), and the bias path saves only views of
the router probabilities, which the activation keeps already. Megatron's ``moe_act`` recompute checkpoints the whole
activation, clamp included, so it drops this copy too."""
BIAS_FORWARD_BYTES = 28.0
"""Per element of h: ``b * p`` writes fp32 (4 B), ``t + b·p`` reads 2 + 4 B and writes fp32 (4 B), the
concatenation reads and writes fp32 (8 B), the cast reads fp32 and writes 16-bit (6 B)."""
BIAS_BACKWARD_BYTES = 36.0
"""Per element of h: the cast's backward (read 2 B, write fp32 4 B), the add's gradient to the 16-bit output (read 4,
write 2 B), and the product's two gradients, each a materialised fp32 product (read 4, write 4 B) summed (read 4 B):
to the bias over tokens, to the probabilities over h (the concatenation's backward is views)."""
BIAS_FORWARD_KERNELS_PER_EXPERT = 2
"""A product and an add per local expert (plus a concatenation and a cast per block)."""
BIAS_BACKWARD_KERNELS_PER_EXPERT = 5
"""The add's cast, two products and two sums per local expert (plus the cast's backward per block)."""


def eager_clamp_saved_bytes_per_copy(model: ModelSpec, f: Column, fused: bool) -> Column:
    """Bytes the eager clamp keeps for backward per routed copy on top of the activation's own saved input (f: the
    up-projection half, expert width / etp); zero for a fused grouped MLP or a model without a clamped GLU."""
    return CLAMP_SAVED_BYTES * f if model.expert_glu_clamp and not fused else 0.0 * f


@dataclass(frozen=True, slots=True)
class EagerExpertTimes:
    """Seconds of the eager expert-MLP ops of one MoE block per micro-batch on one GPU (arrays over configs)."""

    forward_s: np.ndarray
    backward_s: np.ndarray
    clamp_forward_s: np.ndarray
    """The clamp's forward alone: what recomputing the activation (Megatron's ``moe_act``) runs again."""


def eager_expert_ops_s(model: ModelSpec, copies: np.ndarray, local_experts: np.ndarray, f: np.ndarray,
                       fused: bool, rates: ComputeRates) -> EagerExpertTimes:
    """Forward and backward seconds of the clamp and the down-projection bias for ``copies`` routed token copies on
    one GPU (its ``local_experts`` experts, up-projection half ``f`` wide); zero for a fused grouped MLP or a model
    without expert biases and a clamped GLU."""
    copies = np.asarray(copies, dtype=float)
    clamp = model.expert_glu_clamp and not fused
    bias = model.expert_bias and not fused
    zero = np.zeros_like(copies)
    clamp_fwd = memory_bound_time_s(copies * f * CLAMP_FORWARD_BYTES, CLAMP_KERNELS, rates) if clamp else zero
    clamp_bwd = memory_bound_time_s(copies * f * CLAMP_BACKWARD_BYTES, CLAMP_KERNELS, rates) if clamp else zero
    h = model.hidden_size
    bias_fwd = memory_bound_time_s(copies * h * BIAS_FORWARD_BYTES,
                                   BIAS_FORWARD_KERNELS_PER_EXPERT * local_experts + 2, rates) if bias else zero
    bias_bwd = memory_bound_time_s(copies * h * BIAS_BACKWARD_BYTES,
                                   BIAS_BACKWARD_KERNELS_PER_EXPERT * local_experts + 1, rates) if bias else zero
    return EagerExpertTimes(forward_s=clamp_fwd + bias_fwd, backward_s=clamp_bwd + bias_bwd,
                            clamp_forward_s=clamp_fwd)
