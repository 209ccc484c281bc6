"""Memory-bound kernels of torchtitan's eager MoE block beyond the fused permute and unpermute moe.py prices.

torchtitan 0.2.2 (torchtitan/models/moe/moe.py ``MoE.forward``, moe/utils.py ``_permute``/``_unpermute``; the same
code on the grouped-mm path with and without expert parallelism) moves its routed copies through plain PyTorch
indexing. Per element of a routed copy (one hidden value of one token's copy for one expert; 16-bit unless said):

forward, 32 B:
- ``routed_input = x[token_indices_experts_sorted // top_k]``: a gather, read 2 + write 2;
- ``_permute``: ``torch.vstack((x, zeros))`` copies the routed input (2 + 2), ``x[permuted_indices, :]`` gathers it
  into expert order with the alignment padding (2 + 2);
- ``_unpermute``: ``out_unpermuted[permuted_indices, :] = out``, an index_put (2 + 2);
- the unsort: ``torch.zeros((bs*slen*top_k, dim))`` (write 2) and ``routed_output_unsorted[idx] = routed_output``
  (2 + 2);
- the weighted combine (``score_before_experts=False``: Qwen3, DeepSeek-V3): ``routed_output_unsorted.float()``
  (read 2 + write 4) read again by ``torch.bmm`` with the top-k scores (4).

backward, 42 B: the bmm's gradient with respect to its fp32 input (write 4) and to the scores (read the saved fp32
copy, 4); ``.float()``'s backward cast (read 4 + write 2); the two index_puts' backward gathers (2 + 2 each); the
vstack's slice (2 + 2); and the two gathers' backward, each an accumulating index_put (zeros written 2, read 2 and
write 2 accumulated: 6 each).

moe.py already prices one 16-bit read and write of every routed copy each way (permute and unpermute) forward and
twice that backward; these are what remains: 32 − 4 = 28 B forward and 42 − 8 = 34 B backward per element. Kernels:
7 forward, 9 backward launches per MoE block beyond moe.py's. ``torch.compile`` and DeepEP's fused dispatch replace
these ops, so only torchtitan's eager path pays them (``Workload.eager_elementwise``, dispatcher ``alltoall``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.arrays import Column
from paraplan.cost_models.compute import ComputeRates, memory_bound_time_s

FORWARD_BYTES_PER_COPY_ELEMENT = 32.0
BACKWARD_BYTES_PER_COPY_ELEMENT = 42.0
PRICED_FORWARD_BYTES = 4.0
"""moe._elementwise_s's permute and unpermute: one 16-bit read and write of each copy (backward: twice forward)."""
FORWARD_KERNELS = 7
BACKWARD_KERNELS = 9


@dataclass(frozen=True, slots=True)
class EagerDispatchTimes:
    """Seconds of the eager indexing kernels of one MoE block per micro-batch on one GPU (arrays over configs)."""

    forward_s: np.ndarray
    backward_s: np.ndarray


def eager_dispatch_s(copies: np.ndarray, hidden: int, eager_pytorch: bool, dispatcher: str,
                     rates: ComputeRates) -> EagerDispatchTimes:
    """The eager indexing of ``copies`` routed copies of ``hidden``-wide tokens (the busiest rank's), when the block
    runs torchtitan's eager PyTorch MoE (``eager_pytorch``) with its all-to-all dispatch; zero otherwise."""
    copies = np.asarray(copies, dtype=float)
    if not eager_pytorch or dispatcher != "alltoall":
        zero = np.zeros_like(copies)
        return EagerDispatchTimes(forward_s=zero, backward_s=zero)
    elements: Column = copies * hidden
    forward = memory_bound_time_s(elements * (FORWARD_BYTES_PER_COPY_ELEMENT - PRICED_FORWARD_BYTES),
                                  FORWARD_KERNELS, rates)
    backward = memory_bound_time_s(elements * (BACKWARD_BYTES_PER_COPY_ELEMENT - 2.0 * PRICED_FORWARD_BYTES),
                                   BACKWARD_KERNELS, rates)
    return EagerDispatchTimes(forward_s=np.asarray(forward), backward_s=np.asarray(backward))
