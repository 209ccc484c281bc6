"""What a GPU's memory holds beyond the live tensors of training, and how much of it a job may use.

Three numbers describe one GPU at its peak, and sources report different ones:
- allocated: the live tensors (``torch.cuda.max_memory_allocated``; Megatron's ``mem-max-allocated-bytes``);
- reserved: what PyTorch's caching allocator holds from the driver (``max_memory_reserved``; torchtitan's
  ``memory:`` log line): the live tensors plus blocks cached for reuse that a request of another size
  cannot use (fragmentation);
- device: reserved plus what lives outside PyTorch's allocator (the CUDA context with its kernel images,
  NCCL's communicator buffers). This is what runs out: the fit decision compares it with usable capacity.
"""

from __future__ import annotations

import numpy as np

from paraplan.arrays import Column, IntColumn
from paraplan.hardware_profiles.units import BYTES_PER_GIB

# The driver keeps part of HBM for itself: PyTorch's out-of-memory messages report "a total capacity of
# 79.15 GiB" on an A100 80GB and 79.11 GiB on an H100 80GB (0.989 of the nominal 80), and 39.39 GiB on an
# A100 40GB (0.985). torchtitan's 96 GB H100 benchmark says its GPUs have 95 GiB (0.99).
DRIVER_VISIBLE_FRAC = 0.987

# Of the driver-visible HBM, the share the fit decision keeps free (0-1): the largest margin paraplan's measured
# runs allow. Each must stay on its side of the rule: the H100 probe's 14 runs and 4 out-of-memory steps
# (data/measured/torchtitan_memory_h100.csv) and the 30 scored runs of memory_runs.csv (7 fit/OOM labels and 23
# runs whose measured peak says they ran); tests/test_memory_margin.py counts them, 48 of 48 right before and after.
# The nearest out-of-memory step is predicted 7.7% over capacity. The nearest run that ran, llama3-3b at 4096 x 4
# with full AC, needs 78.73 of 78.96 GiB as predicted: a margin over 0.29% calls it out of memory; 0.2%, rounded
# down to leave it 0.07 GiB (0.16 GiB of an 80 GB H100). Two measured errors are larger, and the plan table says
# so instead of hiding them in the margin: at the edge the allocator held 0.36-0.60 GiB less than the rule credits
# (77.56-77.80 GiB reserved against 78.96 less the 0.80 GiB predicted outside PyTorch; the probe measured 1.30),
# and live tensors are under-predicted by up to 5.3% (20 rows measuring max_allocated). Neither miscalls a
# measured run, because the runs at the edge had their live tensors over-predicted (the 3B one by 3.8%); a margin
# sized to them would, and would put trimmed plans below the reserved the probe measured. --headroom keeps a
# further share free.
FIT_MARGIN_FRAC = 0.002
# The largest under-prediction of live tensors among the 20 measured rows that report max_allocated (the H100
# probe's 14 runs, Megatron-LM CI's 6): llama3-1b at 8192 x 2 without AC, 63.44 GiB measured against 60.23
# predicted. The plan table cites it beside plans that run at capacity; tests/test_memory_margin.py recomputes it.
MEASURED_LIVE_UNDER_FRAC = 0.053

# CUDA context with lazily loaded kernel images on Hopper/Ampere: about 0.5 GiB per process (nvidia-smi
# shows 0.5-0.6 GiB for a process that only initialised CUDA and cuBLAS).
CUDA_CONTEXT_BYTES = 0.5 * BYTES_PER_GIB
# NCCL allocates per communicator, per channel and per peer connection, buffers of 4 MiB (Simple), 256 KiB
# (LL128 on Hopper: 4.6 MiB) and 128 KiB (LL): with NCCL's default 16-32 channels a ring communicator holds
# 2 peers x ~32 channels x ~4.5 MiB ~ 0.3 GiB. NVLS (NVLink SHARP) and P2P buffers add more on H100.
NCCL_BYTES_PER_COMMUNICATOR = 0.3 * BYTES_PER_GIB

# Caching-allocator overhead on top of the live peak, per engine behaviour. Fitted on the torchtitan rows of
# memory_runs.csv (max_reserved over the predicted allocated peak, median over rows; the leave-one-out
# figure is printed by bench/memory_accuracy.py). Eager PyTorch allocates every elementwise temporary of
# the loss and the norms at its own size, so cached blocks of many sizes pile up; torch.compile fuses them
# into few kernels with few, equal-sized buffers. Fused-kernel stacks (Megatron with Transformer Engine)
# keep paraplan's earlier 7% margin, which no measured reserved figure here can check.
FRAGMENTATION_FRAC = {"eager": 0.13, "compiled": 0.05, "fused_kernels": 0.07}


def driver_visible_bytes(hbm_bytes: Column) -> np.ndarray:
    """HBM the driver lets a process use (bytes): what a serving engine's memory fraction is a fraction of."""
    return np.asarray(hbm_bytes, dtype=float) * DRIVER_VISIBLE_FRAC


def usable_capacity_bytes(hbm_bytes: Column) -> np.ndarray:
    """What a training plan may fill (bytes): driver-visible HBM less ``FIT_MARGIN_FRAC``. The fit decision
    compares the memory a step requires with it (less the job's own headroom), and a plan whose allocator
    would pass it trims its cache there."""
    return driver_visible_bytes(hbm_bytes) * (1.0 - FIT_MARGIN_FRAC)


def non_torch_bytes(tp: IntColumn, pp: IntColumn, dp: IntColumn, cp: IntColumn, ep: IntColumn) -> Column:
    """CUDA context and NCCL buffers: one communicator per parallel axis of size > 1 (the world
    communicator torch.distributed always creates counts as one)."""
    groups = sum(np.where(np.asarray(axis) > 1, 1.0, 0.0) for axis in (tp, pp, dp, cp, ep))
    return CUDA_CONTEXT_BYTES + (1.0 + groups) * NCCL_BYTES_PER_COMMUNICATOR


def reserved_bytes(allocated_bytes: Column, allocator: str) -> np.ndarray:
    """What the caching allocator holds when the live tensors peak at ``allocated_bytes``."""
    return np.asarray(allocated_bytes, dtype=float) * (1.0 + FRAGMENTATION_FRAC[allocator])

