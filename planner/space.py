"""Enumerate every parallel configuration for a job and say why each rejected one is invalid.

Two passes keep the table small: first the (tp, pp, cp, cp_comm, ep, etp) shapes (cp_comm only where
cp > 1), then, for the valid shapes,
every (vpp, mbs, zero, recompute, sp). A shape rejected in the first pass counts for all the
second-pass combinations it would have had, so rejection counts are per candidate. Activation
offload exists only without pipeline parallelism or recompute, so a free search adds its
layer counts to those rows alone instead of multiplying the whole grid.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from itertools import product

import numpy as np

from paraplan.arrays import IntColumn
from paraplan.choices import CP_COMM_CODES, PIPELINE_SCHEDULE_CODES, RECOMPUTE_CODES
from paraplan.cost_models.context_parallel import heads_split_over, hierarchical_inner_size
from paraplan.cost_models.pipeline_splits import edge_chunks, split_exists
from paraplan.cost_models.table import ConfigTable
from paraplan.hardware_profiles import ClusterSpec
from paraplan.planner.engines import EngineRules
from paraplan.planner.job import TrainingJob

AXES = ("tp", "pp", "dp", "cp", "cp_comm", "ep", "etp", "vpp", "mbs", "zero", "recompute", "sp", "ep_overlap",
        "offload", "pp_schedule", "tp_overlap")
# The axes the first pass fixes for each shape and no later step changes (cp_comm is a placeholder where collapsed).
SHAPE_AXES = ("tp", "pp", "dp", "cp", "ep", "etp")
# The second pass expands these in order; the most selective first keeps the table small.
DETAIL_AXES = ("vpp", "mbs", "pp_schedule", "sp", "tp_overlap", "zero", "recompute", "ep_overlap", "offload")
# A free search offloads 1/16, 2/16, ... of the layers: fine enough that the last step moves
# under 7% of the activations, coarse enough to add at most 15 rows per pp = 1 candidate.
OFFLOAD_STEPS = 16
# Micro-batches beyond this many tokens do not raise GEMM efficiency further; the free search
# stops there (a fixed --mbs may exceed it).
MAX_FREE_MICROBATCH_TOKENS = 131_072
# Engines with uneven splits (Megatron's layout string, torchtitan's weighted split) can interleave any
# number of chunks; a free search also tries 2..8, the range NVIDIA's MoE recipes use (DeepSeek-V3: 2, 4, 8).
MAX_FREE_LAYOUT_VPP = 8


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """Valid candidates plus the count of rejected candidates per reason."""

    table: ConfigTable
    rejected: dict[str, int]
    considered: int
    cp_comm_allowed: np.ndarray | None = None
    """With ``collapse_cp_comm``: per row, a bitmask (bit c = CP_COMM_CODES value c) of the context-parallel
    variants the rules allow; the row's own cp_comm is a placeholder until the search picks one. Narrower than
    int64 with ``compact``, as the table is."""
    shapes: dict[str, np.ndarray] | None = None
    """With ``compact``: the first pass's valid shapes, one row each: SHAPE_AXES and, with ``collapse_cp_comm``,
    ``cp_comm_allowed``, in the table's integer types."""
    shape_of_row: np.ndarray | None = None
    """With ``compact``: per row of the table, its shape's row in ``shapes``: a column a shape decides equals
    ``shapes[axis][shape_of_row]``, so what depends only on such columns can be worked out once per shape."""


def divisors(n: int) -> list[int]:
    """All positive divisors of n, ascending."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def offload_choices(num_layers: int) -> list[int]:
    """Layer counts a free search offloads: multiples of ceil(layers / OFFLOAD_STEPS) below the depth."""
    step = -(-num_layers // OFFLOAD_STEPS)
    return list(range(step, num_layers, step))


def _free_values(job: TrainingJob, cluster: ClusterSpec, engine: EngineRules) -> dict[str, list[int]]:
    n, layers = cluster.num_gpus, job.model.num_layers
    chunks = sorted(set(divisors(layers) + divisors(layers + 2) + list(range(1, MAX_FREE_LAYOUT_VPP + 1))))
    return {
        "tp": divisors(n), "pp": divisors(n), "cp": divisors(n), "dp": divisors(n), "vpp": chunks,
        "cp_comm": [CP_COMM_CODES[name] for name in engine.cp_comm_types] or [CP_COMM_CODES["p2p"]],
        "ep": divisors(job.model.num_experts) if job.model.is_moe else [1],
        "etp": divisors(cluster.domain_gpus) if job.model.is_moe else [1],
        "mbs": [d for d in divisors(job.global_batch) if d * job.seq_len <= MAX_FREE_MICROBATCH_TOKENS] or [1],
        "zero": list(engine.zero_stages),
        "recompute": [RECOMPUTE_CODES[mode] for mode in engine.recompute_modes],
        "sp": [0, 1],
        "ep_overlap": [0, 1] if job.model.is_moe and engine.ep_overlap else [0],
        "offload": [0] + (offload_choices(layers) if engine.activation_offload else []),
        "pp_schedule": [PIPELINE_SCHEDULE_CODES[name] for name in engine.pipeline_schedules],
        "tp_overlap": [0, 1] if engine.tp_comm_overlap else [0],
    }


# A rule's verdict on every candidate row: the mask of the rows it rejects, and why.
Reason = tuple[np.ndarray, str]


def _expert_reasons(job: TrainingJob, engine: EngineRules, tp: np.ndarray, dp: np.ndarray, cp: np.ndarray,
                    ep: np.ndarray, etp: np.ndarray) -> list[Reason]:
    model = job.model
    axes = {"tp": tp, "dp": dp, "cp": cp}
    carved = np.prod([axes[a] for a in engine.expert_ranks_from], axis=0)
    folded = np.where("tp" in engine.expert_ranks_from, ep * etp, ep)
    etp_ok = {"divisors_of_tp": tp % etp == 0, "one_or_tp": (etp == 1) | (etp == tp), "one": etp == 1}
    return [
        (((ep > 1) | (etp > 1)) & (not model.is_moe), "ep and etp apply to MoE models only"),
        (model.num_experts % ep != 0 if model.is_moe else ep < 1, "ep does not divide the routed experts"),
        (~etp_ok[engine.etp_choices], f"{engine.name} does not offer this expert tensor-parallel degree"),
        # Megatron's fused grouped MLP (TEGroupedMLP._is_fused_impl_supported) refuses tensor-parallel experts.
        ((etp > 1) & job.fused_expert_mlp, "the fused expert MLP runs expert tensor parallelism 1 only"),
        (carved % np.maximum(folded, 1) != 0,
         (f"{engine.name} carves expert groups from {'·'.join(engine.expert_ranks_from)}: ep"
          f"{'·etp' if 'tp' in engine.expert_ranks_from else ''} must divide it")),
    ]


def _cp_comm_reasons(job: TrainingJob, cluster: ClusterSpec, engine: EngineRules, tp: np.ndarray, cp: np.ndarray,
                     cp_comm: np.ndarray) -> list[Reason]:
    model, split = job.model, cp > 1
    offered = [CP_COMM_CODES[name] for name in engine.cp_comm_types]
    inner = hierarchical_inner_size(model, tp, cp, cluster.domain_gpus)
    return [
        (split & ~np.isin(cp_comm, offered), f"{engine.name} does not offer this context-parallel communication"),
        (split & (cp_comm == CP_COMM_CODES["a2a"]) & ~heads_split_over(model, tp, cp),
         "a2a context parallel needs each TP rank's heads and KV heads divisible by cp"),
        (split & (cp_comm == CP_COMM_CODES["a2a+p2p"]) & ((inner == 1) | (inner == cp)),
         "a2a+p2p needs an all-to-all group inside one NVLink domain, smaller than cp, that splits the heads"),
    ]


DIVIDES_RULE = "tp·pp·cp does not divide the GPU count"


def _dividing_shape_grid(values: dict[str, list[int]], num_gpus: int) -> tuple[np.ndarray, int]:
    """(rows of tp, pp, cp, cp_comm, ep, etp whose tp·pp·cp divides the GPU count; how many rows the full
    product of the axis values has). Without context parallelism the communication type is moot: one row
    per shape, coded p2p."""
    comms, experts = values["cp_comm"], len(values["ep"]) * len(values["etp"])
    rows_per_cp = {cp: (len(comms) if cp > 1 else 1) * experts for cp in values["cp"]}
    total_rows = len(values["tp"]) * len(values["pp"]) * sum(rows_per_cp.values())
    triples = [(tp, pp, cp) for tp in values["tp"] if num_gpus % tp == 0
               for pp in values["pp"] if (num_gpus // tp) % pp == 0
               for cp in values["cp"] if (num_gpus // (tp * pp)) % cp == 0]
    heads = np.array([(tp, pp, cp, comm if cp > 1 else CP_COMM_CODES["p2p"]) for tp, pp, cp in triples
                      for comm in (comms if cp > 1 else comms[:1])], dtype=np.int64).reshape(-1, 4)
    pairs = np.array(list(product(values["ep"], values["etp"])), dtype=np.int64).reshape(-1, 2)
    # each head row once per (ep, etp) pair, pair-minor: numpy repeats, not millions of Python tuples
    rows = np.hstack([np.repeat(heads, len(pairs), axis=0), np.tile(pairs, (len(heads), 1))])
    return rows.reshape(-1, 6), total_rows


def _shape_reasons(job: TrainingJob, cluster: ClusterSpec, engine: EngineRules, tp: np.ndarray, pp: np.ndarray,
                   cp: np.ndarray, cp_comm: np.ndarray, ep: np.ndarray, etp: np.ndarray) -> list[Reason]:
    model, n = job.model, cluster.num_gpus
    layers_ok = split_exists(engine.pipeline_split, model.num_layers, pp, 1)
    dp = np.where(n % (tp * pp * cp) == 0, n // (tp * pp * cp), 0)
    return [
        (n % (tp * pp * cp) != 0, DIVIDES_RULE),
        (tp > cluster.domain_gpus, "tp spans more than one NVLink domain"),
        ((model.num_heads % tp != 0) | (model.num_kv_heads % tp != 0), "tp does not divide the attention/KV heads"),
        (~layers_ok, f"{engine.name} cannot split the layers over pp stages"),
        ((cp > 1) & (job.seq_len % (2 * cp) != 0), "cp does not divide seq_len/2 (load-balanced causal ring)"),
        ((cp > 1) & (not engine.supports_cp), f"{engine.name} has no context parallelism"),
        ((cp > 1) & (job.attention_kernel == "unfused"),
         "cp > 1 needs a flash-family attention kernel (ring attention)"),
        *_cp_comm_reasons(job, cluster, engine, tp, cp, cp_comm),
        *_expert_reasons(job, engine, tp, dp, cp, ep, etp),
    ]


# What a detail rule reads: the candidate columns by axis name (a _Rows or a _Grid).
Columns = Mapping[str, np.ndarray]
# Each detail rule names the axes it reads, so it runs as soon as they are expanded (see _detail_pass).
Rule = tuple[tuple[str, ...], Callable[[Columns], np.ndarray], str]


def _detail_rules(job: TrainingJob, engine: EngineRules) -> list[Rule]:
    layers, mtp = job.model.num_layers, job.trained_mtp_layers
    full = RECOMPUTE_CODES["full"]

    def chunks_ok(t: Columns) -> np.ndarray:
        return split_exists(engine.pipeline_split, layers, t["pp"], t["vpp"])

    def empty_edge(t: Columns) -> np.ndarray:
        first, last = edge_chunks(engine.pipeline_split, layers, t["pp"], t["vpp"])
        return (t["pp"] > 1) & ((first == 0) | (last == 0))

    def micro_batches(t: Columns) -> np.ndarray:
        per_step = t["dp"] * t["mbs"]
        return np.where(job.global_batch % per_step == 0, job.global_batch // per_step, 0)

    return [
        (("vpp",), lambda t: (t["vpp"] > 1) & (t["pp"] == 1), "vpp > 1 needs pp > 1"),
        (("vpp",), lambda t: (t["vpp"] > 1) & (not engine.supports_interleaved),
         f"{engine.name} has no interleaved schedule"),
        (("vpp",), lambda t: (t["vpp"] > 1) & ~chunks_ok(t),
         f"{engine.name} cannot split the layers over pp·vpp chunks"),
        (("vpp",), lambda t: empty_edge(t) & (not engine.empty_edge_chunks),
         f"{engine.name} cannot run an edge chunk without a decoder layer"),
        (("mbs",), lambda t: job.global_batch % (t["dp"] * t["mbs"]) != 0, "global batch not divisible by dp·mbs"),
        (("vpp", "mbs"), lambda t: (t["vpp"] > 1) & engine.interleaved_needs_pp_multiple
         & (micro_batches(t) % t["pp"] != 0), "interleaved schedule needs micro-batches divisible by pp"),
        *_schedule_rules(engine, micro_batches),
        (("sp",), lambda t: (t["sp"] == 1) & (t["tp"] == 1), "sequence parallel needs tp > 1"),
        (("sp",), lambda t: (t["sp"] == 0) & (t["tp"] > 1) & job.model.is_moe,
         "MoE layers with tp > 1 need sequence parallel"),
        (("sp",), lambda t: (t["tp"] > 1) & ~np.isin(t["sp"], engine.sp_modes_with_tp),
         f"{engine.name} does not offer this sequence-parallel setting"),
        (("tp_overlap",), lambda t: (t["tp_overlap"] == 1) & (not engine.tp_comm_overlap),
         f"{engine.name} has no TP communication overlap"),
        (("tp_overlap",), lambda t: (t["tp_overlap"] == 1) & ((t["tp"] == 1) | (t["sp"] == 0)),
         "TP communication overlap needs tp > 1 and sequence parallel"),
        *_zero_rules(engine),
        (("recompute",), lambda t: ~np.isin(t["recompute"], [RECOMPUTE_CODES[m] for m in engine.recompute_modes]),
         f"{engine.name} has no such recompute mode"),
        (("ep_overlap",), lambda t: (t["ep_overlap"] == 1) & (not engine.ep_overlap),
         f"{engine.name} has no expert all-to-all overlap"),
        (("ep_overlap",), lambda t: (t["ep_overlap"] == 1) & (t["ep"] == 1), "expert all-to-all overlap needs ep > 1"),
        (("ep_overlap", "recompute"), lambda t: (t["ep_overlap"] == 1) & (t["recompute"] == full),
         "expert all-to-all overlap excludes full recompute"),
        (("ep_overlap", "vpp"), lambda t: (t["ep_overlap"] == 1) & (t["pp"] > 1) & (t["vpp"] == 1),
         "expert all-to-all overlap with pp > 1 needs virtual stages"),
        # megatron-core 0.16 TransformerConfig: the overlap takes at most one MTP layer, and then pp > 1.
        (("ep_overlap",), lambda t: (t["ep_overlap"] == 1) & ((mtp > 1) | ((mtp == 1) & (t["pp"] == 1))),
         "expert all-to-all overlap takes at most one MTP layer, and then needs pp > 1"),
        (("offload",), lambda t: (t["offload"] > 0) & (not engine.activation_offload),
         f"{engine.name} has no activation offloading"),
        (("offload",), lambda t: (t["offload"] > 0) & (t["pp"] > 1), "activation offload needs pp = 1"),
        (("offload", "recompute"), lambda t: (t["offload"] > 0) & (t["recompute"] > 0),
         "activation offload cannot be combined with recompute"),
        (("offload",), lambda t: t["offload"] >= layers, "activation offload must leave at least one layer on the GPU"),
    ]


def _zero_rules(engine: EngineRules) -> list[Rule]:
    """Which ZeRO stages the engine runs, and with what."""
    return [
        (("zero",), lambda t: ~np.isin(t["zero"], engine.zero_stages), f"{engine.name} has no such ZeRO stage"),
        (("zero",), lambda t: (t["zero"] > 0) & (t["dp"] * t["cp"] == 1),
         "ZeRO stage > 0 with dp·cp = 1 is the same as stage 0"),
        (("zero",), lambda t: (t["zero"] > engine.max_zero_with_pp) & (t["pp"] > 1),
         f"{engine.name} cannot combine this ZeRO stage with pp"),
        (("zero",), lambda t: (t["zero"] == 0) & (t["cp"] > 1) & engine.shards_over_cp,
         f"{engine.name} shards parameters over the context-parallel ranks whenever cp > 1: ZeRO 2 or 3"),
    ]


def _schedule_rules(engine: EngineRules, micro_batches: Callable[[Columns], np.ndarray]) -> list[Rule]:
    """Where each pipeline schedule runs (cost_models/schedules.py). DualPipeV: torch's ScheduleDualPipeV with
    V-style stages, exactly two per rank; DualPipe: DeepSeek's DualPipe, one stage per rank and direction, an even
    number of ranks and of micro-batches (half enter from each end). Both need at least 2·pp micro-batches
    (deepseek-ai/DualPipe asserts num_chunks >= num_ranks * 2)."""
    v, dual = PIPELINE_SCHEDULE_CODES["dualpipev"], PIPELINE_SCHEDULE_CODES["dualpipe"]
    offered = [PIPELINE_SCHEDULE_CODES[name] for name in engine.pipeline_schedules]

    def bidirectional(t: Columns) -> np.ndarray:
        return t["pp_schedule"] > 0

    return [
        (("pp_schedule",), lambda t: ~np.isin(t["pp_schedule"], offered),
         f"{engine.name} does not run this pipeline schedule"),
        (("pp_schedule",), lambda t: bidirectional(t) & (t["pp"] == 1), "DualPipe schedules need pp > 1"),
        (("pp_schedule", "vpp"), lambda t: (t["pp_schedule"] == v) & (t["vpp"] != 2),
         "DualPipeV runs exactly two chunks per rank (vpp = 2)"),
        (("pp_schedule", "vpp"), lambda t: (t["pp_schedule"] == dual) & ((t["vpp"] != 1) | (t["pp"] % 2 == 1)),
         "DualPipe needs an even pp and no virtual stages"),
        (("pp_schedule", "mbs"), lambda t: bidirectional(t) & (
            (micro_batches(t) < 2 * t["pp"]) | ((t["pp_schedule"] == dual) & (micro_batches(t) % 2 == 1))),
         "DualPipe schedules need at least 2·pp micro-batches (an even number for DualPipe)"),
    ]


DOMINATED_TP_OVERLAP = "TP communication overlap off: never faster than on, with the same memory"


def _dominated_tp_overlap_rule(engine: EngineRules) -> Rule:
    """A free search keeps only the overlapped variant where the engine can run it: overlap hides part of the TP
    traffic (layer._exposed_tp_comm_s, never more than the plain collectives) and allocates nothing the memory
    model prices, so the plain variant is dominated: counted, never estimated."""
    return (("tp_overlap",), lambda t: (t["tp_overlap"] == 0) & (t["tp"] > 1) & (t["sp"] == 1)
            & engine.tp_comm_overlap, DOMINATED_TP_OVERLAP)


def _first_reason(reasons: list[Reason], shape: int | tuple[int, ...]) -> np.ndarray:
    """Index of the first failing reason per row (an array of ``shape``), -1 when valid."""
    code = np.full(shape, -1, dtype=np.int16 if len(reasons) < np.iinfo(np.int16).max else np.int64)
    for index, (mask, _) in reversed(list(enumerate(reasons))):
        np.copyto(code, index, where=np.broadcast_to(mask, code.shape))
    return code


def _count(counts: dict[str, int], reasons: list[Reason], code: np.ndarray, weight: int,
           variants: IntColumn = 1) -> None:
    """Add to each reason the candidates whose first failing reason it is: ``weight`` times ``variants`` per row
    (``variants``: a number, or small per-row counts broadcastable to ``code``, the CP variants a row stands for)."""
    narrow = np.int16 if len(reasons) < np.iinfo(np.int16).max // 8 else np.int64
    if np.ndim(variants) == 0:
        by_reason = _small_counts(code.astype(narrow) + 1, len(reasons) + 1)[1:] * int(variants)
    else:
        # The reason and the variant count as one small integer per candidate: one integer count, no float weights.
        top = int(np.max(variants, initial=0)) + 1
        key = (code.astype(narrow) + 1) * top + np.asarray(variants).astype(narrow)
        by_variant = _small_counts(key, (len(reasons) + 1) * top).reshape(len(reasons) + 1, top)
        by_reason = by_variant[1:] @ np.arange(top, dtype=np.int64)  # row counts times their variant counts: exact
    for index, (_, label) in enumerate(reasons):
        if by_reason[index]:
            counts[label] = counts.get(label, 0) + int(by_reason[index]) * int(weight)  # Python ints: no overflow


# _small_counts counts this many values at a time: np.bincount converts its input to intp first, a copy that then
# stays in cache instead of one the size of the whole grid.
_COUNT_BLOCK = 1 << 16


def _small_counts(key: np.ndarray, size: int) -> np.ndarray:
    """How many of ``key``'s values (non-negative integers below ``size``) equal 0, 1, ..., size - 1."""
    flat = key.ravel()
    total = np.zeros(size, dtype=np.int64)
    for start in range(0, len(flat), _COUNT_BLOCK):
        total += np.bincount(flat[start:start + _COUNT_BLOCK], minlength=size)
    return total


# The number of set bits of every CP-variant bitmask (small counts: _count multiplies them into Python integers).
_VARIANTS_IN_MASK = np.array([bin(mask).count("1") for mask in range(1 << len(CP_COMM_CODES))], dtype=np.int8)


def _variant_counts(columns: Columns) -> IntColumn:
    """How many CP variants each row stands for: the bits of its mask when collapsed, else 1."""
    if "cp_variants" not in columns:
        return 1
    return columns["cp_variants"]


def _narrowed(column: np.ndarray) -> np.ndarray:
    """``column`` in the narrowest signed integer type that holds its values: a table of millions of rows of
    small integers (ZeRO stages, switches, degrees) then takes a byte or two per value instead of eight."""
    low, high = (int(column.min()), int(column.max())) if len(column) else (0, 0)
    dtype = next((d for d in (np.int8, np.int16, np.int32) if np.iinfo(d).min <= low and high <= np.iinfo(d).max),
                 np.int64)
    return column.astype(dtype, copy=False)


class _Rows(Mapping[str, np.ndarray]):
    """Rows of the valid shapes (``parent`` indexes the shape columns) with the detail columns expanded so far.
    A shape column is gathered only when something reads it, so the detail pass does not copy every shape
    column at every stage, and the last gather writes the final table."""

    def __init__(self, shapes: dict[str, np.ndarray], parent: np.ndarray | None,
                 details: dict[str, np.ndarray]) -> None:
        self.shapes, self.parent, self.details = shapes, parent, details
        self.size = len(parent) if parent is not None else len(next(iter(shapes.values())))
        self._gathered: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self.details:
            return self.details[name]
        if name not in self._gathered:
            column = self.shapes[name]
            self._gathered[name] = column if self.parent is None else column[self.parent]
        return self._gathered[name]

    def __contains__(self, name: object) -> bool:
        return name in self.details or name in self.shapes

    def __iter__(self) -> Iterator[str]:
        return iter([*self.shapes, *self.details])

    def __len__(self) -> int:
        return len(self.shapes) + len(self.details)

    def subset(self, rows: np.ndarray, drop: str | None = None) -> _Rows:
        """The rows at indices ``rows``, without the detail column ``drop``."""
        parent = rows if self.parent is None else self.parent[rows]
        return _Rows(self.shapes, parent, {name: column[rows] for name, column in self.details.items() if name != drop})

    def with_column(self, name: str, column: np.ndarray) -> _Rows:
        return _Rows(self.shapes, self.parent, {**self.details, name: column})

    def followed_by(self, other: _Rows) -> _Rows:
        """These rows, then ``other``'s (rows of the same shapes with the same detail columns)."""
        parents = [np.arange(self.size) if self.parent is None else self.parent,
                   np.arange(other.size) if other.parent is None else other.parent]
        return _Rows(self.shapes, np.concatenate(parents),
                     {name: np.concatenate([column, other.details[name]]) for name, column in self.details.items()})


class _Grid(Mapping[str, np.ndarray]):
    """What a rule reads while ``axis`` is expanded: the existing columns as (1, rows), the new axis as
    (values, 1), so that they broadcast to the expanded table without building it. Values first: numpy's array
    loops then run along the rows (with rows first, each loop ran over a handful of values, five times slower)."""

    def __init__(self, rows: _Rows, axis: str, choices: np.ndarray) -> None:
        self.rows, self.axis, self.choices = rows, axis, choices

    def __getitem__(self, name: str) -> np.ndarray:
        return self.choices[:, None] if name == self.axis else self.rows[name][None, :]

    def __iter__(self) -> Iterator[str]:
        return iter([*self.rows, self.axis])

    def __len__(self) -> int:
        return len(self.rows) + 1


def _expand_valid(columns: _Rows, axis: str, values: list[int], rules: list[Rule], counts: dict[str, int],
                  weight: int) -> _Rows:
    """Every row once per value of ``axis`` (value-minor order), less the rows a rule rejects; each rejected
    row stands for ``weight`` candidates per CP variant. The rules see the old columns as (1, rows) and the
    new axis as (values, 1) and broadcast, so the expanded table is never built: only its surviving rows."""
    size, choices = columns.size, np.asarray(values, dtype=np.int64)
    grid = _Grid(columns, axis, choices)
    reasons = [(check(grid), label) for _, check, label in rules]
    code = _first_reason(reasons, (len(choices), size))
    variants = _variant_counts(columns)
    _count(counts, reasons, code, weight, variants[None, :] if isinstance(variants, np.ndarray) else variants)
    kept = np.flatnonzero((code == -1).T)  # (rows, values) order: each row's values together
    stored = _narrowed(choices)  # the rules above saw int64; the expanded column keeps its values narrower
    if len(choices) == 1 and len(kept) == size:  # nothing to expand or drop
        return columns.with_column(axis, np.full(size, stored[0], dtype=stored.dtype))
    parent, choice = np.divmod(kept, len(choices))
    return columns.subset(parent).with_column(axis, stored[choice])


def _detail_pass(shapes: dict[str, np.ndarray], values: dict[str, list[int]], rules: list[Rule],
                 counts: dict[str, int]) -> _Rows:
    """Expand the valid shapes one detail axis at a time, applying each rule once its axes exist: a row
    rejected early is counted for all the later-axis combinations it would have had."""
    columns, done = _Rows(shapes, None, {}), set()
    remaining = int(np.prod([len(values[a]) for a in DETAIL_AXES]))
    for axis in DETAIL_AXES:
        remaining //= len(values[axis])
        done.add(axis)
        ready = [rule for rule in rules if axis in rule[0] and set(rule[0]) <= done]
        columns = _expand_valid(columns, axis, values[axis], ready, counts, remaining)
    return columns


def _offload_variants(columns: _Rows, offloads: list[int], rules: list[Rule], counts: dict[str, int]) -> _Rows:
    """Valid rows again with each layer count offloaded, where pp = 1 and recompute is off."""
    base = np.flatnonzero((columns["pp"] == 1) & (columns["recompute"] == 0))
    return _expand_valid(columns.subset(base, drop="offload"), "offload", offloads,
                         [rule for rule in rules if "offload" in rule[0]], counts, 1)


def _collapse_cp_comm(shapes: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One row per (tp, pp, cp, ep, etp) with the valid CP variants as a bitmask. No detail rule reads
    cp_comm, so the variants of a shape would expand into identical rows."""
    keys = np.stack([shapes[a] for a in ("tp", "pp", "cp", "ep", "etp")], axis=1)
    unique, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    mask = np.zeros(len(unique), dtype=np.int64)
    np.bitwise_or.at(mask, inverse.ravel(), np.left_shift(1, shapes["cp_comm"]))
    collapsed = {name: column[first] for name, column in shapes.items()}
    collapsed["cp_comm"] = np.log2(mask & -mask).astype(np.int64)  # placeholder: the lowest valid code
    collapsed["cp_comm_allowed"] = mask
    collapsed["cp_variants"] = _VARIANTS_IN_MASK[mask]  # per shape, so each expansion gathers the counts, no more
    return collapsed


def enumerate_space(job: TrainingJob, cluster: ClusterSpec, engine: EngineRules,
                    fixed: dict[str, list[int]] | None = None, collapse_cp_comm: bool = False,
                    compact: bool = False) -> SearchSpace:
    """All valid configurations, with ``fixed`` axes limited to the given values.

    ``collapse_cp_comm`` returns one row for all CP variants of a layout, with their bitmask, for a
    caller that picks the variant by cost (search); the counts still count every variant. ``compact`` keeps each
    column of the table (and the bitmask) in the narrowest integer type that holds its values instead of int64,
    for a caller that prices it a block at a time (estimate.widened): DeepSeek-V3 on 2,048 GPUs has 2.7 million
    rows, 345 MB as int64."""
    values = {**_free_values(job, cluster, engine), **(fixed or {})}
    # A free offload axis: the grid takes 0 and the offloading variants join the valid rows that allow them.
    extra_offload = [] if "offload" in (fixed or {}) else [v for v in values["offload"] if v > 0]
    if extra_offload:
        values["offload"] = [0]
    per_shape = int(np.prod([len(values[a]) for a in DETAIL_AXES]))
    grid, total_rows = _dividing_shape_grid(values, cluster.num_gpus)
    tp, pp, cp, cp_comm, ep, etp = grid.T
    # Shapes whose tp·pp·cp does not divide the GPU count (the first rule) are counted, never built: a GPU
    # count with many divisors (720,720 has 240) made 55 million rows of them and took 8 GB.
    counts: dict[str, int] = {}
    if total_rows > len(grid):
        counts[DIVIDES_RULE] = (total_rows - len(grid)) * per_shape
    reasons = _shape_reasons(job, cluster, engine, tp, pp, cp, cp_comm, ep, etp)
    code = _first_reason(reasons, len(grid))
    dp = np.where(code == -1, cluster.num_gpus // (tp * pp * cp), 0)
    wrong_dp = (code == -1) & ~np.isin(dp, values["dp"])
    code = np.where(wrong_dp, len(reasons), code)
    reasons.append((wrong_dp, "dp differs from the requested values"))
    _count(counts, reasons, code, per_shape)
    keep = code == -1
    shapes = {"tp": tp[keep], "pp": pp[keep], "dp": dp[keep], "cp": cp[keep], "cp_comm": cp_comm[keep],
              "ep": ep[keep], "etp": etp[keep]}
    if collapse_cp_comm:
        shapes = _collapse_cp_comm(shapes)
    rules = _detail_rules(job, engine)
    if "tp_overlap" not in (fixed or {}):
        rules.append(_dominated_tp_overlap_rule(engine))
    columns = _detail_pass(shapes, values, rules, counts)
    considered = total_rows * per_shape
    if extra_offload:
        variants = _offload_variants(columns, extra_offload, rules, counts)
        offloadable = (columns["pp"] == 1) & (columns["recompute"] == 0)
        considered += int(np.sum(np.where(offloadable, _variant_counts(columns), 0))) * len(extra_offload)
        columns = columns.followed_by(variants)
    if not compact:
        return SearchSpace(table=ConfigTable.from_columns(**{axis: columns[axis] for axis in AXES}), rejected=counts,
                           considered=considered, cp_comm_allowed=columns.get("cp_comm_allowed"))
    # Gather the narrowed shape columns instead of their int64 originals.
    columns = _Rows({name: _narrowed(column) for name, column in columns.shapes.items()}, columns.parent,
                    columns.details)
    shape_of_row = np.arange(columns.size) if columns.parent is None else columns.parent
    return SearchSpace(table=ConfigTable(**{axis: columns[axis] for axis in AXES}), rejected=counts,
                       considered=considered, cp_comm_allowed=columns.get("cp_comm_allowed"),
                       shapes={name: column for name, column in columns.shapes.items()
                               if name in (*SHAPE_AXES, "cp_comm_allowed")},
                       shape_of_row=shape_of_row)
