"""A serving pool's worker shape: the one description of identical engine workers that the planner writes into a
serving plan (the ``pools`` entries of ``serve --json``) and the exporters read back to write launch files.

paraplan's sharding fields are engine-neutral: ``tp`` is the attention tensor-parallel degree, ``dp_attention``
the attention data-parallel ranks of one worker, ``moe_tp`` x ``moe_ep`` the split of the MoE layers over the
worker's tp*dp_attention GPUs. Batch and token limits are the worker's totals (all its attention-DP ranks
together), as the plan document states them. Ground floor of the serving planner: nothing here prices anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

PoolRole = Literal["aggregated", "prefill", "decode"]
"""What a pool's workers do: both phases, or one side of a disaggregated deployment."""
POOL_ROLES: tuple[PoolRole, ...] = get_args(PoolRole)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingPool:
    """One pool of identical engine workers."""

    role: PoolRole
    """aggregated, prefill or decode."""
    gpu: str
    """GPU catalog name, e.g. h200-sxm."""
    num_node_gpus: int
    """GPUs per node of this GPU type (the document's ``gpus_per_node``)."""
    num_workers: int
    """Independent engine instances (replicas) of this pool (the document's ``workers``)."""
    tp: int
    """Attention tensor-parallel degree."""
    pp: int
    """Pipeline-parallel degree."""
    dp_attention: int
    """Attention data-parallel ranks per worker."""
    moe_ep: int
    """Expert-parallel degree of the MoE layers."""
    moe_tp: int
    """Tensor-parallel degree of each expert (moe_tp * moe_ep = tp * dp_attention)."""
    max_batch: int
    """Running sequences of one worker, all its attention-DP ranks together (SGLang max_running_requests)."""
    max_batched_tokens: int
    """Tokens of one worker's forward step, all its attention-DP ranks together (SGLang chunked_prefill_size)."""
    memory_frac: float
    """The engine's own memory knob, 0-1 (vLLM gpu_memory_utilization, SGLang mem_fraction_static, TRT-LLM
    free_gpu_memory_fraction)."""
    max_model_len: int
    """Longest request, prompt plus output, in tokens."""
    traffic_frac: float | None = None
    """Fraction of the deployment's requests sent to this pool, 0-1; None when a plan document leaves it out."""

    @property
    def tp_group(self) -> int:
        """GPUs of one pipeline stage: tp * dp_attention (SGLang --tp-size, TRT-LLM tensor_parallel_size)."""
        return self.tp * self.dp_attention

    @property
    def gpus_per_worker(self) -> int:
        """GPUs of one worker: tp * dp_attention * pp."""
        return self.tp_group * self.pp

    @property
    def num_gpus(self) -> int:
        """GPUs of the whole pool."""
        return self.num_workers * self.gpus_per_worker

    @property
    def max_batch_per_rank(self) -> int:
        """Running sequences of one attention-DP rank (vLLM max_num_seqs, TRT-LLM max_batch_size), at least 1:
        the worker's total floor-divided, as SGLang divides it itself."""
        return max(1, self.max_batch // self.dp_attention)

    @property
    def max_batched_tokens_per_rank(self) -> int:
        """Tokens of one attention-DP rank's step (vLLM max_num_batched_tokens, TRT-LLM max_num_tokens), at
        least 1."""
        return max(1, self.max_batched_tokens // self.dp_attention)

    @property
    def nodes_per_worker(self) -> int:
        """Nodes one worker spans (1 when it fits a node)."""
        return max(1, self.gpus_per_worker // self.num_node_gpus)

    @property
    def workers_per_node(self) -> int:
        """Workers sharing one node (1 when a worker spans nodes)."""
        return max(1, self.num_node_gpus // self.gpus_per_worker)

    @property
    def num_nodes(self) -> int:
        """Nodes the pool takes."""
        if self.nodes_per_worker > 1:
            return self.num_workers * self.nodes_per_worker
        return -(-self.num_workers // self.workers_per_node)


def pool_json(pool: ServingPool) -> dict[str, Any]:
    """The pool as a ``pools`` entry of the serving-plan document (serving_plan.schema.json): the key order and
    names every saved plan has (``workers`` for the replica count, ``gpus_per_node`` for the node size)."""
    return {"role": pool.role, "gpu": pool.gpu, "gpus_per_node": pool.num_node_gpus, "workers": pool.num_workers,
            "traffic_frac": pool.traffic_frac, "gpus_per_worker": pool.gpus_per_worker, "tp": pool.tp,
            "pp": pool.pp, "dp_attention": pool.dp_attention, "moe_ep": pool.moe_ep, "moe_tp": pool.moe_tp,
            "max_batch": pool.max_batch, "max_batched_tokens": pool.max_batched_tokens,
            "memory_frac": pool.memory_frac, "max_model_len": pool.max_model_len}
