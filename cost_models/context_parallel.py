"""Context-parallel attention traffic per layer per micro-batch, for each way engines move it.

Every variant gives each GPU T = mbs·s/cp tokens of the sequence (2·cp load-balanced chunks under
a causal mask) and the same attention FLOPs; they differ in what crosses the wire and whether the
attention compute hides it (Megatron-core ``--cp-comm-type``, Transformer Engine's
``attn_forward_func_with_cp``; torchtitan through PyTorch's ``context_parallel``):

- ``p2p`` ring: cp−1 hops of the local K and V forward, overlapped with the attention of the
  chunk already received; backward sends K, V and dK, dV around the ring (twice the bytes).
- ``a2a`` (DeepSpeed-Ulysses): an all-to-all turns sequence shards of Q, K, V into head shards
  before attention and one turns the output back; backward mirrors it (dO in; dQ, dK, dV out).
  Nothing overlaps it. Needs the heads (and KV heads) of a TP rank divisible by cp.
- ``allgather``: KV of the whole sequence all-gathered before attention, dK, dV reduce-scattered
  after its backward, which gathers KV again. Transformer Engine runs it blocking; PyTorch's
  ring attention (torchtitan) starts it asynchronously under the attention of the local chunk.
- ``a2a+p2p`` (hierarchical): all-to-all inside groups of ``a`` ranks that share an NVLink domain,
  a ring over the cp/a groups between domains; every ring hop carries the same bytes as a p2p
  hop, so the ring crosses the slow fabric cp/a − 1 times instead of cp − 1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from paraplan.arrays import Column, IntColumn
from paraplan.choices import CP_COMM_CODES
from paraplan.cost_models.collectives import all_to_all_time_s, collective_time_s, p2p_time_s
from paraplan.hardware_profiles import ClusterSpec
from paraplan.model_specs.model_spec import ModelSpec

ACTIVATION_BYTES = 2.0  # Q, K, V, the output and their gradients are 16-bit in every recipe modelled


def _widths(model: ModelSpec, tp: IntColumn) -> tuple[Column, Column, Column, Column]:
    """(query, key, value, output) widths one TP rank holds per token; MLA expands K and V per head."""
    kv_heads = model.num_heads if model.is_mla else model.num_kv_heads
    query = model.num_heads * model.qk_head_dim / tp
    return query, kv_heads * model.qk_head_dim / tp, kv_heads * model.value_head_dim / tp, \
        model.num_heads * model.value_head_dim / tp


def heads_split_over(model: ModelSpec, tp: IntColumn, group: IntColumn) -> np.ndarray:
    """Whether every TP rank's query and KV heads divide evenly over ``group`` ranks (Ulysses)."""
    kv_heads = model.num_heads if model.is_mla else model.num_kv_heads
    tp, group = np.asarray(tp), np.asarray(group)
    return ((model.num_heads // tp) % group == 0) & ((kv_heads // tp) % group == 0)


def _distinct(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct non-negative integers of ``values`` ascending, each value's index among them),
    in linear time: a presence table instead of a sort."""
    present = np.zeros(int(values.max(initial=0)) + 1, dtype=bool)
    present[values] = True
    return np.flatnonzero(present), (np.cumsum(present) - 1)[values]


def hierarchical_inner_size(model: ModelSpec, tp: IntColumn, cp: IntColumn, domain_gpus: int) -> np.ndarray:
    """The all-to-all group of ``a2a+p2p``: the largest divisor a of cp whose tp·a ranks share one
    NVLink domain and over which the heads split; 1 when there is none (then the ring is all)."""
    tp, cp = np.broadcast_arrays(np.asarray(tp, dtype=np.int64), np.asarray(cp, dtype=np.int64))
    # Millions of rows hold few (tp, cp) pairs: solve each distinct pair once, then look it up.
    (tps, tp_index), (cps, cp_index) = _distinct(tp), _distinct(cp)
    pair_tp, pair_cp = np.meshgrid(np.maximum(tps, 1), cps, indexing="ij")
    inner = np.ones(pair_tp.shape, dtype=np.int64)
    for size in range(2, domain_gpus + 1):
        fits = (pair_cp % size == 0) & (pair_tp * size <= domain_gpus) & heads_split_over(model, pair_tp, size)
        inner = np.where(fits, size, inner)
    return inner[tp_index, cp_index]


def ring_hop_bytes(model: ModelSpec, tokens: Column, tp: IntColumn) -> Column:
    """Bytes of one forward ring hop: the K and V of ``tokens`` tokens on one TP rank."""
    _, key, value, _ = _widths(model, tp)
    return tokens * (key + value) * ACTIVATION_BYTES


def gathered_kv_bytes(model: ModelSpec, tokens: Column, tp: IntColumn, cp: IntColumn, cp_comm: IntColumn) -> np.ndarray:
    """Transient bytes the all-gather variant holds while one layer's attention runs backward: K and V
    of the whole sequence gathered again, and the whole-sequence dK, dV it reduce-scatters (TE's
    AttnFuncWithCPAndKVAllGather; PyTorch's all-gather ring attention alike), 2·cp local K, V sizes.
    The other variants hold at most a hop's K, V in flight beside the local ones: not counted."""
    gathers = (np.asarray(cp_comm) == CP_COMM_CODES["allgather"]) & (np.asarray(cp) > 1)
    return np.where(gathers, 2.0 * np.asarray(cp) * ring_hop_bytes(model, tokens, tp), 0.0)


def ulysses_bytes(model: ModelSpec, tokens: Column, tp: IntColumn) -> tuple[Column, Column]:
    """(before, after) attention all-to-all bytes one GPU sends per pass: Q, K, V in, the output
    out (backward: dO in, dQ, dK, dV out, the same two volumes swapped)."""
    query, key, value, output = _widths(model, tp)
    return tokens * (query + key + value) * ACTIVATION_BYTES, tokens * output * ACTIVATION_BYTES


def _ring_exposed_s(hop_s: np.ndarray, hops: IntColumn, attention_fwd_s: Column,
                    attention_bwd_s: Column) -> tuple[np.ndarray, np.ndarray]:
    """Ring traffic the attention compute does not hide: hops forward, twice the bytes backward."""
    forward = hops * hop_s
    return np.maximum(forward - attention_fwd_s, 0.0), np.maximum(2.0 * forward - attention_bwd_s, 0.0)


def _ulysses_s(model: ModelSpec, tokens: Column, tp: IntColumn, group: IntColumn, stride: IntColumn,
               cluster: ClusterSpec) -> np.ndarray:
    """Seconds of one pass's two all-to-alls over ``group`` ranks ``stride`` apart."""
    before, after = ulysses_bytes(model, tokens, tp)
    return all_to_all_time_s(before, group, stride, cluster) + all_to_all_time_s(after, group, stride, cluster)


def _ring_s(model: ModelSpec, tokens: Column, tp: IntColumn, cp: IntColumn, cluster: ClusterSpec,
            attention_fwd_s: Column, attention_bwd_s: Column, gather_overlaps_local: bool
            ) -> tuple[np.ndarray, np.ndarray]:
    """``p2p``: (forward, backward) exposed seconds of the ring, cp − 1 hops of the local K and V."""
    hop = p2p_time_s(ring_hop_bytes(model, tokens, tp), cp, tp, cluster)
    return _ring_exposed_s(hop, cp - 1, attention_fwd_s, attention_bwd_s)


def _a2a_s(model: ModelSpec, tokens: Column, tp: IntColumn, cp: IntColumn, cluster: ClusterSpec,
           attention_fwd_s: Column, attention_bwd_s: Column, gather_overlaps_local: bool
           ) -> tuple[np.ndarray, np.ndarray]:
    """``a2a`` (Ulysses): (forward, backward) seconds of the all-to-alls over cp, which nothing hides."""
    ulysses = _ulysses_s(model, tokens, tp, cp, tp, cluster)
    return ulysses, ulysses


def _allgather_s(model: ModelSpec, tokens: Column, tp: IntColumn, cp: IntColumn, cluster: ClusterSpec,
                 attention_fwd_s: Column, attention_bwd_s: Column, gather_overlaps_local: bool
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``allgather``: (forward, backward) exposed seconds of gathering the whole sequence's K, V (again in
    backward) and reduce-scattering dK, dV; the local chunk's attention hides the gather where it overlaps."""
    full_kv = ring_hop_bytes(model, tokens, tp) * cp
    kv_gather = collective_time_s("all_gather", full_kv, cp, tp, cluster)
    kv_reduce = collective_time_s("reduce_scatter", full_kv, cp, tp, cluster)
    local_share = np.where(gather_overlaps_local, 1.0 / cp, 0.0)
    return (np.maximum(kv_gather - local_share * attention_fwd_s, 0.0),
            np.maximum(kv_gather - local_share * attention_bwd_s, 0.0) + kv_reduce)


def _hierarchical_s(model: ModelSpec, tokens: Column, tp: IntColumn, cp: IntColumn, cluster: ClusterSpec,
                    attention_fwd_s: Column, attention_bwd_s: Column, gather_overlaps_local: bool
                    ) -> tuple[np.ndarray, np.ndarray]:
    """``a2a+p2p``: (forward, backward) exposed seconds of the all-to-all inside NVLink domains plus the ring
    between them."""
    inner = hierarchical_inner_size(model, tp, cp, cluster.domain_gpus)
    outer = cp // inner
    # After the inner all-to-all a GPU holds inner·T tokens of tp·inner-th of the heads: same hop bytes.
    hop = p2p_time_s(ring_hop_bytes(model, tokens, tp), outer, tp * inner, cluster)
    outer_fwd, outer_bwd = _ring_exposed_s(hop, outer - 1, attention_fwd_s, attention_bwd_s)
    inner_a2a = _ulysses_s(model, tokens, tp, inner, tp, cluster)
    return inner_a2a + outer_fwd, inner_a2a + outer_bwd


CpVariant = Callable[[ModelSpec, Column, IntColumn, IntColumn, ClusterSpec, Column, Column, bool],
                     tuple[np.ndarray, np.ndarray]]
"""One variant's (forward, backward) exposed seconds per layer per micro-batch (the ``_*_s`` functions above)."""
_VARIANTS: dict[int, CpVariant] = {CP_COMM_CODES["p2p"]: _ring_s, CP_COMM_CODES["a2a"]: _a2a_s,
                                   CP_COMM_CODES["allgather"]: _allgather_s, CP_COMM_CODES["a2a+p2p"]: _hierarchical_s}


def cp_comm_variants_s(model: ModelSpec, tokens: Column, tp: IntColumn, cp: IntColumn, cluster: ClusterSpec,
                       attention_fwd_s: Column, attention_bwd_s: Column, gather_overlaps_local: bool = False,
                       codes: Iterable[int] | None = None) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """(forward, backward) exposed seconds per layer per micro-batch of each variant in ``codes``
    (default: all), by CP_COMM_CODES.

    ``gather_overlaps_local`` says the all-gather variant runs under the local chunk's attention
    (PyTorch) rather than blocking (Transformer Engine). Rows with cp = 1 cost nothing."""
    cp = np.asarray(cp)
    split = cp > 1
    variants: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for code in sorted(_VARIANTS) if codes is None else sorted(codes):
        forward, backward = _VARIANTS[code](model, tokens, tp, cp, cluster, attention_fwd_s, attention_bwd_s,
                                            gather_overlaps_local)
        variants[code] = (np.where(split, forward, 0.0), np.where(split, backward, 0.0))
    return variants


def cp_comm_s(model: ModelSpec, tokens: Column, tp: IntColumn, cp: IntColumn, cp_comm: IntColumn,
              cluster: ClusterSpec, attention_fwd_s: Column, attention_bwd_s: Column,
              gather_overlaps_local: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) exposed seconds of the variant ``cp_comm`` (CP_COMM_CODES per row)."""
    arrays = np.broadcast_arrays(*(np.asarray(a) for a in (tokens, tp, cp, cp_comm, attention_fwd_s,
                                                           attention_bwd_s)))
    shape = arrays[0].shape
    tokens, tp, cp, code, attention_fwd_s, attention_bwd_s = (np.atleast_1d(a).ravel() for a in arrays)
    split = cp > 1  # only rows with context parallelism pay anything: price just those
    rows = slice(None) if split.all() else np.flatnonzero(split)
    forward, backward = np.zeros(len(tokens)), np.zeros(len(tokens))
    if split.any():
        # Price only the variants some row uses: this runs on every row of a search.
        variants = cp_comm_variants_s(model, tokens[rows], tp[rows], cp[rows], cluster, attention_fwd_s[rows],
                                      attention_bwd_s[rows], gather_overlaps_local,
                                      np.flatnonzero(np.bincount(code[rows].astype(np.int64))).tolist())
        chosen = [code[rows] == c for c in variants]
        forward[rows] = np.select(chosen, [fwd for fwd, _ in variants.values()], 0.0)
        backward[rows] = np.select(chosen, [bwd for _, bwd in variants.values()], 0.0)
    return forward.reshape(shape), backward.reshape(shape)
