"""Upper bounds on every size a user controls, each an order of magnitude or more above anything
trained or built to date, so that no real job is refused and no typo (``1e9`` GPUs, ``1e10`` layers)
turns into hours of work or gigabytes of memory. One place, so messages and tests agree.
"""

from __future__ import annotations

MAX_GPUS = 1_048_576
"""GPUs in one job (2^20): the largest clusters built by 2026 hold about 100,000-200,000 GPUs."""
MAX_GPUS_PER_NODE = 1_024
"""GPUs per node or NVLink domain: the largest NVLink domains announced (NVL576) hold 576."""
MAX_SEQ_LEN = 16_777_216
"""Tokens per sequence (2^24): the longest published training contexts are 1-10 million tokens."""
MAX_GLOBAL_BATCH = 134_217_728
"""Sequences per step (2^27): 128 M sequences of even 128 tokens is 16 B tokens a step, 1,000x today's largest."""
MAX_LAYERS = 10_000
"""Decoder layers: the deepest published LLMs have about 200 (Megatron's 1T GPT: 128)."""
MAX_WIDTH = 1_048_576
"""Hidden, FFN, head and vocabulary-independent widths (2^20): the widest published hidden size is 25,600,
the widest FFN 73,728 (GPT-4-class estimates higher, still far below)."""
MAX_HEADS = 65_536
"""Attention heads and KV heads: published models have at most 256."""
MAX_VOCAB = 16_777_216
"""Vocabulary entries (2^24): the largest published vocabularies have about 260,000 (Gemma 3: 262,144)."""
MAX_EXPERTS = 65_536
"""Routed experts per MoE layer: the most published is 384 (Kimi K2)."""
MAX_TOPOLOGY_NODES = 4_096
"""Nodes of a topology (``paraplan place``): rank placement builds (nodes, nodes) bandwidth matrices, 128 MiB at
4,096 nodes (32,768 GPUs of 8-GPU nodes); a larger fabric is planned with a cluster type, not host by host."""
MAX_MOE_LAYERS = 1_024
"""MoE layers in routing statistics: the deepest published MoE models have about 60 (Kimi K2: 60, DeepSeek-V3: 58)."""
MAX_COACTIVATION_CELLS = 1 << 25
"""Cells of a routing co-activation table, (MoE layers - 1) x experts x experts (256 MiB of floats): Kimi K2's
59 x 384 x 384 is 8.7 million."""
MAX_TENSOR_DIM = 1 << 40
"""One tensor dimension in a profiler trace: the largest tensors trained today have about 2^37 elements in all."""
