"""The candidate table: one row per parallel configuration, as numpy columns.

The cost model reads this table and never loops over rows, so one code path serves one
configuration (``paraplan evaluate``) and ten million (``paraplan plan``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from paraplan.choices import Precision
from paraplan.cost_models.pipeline_splits import PipelineSplit
from paraplan.cost_models.recipes import StateRecipe
from paraplan.measurements.routing import RoutingStats
from paraplan.model_specs.model_spec import AttentionFlops

if TYPE_CHECKING:
    import numpy.typing as npt  # annotations only: numpy.typing stays out of start-up
    from _typeshed import DataclassInstance


_Record = TypeVar("_Record", bound="DataclassInstance")
"""A frozen dataclass of per-row arrays (an estimate, its breakdowns, the shared cost terms)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigTable:
    """Parallel configurations as equal-length int64 columns (rank order tp-cp-dp-pp; experts etp-ep-edp-pp)."""

    tp: np.ndarray
    """Tensor-parallel degree."""
    pp: np.ndarray
    """Pipeline-parallel degree."""
    dp: np.ndarray
    """Data-parallel degree."""
    cp: np.ndarray
    """Context-parallel degree."""
    cp_comm: np.ndarray
    """How context-parallel attention moves K and V (context_parallel.CP_COMM_CODES: 0 p2p ring,
    1 a2a, 2 allgather, 3 a2a+p2p); 0 when cp = 1."""
    ep: np.ndarray
    """Expert-parallel degree: routed experts are split over ep ranks (1 for dense models)."""
    etp: np.ndarray
    """Expert tensor-parallel degree: each expert's MLP is split over etp ranks (divides tp)."""
    vpp: np.ndarray
    """Virtual pipeline stages per pipeline rank (1 = plain 1F1B)."""
    mbs: np.ndarray
    """Micro-batch size, sequences."""
    zero: np.ndarray
    """ZeRO stage 0-3 (1 = distributed optimizer in Megatron; 3 = FSDP)."""
    recompute: np.ndarray
    """Activation recomputation: 0 none, 1 selective, 2 full."""
    sp: np.ndarray
    """Sequence parallelism with TP: 1 on, 0 off."""
    ep_overlap: np.ndarray
    """Expert all-to-alls run under the compute of another micro-batch (Megatron-core's combined 1F1B,
    --overlap-moe-expert-parallel-comm): 1 on, 0 off."""
    offload: np.ndarray
    """Transformer layers whose saved activations are copied to host memory in forward and
    prefetched back in backward (Megatron-core ``cpu_offloading_num_layers``); 0 = none."""
    pp_schedule: np.ndarray
    """Pipeline schedule (PIPELINE_SCHEDULE_CODES): 0 1F1B / interleaved, 1 DualPipeV, 2 DualPipe."""
    tp_overlap: np.ndarray
    """TP collectives pipelined under the GEMMs they feed (Megatron --tp-comm-overlap, Transformer Engine's
    userbuffers): 1 on, 0 off."""

    def __post_init__(self) -> None:
        lengths = {len(np.atleast_1d(getattr(self, f.name))) for f in fields(self)}
        if len(lengths) != 1:
            raise ValueError(f"config table columns differ in length: {sorted(lengths)}")

    def __len__(self) -> int:
        return len(np.atleast_1d(self.tp))

    @classmethod
    def from_columns(cls, **columns: npt.ArrayLike) -> ConfigTable:
        """Build from lists or arrays; every column becomes int64. A table without ``pp_schedule`` runs 1F1B,
        one without ``tp_overlap`` exposes its TP collectives."""
        for optional in ("pp_schedule", "tp_overlap"):
            columns.setdefault(optional, np.zeros_like(np.atleast_1d(np.asarray(columns["tp"]))))
        return cls(**{name: np.atleast_1d(np.asarray(value, dtype=np.int64)) for name, value in columns.items()})

    def take(self, index: np.ndarray | slice) -> ConfigTable:
        """The rows at ``index`` (an integer array or boolean mask)."""
        return ConfigTable(**{f.name: getattr(self, f.name)[index] for f in fields(self)})


def _presence_limit(size: int) -> int:
    """The largest value a presence table over ``size`` integers may cover before a sort is cheaper."""
    return max(4 * size, 1 << 20)


def _distinct_codes(values: np.ndarray) -> tuple[int, np.ndarray]:
    """(how many distinct values, each value's rank among them): a presence table over non-negative
    integers (linear time; zero-filled pages nothing lands on are never touched), a sort otherwise."""
    low, high = (int(values.min()), int(values.max())) if len(values) else (0, 0)
    if low < 0 or high >= _presence_limit(len(values)):
        distinct, codes = np.unique(values, return_inverse=True)
        return len(distinct), codes.reshape(-1)
    present = np.zeros(high + 1, dtype=bool)
    present[values] = True
    distinct = np.flatnonzero(present)
    rank = np.zeros(high + 1, dtype=np.int32 if len(distinct) < 2**31 else np.int64)
    rank[distinct] = np.arange(len(distinct), dtype=rank.dtype)
    return len(distinct), rank[values]


# distinct_index composes keys this many rows at a time, so each block's key stays in cache across the columns.
_KEY_BLOCK_ROWS = 1 << 16


_Coder = tuple[int, np.ndarray | None, np.ndarray | None]
"""What :func:`_coder` returns: (radix, rank table or None, codes or None)."""


def _coder(column: np.ndarray) -> _Coder:
    """(radix: how many distinct values, a rank table to look values up in (None where the values are their own
    ranks, 0 to radix - 1), the codes themselves where a sort had to make them). A one-byte column of non-negative
    values (a switch, a ZeRO stage, a micro-batch size) codes as its own values, radix its largest + 1: two
    reductions instead of counting every value, for a key at most 128 times wider."""
    if len(column) == 0:
        return 1, None, None
    if column.dtype == np.int8 and int(column.min()) >= 0:
        return int(column.max()) + 1, None, None
    counts = None
    if int(column.max()) < _presence_limit(len(column)):
        try:
            counts = np.bincount(column)  # a presence table; refuses negative values
        except ValueError:
            pass
    if counts is None:
        count, codes = _distinct_codes(column)
        return count, None, codes
    distinct = np.flatnonzero(counts)
    if distinct[-1] == len(distinct) - 1:
        return len(distinct), None, None
    rank = np.zeros(len(counts), dtype=np.int64)
    rank[distinct] = np.arange(len(distinct))
    return len(distinct), rank, None


def _mixed_radix_key(columns: list[np.ndarray], coders: list[_Coder], size: int) -> np.ndarray:
    """Σ code · (product of the later radices) per row, block by block (codes: ranks among the distinct values;
    a column of one value adds nothing)."""
    key = np.zeros(size, dtype=np.int64)
    varying = [(column, coder) for column, coder in zip(columns, coders) if coder[0] > 1]
    for start in range(0, size, _KEY_BLOCK_ROWS):
        rows = slice(start, start + _KEY_BLOCK_ROWS)
        block = key[rows]
        for column, (radix, rank, codes) in varying:
            block *= radix
            block += codes[rows] if codes is not None else column[rows] if rank is None else rank[column[rows]]
    return key


def distinct_index(columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(a row holding each distinct combination of equal-length integer ``columns``, each row's combination
    index), in linear time: the columns' codes combine in mixed radix (in groups small enough for a presence
    table, whose dense codes then combine the same way) and a presence table numbers the combinations."""
    columns = [np.asarray(column) for column in columns]
    return _distinct_index(columns, [_coder(column) for column in columns])


def _distinct_index(columns: list[np.ndarray], coders: list[_Coder]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`distinct_index` of ``columns`` coded by ``coders``."""
    size = len(columns[0]) if columns else 0
    if size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    groups: list[list[int]] = [[]]
    combinations = 1
    for position, (radix, _, _) in enumerate(coders):
        if groups[-1] and combinations * radix >= _presence_limit(size):
            groups.append([])
            combinations = 1
        groups[-1].append(position)
        combinations *= radix
    keys = [_mixed_radix_key([columns[i] for i in group], [coders[i] for i in group], size) for group in groups]
    count, index = _distinct_codes(keys[0])
    for key in keys[1:]:  # fold the groups in: dense codes of each, combined in mixed radix and renumbered
        group_count, codes = _distinct_codes(key)
        count, index = _distinct_codes(index.astype(np.int64) * group_count + codes)
    representative = np.empty(count, dtype=np.int64)
    for start in range(0, size, _KEY_BLOCK_ROWS):  # the last row of each combination, as one assignment would write
        rows = slice(start, start + _KEY_BLOCK_ROWS)
        representative[index[rows]] = np.arange(start, min(start + _KEY_BLOCK_ROWS, size), dtype=np.int64)
    return representative, index


def distinct_index_by_parent(parent_of_row: np.ndarray, parent_columns: list[np.ndarray],
                             row_columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`distinct_index` of ``parent_columns`` gathered by ``parent_of_row`` beside ``row_columns``, the same
    rows and combinations (numbered in another order where the parent columns do not lead): the parent columns'
    combinations are numbered once on the parent table, so each row reads one code instead of each such column."""
    if not parent_columns:
        return distinct_index(row_columns)
    parent_rows, parent_code = distinct_index(parent_columns)
    row_columns = [np.asarray(column) for column in row_columns]
    # The parent codes are dense ranks, 0 to the count - 1: their own codes.
    return _distinct_index([parent_code[parent_of_row], *row_columns],
                           [(len(parent_rows), None, None), *(_coder(column) for column in row_columns)])


DistinctIndex = Callable[[tuple[str, ...]], tuple[np.ndarray, np.ndarray]]
"""Of a table: (a row holding each distinct combination of the named columns, each row's combination index), as
:func:`distinct_index` of its columns gives it (a caller that knows how the table was built may find it faster)."""


def distinct_rows(t: ConfigTable, axes: tuple[str, ...],
                  find: DistinctIndex | None = None) -> tuple[ConfigTable, np.ndarray]:
    """(one row of ``t`` per distinct combination of the ``axes`` columns, each row's combination index), found by
    ``find`` (default: :func:`distinct_index` of the columns).

    A cost term that reads only ``axes`` is the same for every row of a combination, so it can be computed
    on the first table and gathered back with the index: elementwise arithmetic on the same values gives
    the same numbers, bit for bit. The other columns of a representative row are those of one of its rows."""
    representative, index = find(axes) if find is not None else distinct_index([getattr(t, axis) for axis in axes])
    return t.take(representative), index


def take_rows(record: _Record, index: np.ndarray | slice) -> _Record:
    """A frozen dataclass of per-row arrays (nested ones too) with every array indexed by ``index``;
    scalars and other fields as they are."""
    changes: dict[str, Any] = {}
    for field in fields(record):
        value = getattr(record, field.name)
        if isinstance(value, np.ndarray) and value.ndim == 1:
            changes[field.name] = value[index]
        elif is_dataclass(value) and not isinstance(value, type):
            changes[field.name] = take_rows(value, index)
    return replace(record, **changes)


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """What is being trained, as the cost model needs it."""

    seq_len: int
    """Tokens per sequence."""
    global_batch: int
    """Sequences per optimizer step."""
    precision: Precision
    """GEMM precision: bf16, fp8 or fp4 (other ops stay 16-bit)."""
    recipe: StateRecipe
    """How the engine stores and communicates model states."""
    attention: str = "fused"
    """Attention implementation (hardware_profiles.specs.ATTENTION_KERNELS)."""
    kernel_stack: str = "transformer_engine"
    """Where the GEMM modules come from (hardware_profiles.specs.KERNEL_STACKS)."""
    recompute_stops_early: bool = False
    """Full recompute ends at the last tensor backward needs (PyTorch non-reentrant checkpoint's
    early stop), so the down projection that closes each layer is not run again."""
    flops_convention: AttentionFlops = "full"
    """Attention FLOPs counted in MFU: ``full`` (PaLM, Megatron Eq. 3) or ``causal`` (half)."""
    expert_imbalance: float | None = None
    """Busiest EP rank's routed tokens over the mean (≥ 1; 1 = force-balanced routing, as NVIDIA's
    MoE benchmarks run); None = a balanced router's sampling noise (moe.expert_imbalance)."""
    routing: RoutingStats | None = None
    """Measured routing statistics; when given they set the imbalance per ep degree."""
    capacity_factor: float | None = None
    """Token dropping with padding to capacity: every expert rank processes exactly this multiple of the
    balanced load (imbalance beyond it is dropped); None = dropless."""
    async_tp: bool = False
    """TP collectives micro-pipelined under the GEMMs they feed (torchtitan's async TP)."""
    dispatcher: str = "alltoall"
    """MoE token dispatcher (moe.DISPATCHERS): how routed tokens reach their experts' GPUs."""
    fused_expert_mlp: bool = False
    """The routed experts' MLP runs as one fused grouped operation (Transformer Engine's op fuser, the CuTe DSL grouped
    MLP), its biases and clamped activation inside the kernels; else as Megatron's eager ops (moe_eager.py)."""
    cp_gather_overlaps_local: bool = False
    """The all-gather context-parallel variant starts asynchronously under the local chunk's attention
    (PyTorch's ring attention, torchtitan) instead of blocking before it (Transformer Engine)."""
    selective_saves: str = "attention_core"
    """What selective recompute keeps: ``attention_core`` (Megatron: everything but the attention core's
    tensors) or ``alternate_matmuls`` (torchtitan's op-level SAC: every other matmul output, the
    attention output and the layer input)."""
    loss_bytes_per_logit: float = 6.0
    """Bytes per logit element the loss holds at its peak (planner.engines derives each engine's)."""
    frees_grads_between_steps: bool = False
    """Gradients are freed after each step, so the first micro-batch's peak holds none."""
    saves_gathered_gemm_inputs: bool = False
    """With sequence parallelism, GEMMs keep their all-gathered input (torchtitan) rather than the shard."""
    fsdp_root_stays_gathered: bool = False
    """Sharded embedding and output weights stay gathered through the loss (FSDP2's root)."""
    pipeline_fsdp_unsharded: bool = False
    """Pipelined FSDP2: the stage stays gathered and its gradients accumulate unsharded (EngineRules)."""
    allocator: str = "fused_kernels"
    """Caching-allocator behaviour (cost_models.device_memory.FRAGMENTATION_FRAC): eager, compiled or fused_kernels."""
    pipeline_split: PipelineSplit = "megatron"
    """How the engine cuts the layers into pipeline chunks (pipeline_splits.PIPELINE_SPLITS)."""
    fp8_recipe: str = "tensorwise"
    """How fp8 GEMM inputs are scaled (fp8_recipes.FP8_RECIPES); read only when ``precision`` is fp8."""
    mtp_layers: int = 0
    """Multi-token-prediction modules trained after the last decoder layer (DeepSeek-V3 section 2.2; Megatron
    --mtp-num-layers): each a decoder layer, a 2h -> h projection and another pass of the output layer and loss,
    on the rank that runs the loss. The model's own count where the engine trains them (EngineRules.trains_mtp)."""

    @property
    def eager_elementwise(self) -> bool:
        """The model's memory-bound ops run as eager PyTorch kernels (torchtitan without torch.compile): the fact
        that also sets the ``eager`` allocator, priced in time by layer._eager_extra_bytes_per_token."""
        return self.allocator == "eager"

    def __post_init__(self) -> None:
        if self.expert_imbalance is not None and not self.expert_imbalance >= 1.0:
            raise ValueError(f"expert load imbalance must be >= 1 (busiest rank over the mean), "
                             f"got {self.expert_imbalance}")
