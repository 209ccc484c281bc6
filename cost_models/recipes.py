"""Bytes per parameter of each model state, per engine precision recipe (data, not branches).

ZeRO stages shard states over data parallel the standard way (Rajbhandari et al. 2020):
stage >= 1 shards the optimizer states, >= 2 the gradients, 3 the weights as well.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.arrays import Column, IntColumn


@dataclass(frozen=True, slots=True, kw_only=True)
class StateRecipe:
    """How one engine stores and communicates model states under mixed precision."""

    name: str
    """Recipe name."""
    weight_bytes: float
    """Bytes per parameter of the weights the forward pass reads."""
    grad_bytes: float
    """Bytes per parameter of the gradient buffer."""
    optimizer_bytes: float
    """Bytes per parameter of master weights plus Adam moments."""
    grad_reduce_bytes: float
    """Bytes per element sent when gradients are reduced across data parallel."""
    param_gather_bytes: float
    """Bytes per element sent when sharded weights are all-gathered."""
    reduce_every_microbatch: bool
    """With sharded gradients (ZeRO >= 2), gradients are reduce-scattered after every micro-batch."""
    weights_sharded_from_zero: int
    """Lowest ZeRO stage at which weights are sharded at rest (FSDP shards them at stage 2 too)."""
    weight_gathers_per_microbatch: dict[int, int]
    """All-gathers of a stage's weights per micro-batch, by ZeRO stage (forward, and backward at 3)."""
    gathers_per_tensor: bool = False
    """Sharded weights are gathered one parameter tensor at a time (else one collective per layer)."""
    gathers_overlap_compute: bool = True
    """Weight gathers are prefetched under compute (else the step waits for each one)."""
    regathers_for_recompute: bool = False
    """Full recompute gathers the weights once more for the recomputed forward."""
    gather_copies_per_rank: bool = False
    """Each all-gather fills a list of one view per rank: PyTorch's ProcessGroupNCCL gathers into a flat
    buffer and then launches one copy per rank into the views."""
    source: str
    """Where the byte counts come from."""

    def sharded_bytes_per_param(self, zero_stage: IntColumn, dp: Column) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(weights, gradients, optimizer) bytes per parameter one GPU holds, each divided by the
        sharding group where the ZeRO stage shards it (numpy-friendly in zero_stage and dp)."""
        zero_stage = np.asarray(zero_stage)
        dp = np.asarray(dp, dtype=float)
        weights = self.weight_bytes / np.where(zero_stage >= self.weights_sharded_from_zero, dp, 1.0)
        grads = self.grad_bytes / np.where(zero_stage >= 2, dp, 1.0)
        optimizer = self.optimizer_bytes / np.where(zero_stage >= 1, dp, 1.0)
        return weights, grads, optimizer

    def state_bytes_per_param(self, zero_stage: IntColumn, dp: Column) -> Column:
        """Bytes per parameter held by one GPU, all states together."""
        return sum(self.sharded_bytes_per_param(zero_stage, dp))


MEGATRON_MIXED = StateRecipe(
    name="megatron-bf16",
    weight_bytes=2.0,
    grad_bytes=4.0,
    optimizer_bytes=12.0,
    grad_reduce_bytes=4.0,
    param_gather_bytes=2.0,
    reduce_every_microbatch=False,
    weights_sharded_from_zero=3,
    weight_gathers_per_microbatch={3: 2},
    source=(
        "Megatron-LM with bf16: bf16 weights (2), fp32 main gradients (4, arguments.py forces fp32 "
        "gradient accumulation and reduction for bf16), fp32 master weights + Adam m and v (12): 18 B/param; "
        "distributed optimizer shards the 12 (6 + 12/dp). Megatron-FSDP shards all three."
    ),
)

MEGATRON_LOW_PRECISION = StateRecipe(
    name="megatron-fp8",
    weight_bytes=2.0,
    grad_bytes=2.0,
    optimizer_bytes=12.0,
    grad_reduce_bytes=2.0,
    param_gather_bytes=1.0,
    reduce_every_microbatch=False,
    weights_sharded_from_zero=3,
    weight_gathers_per_microbatch={3: 2},
    source=(
        "Megatron-Bridge fp8/fp4 performance recipes: fp8 primary weights with fp8_param_gather "
        "(1 byte, plus Transformer Engine's 1-byte transpose cache = 2), bf16 gradient buffers "
        "reduced in bf16 (grad_reduce_in_fp32=False), fp32 master weights + Adam m, v (12)."
    ),
)

DEEPSPEED_MIXED = StateRecipe(
    name="deepspeed-bf16",
    weight_bytes=2.0,
    grad_bytes=2.0,
    optimizer_bytes=12.0,
    grad_reduce_bytes=2.0,
    param_gather_bytes=2.0,
    reduce_every_microbatch=True,
    weights_sharded_from_zero=3,
    weight_gathers_per_microbatch={3: 2},
    gathers_per_tensor=True,
    gathers_overlap_compute=False,
    regathers_for_recompute=True,
    gather_copies_per_rank=True,
    source=(
        "DeepSpeed bf16 as in the ZeRO paper: 2 + 2 + K with K = 12 (fp32 master, m, v); gradients are "
        "reduced in the model dtype; ZeRO-2/3 reduce after every micro-batch's backward. ZeRO-3 as DeepSpeed "
        "implemented it in 2021 (the only DeepSpeed measurements paraplan holds): each sub-module's "
        "parameters are fetched when its hook fires, one all-gather per parameter tensor, again for the "
        "recomputed forward under activation checkpointing; Init._allgather_param passes "
        "torch.distributed.all_gather a list of world-size narrow views of one flat tensor, so "
        "ProcessGroupNCCL::allgather copies the result out once per rank. Narayanan et al. 2021 Table 2 "
        "shows the step waiting for them (time per step grows with the ZeRO-3 group at constant work per GPU)."
    ),
)

FSDP2_MIXED = StateRecipe(
    name="fsdp2-bf16",
    weight_bytes=4.0,
    grad_bytes=4.0,
    optimizer_bytes=8.0,
    grad_reduce_bytes=4.0,
    param_gather_bytes=2.0,
    reduce_every_microbatch=True,
    weights_sharded_from_zero=2,
    weight_gathers_per_microbatch={2: 1, 3: 2},
    source=(
        "torchtitan FSDP2 (and PyTorch FSDP with bf16 param_dtype, fp32 reduce_dtype): sharded fp32 "
        "parameters double as master weights (4), fp32 gradients (4), Adam m and v (8); weights are "
        "all-gathered in bf16, gradients reduce-scattered in fp32 after every micro-batch."
    ),
)

