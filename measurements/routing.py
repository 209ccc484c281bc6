"""MoE routing statistics: how many tokens each expert of each MoE layer received.

One CSV format, read here and written by paraplan itself (``paraplan ingest`` stores it, the
expert-placement optimizer and the MoE cost model read it):

    layer,expert,next_expert,tokens
    0,0,,1834          # MoE layer 0, expert 0 received 1834 token-routings
    0,1,,912
    0,0,5,301          # of those, 301 went to expert 5 of MoE layer 1 (co-activation)

``layer`` counts MoE layers from 0 (dense layers are not listed); ``expert`` is the routed
expert's index; ``tokens`` counts token-to-expert assignments (a token routed top-k counts k
times per layer). Rows with ``next_expert`` empty give the load; rows with it filled give the
consecutive-layer co-activation, which is optional. Every (layer, expert) load must be present.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from paraplan.errors import InputError
from paraplan.files import read_user_csv
from paraplan.limits import MAX_COACTIVATION_CELLS, MAX_EXPERTS, MAX_MOE_LAYERS

_Key = TypeVar("_Key", bound=tuple[int, ...])

ROUTING_COLUMNS = ("layer", "expert", "next_expert", "tokens")
MAX_ROUTING_BYTES = 256 << 20
"""A routing CSV: DeepSeek-V3's loads are 15,000 rows and its full co-activation at most 3.7 million (about 60 MB);
256 MiB leaves room for larger sparse tables without reading a wrong multi-GB file."""
MAX_ROUTING_ROWS = 1 << 24
"""Rows: the co-activation table of the largest layer x expert grid MAX_COACTIVATION_CELLS allows, plus loads."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RoutingStats:
    """Tokens per expert per MoE layer, and optionally between consecutive MoE layers."""

    tokens_per_expert: np.ndarray
    """Shape (MoE layers, experts): token-to-expert assignments counted over the sample."""
    coactivation: np.ndarray | None = None
    """Shape (MoE layers − 1, experts, experts): [l, i, j] counts tokens routed to expert i of
    layer l and to expert j of layer l + 1; None when not measured."""
    source: str = "measured"
    """Where the numbers come from: a file path or a synthetic spec such as ``zipf:1.2``."""

    def __post_init__(self) -> None:
        load = self.tokens_per_expert
        if load.ndim != 2 or load.shape[0] < 1 or load.shape[1] < 1:
            raise ValueError("routing statistics need a (layers, experts) table of token counts")
        if (load < 0).any():
            raise ValueError("routing token counts must not be negative")
        if self.coactivation is not None:
            layers, experts = load.shape
            if self.coactivation.shape != (max(layers - 1, 0), experts, experts):
                raise ValueError(
                    f"co-activation must have shape ({layers - 1}, {experts}, {experts}), got {self.coactivation.shape}"
                )

    @property
    def num_layers(self) -> int:
        """MoE layers covered."""
        return int(self.tokens_per_expert.shape[0])

    @property
    def num_experts(self) -> int:
        """Routed experts per layer."""
        return int(self.tokens_per_expert.shape[1])

    def load_frac(self) -> np.ndarray:
        """Each expert's share of its layer's assignments, shape (layers, experts); rows sum to 1."""
        totals = self.tokens_per_expert.sum(axis=1, keepdims=True)
        return self.tokens_per_expert / np.where(totals > 0, totals, 1.0)

    def rank_imbalance(self, ep: int) -> np.ndarray:
        """Per layer: the busiest EP rank's tokens over the mean rank's, with experts placed
        contiguously (Megatron's default: rank r holds experts [r·E/ep, (r+1)·E/ep))."""
        if ep < 1 or self.num_experts % ep:
            raise ValueError(f"ep={ep} must divide the {self.num_experts} experts")
        per_rank = self.tokens_per_expert.reshape(self.num_layers, ep, -1).sum(axis=2)
        mean = per_rank.mean(axis=1)
        return per_rank.max(axis=1) / np.where(mean > 0, mean, 1.0)


def read_routing_csv(path: Path) -> RoutingStats:
    """Parse the routing CSV at ``path``; InputError names the line of anything malformed."""
    rows = read_user_csv(Path(path), MAX_ROUTING_BYTES, "routing statistics file", max_rows=MAX_ROUTING_ROWS)
    if not rows or tuple(cell.strip() for cell in rows[0]) != ROUTING_COLUMNS:
        raise InputError(f"{path}: line 1 must be the header {','.join(ROUTING_COLUMNS)}")
    loads: dict[tuple[int, int], float] = {}
    pairs: dict[tuple[int, int, int], float] = {}
    for line_no, row in enumerate(rows[1:], start=2):
        if not row or all(not cell.strip() for cell in row):
            continue
        layer, expert, next_expert, tokens = _parse_row(path, line_no, row)
        if next_expert is None:
            _put_new(loads, (layer, expert), tokens, f"{path}: line {line_no} repeats layer, expert")
        else:
            _put_new(pairs, (layer, expert, next_expert), tokens, f"{path}: line {line_no} repeats a pair")
    return _assemble(path, loads, pairs)


def _put_new(table: dict[_Key, float], key: _Key, tokens: float, repeats: str) -> None:
    """``table[key] = tokens``; InputError (``repeats`` and the key) when the file gave ``key`` before."""
    if key in table:
        raise InputError(f"{repeats} {key}")
    table[key] = tokens


def _parse_row(path: Path, line_no: int, row: list[str]) -> tuple[int, int, int | None, float]:
    if len(row) != len(ROUTING_COLUMNS):
        raise InputError(f"{path}: line {line_no} has {len(row)} fields, expected {len(ROUTING_COLUMNS)}")
    try:
        layer, expert = int(row[0]), int(row[1])
        next_expert = int(row[2]) if row[2].strip() else None
        tokens = float(row[3])
    except ValueError as exc:
        raise InputError(f"{path}: line {line_no}: layer, expert, next_expert must be integers and tokens "
                         "a number") from exc
    if min(layer, expert, 0 if next_expert is None else next_expert) < 0 or not math.isfinite(tokens) or tokens < 0:
        raise InputError(f"{path}: line {line_no}: indices and tokens must be non-negative finite numbers")
    if layer >= MAX_MOE_LAYERS or max(expert, next_expert or 0) >= MAX_EXPERTS:
        raise InputError(f"{path}: line {line_no}: layer must be below {MAX_MOE_LAYERS:,} and experts below "
                         f"{MAX_EXPERTS:,} (MoE layers and routed experts are counted from 0)")
    return layer, expert, next_expert, tokens


def _assemble(path: Path, loads: dict[tuple[int, int], float],
              pairs: dict[tuple[int, int, int], float]) -> RoutingStats:
    if not loads:
        raise InputError(f"{path}: no load rows (rows with an empty next_expert)")
    num_layers = 1 + max(layer for layer, _ in loads)
    num_experts = 1 + max(expert for _, expert in loads)
    if len(loads) != num_layers * num_experts:
        raise InputError(f"{path}: expected a load row for each of {num_layers} layers x {num_experts} experts, "
                         f"found {len(loads)}")
    load = np.zeros((num_layers, num_experts))
    for (layer, expert), tokens in loads.items():
        load[layer, expert] = tokens
    coactivation = None
    if pairs and max(num_layers - 1, 0) * num_experts**2 > MAX_COACTIVATION_CELLS:
        raise InputError(f"{path}: co-activation of {num_layers} layers x {num_experts} experts is more than "
                         f"{MAX_COACTIVATION_CELLS:,} cells; drop the pair rows or sample fewer layers")
    if pairs:
        coactivation = np.zeros((max(num_layers - 1, 0), num_experts, num_experts))
        for (layer, expert, next_expert), tokens in pairs.items():
            if layer >= num_layers - 1 or max(expert, next_expert) >= num_experts:
                raise InputError(f"{path}: co-activation pair {(layer, expert, next_expert)} is outside "
                                 f"{num_layers} layers x {num_experts} experts")
            coactivation[layer, expert, next_expert] = tokens
    return RoutingStats(tokens_per_expert=load, coactivation=coactivation, source=str(path))


def write_routing_csv(stats: RoutingStats, path: Path) -> None:
    """Write ``stats`` in the format :func:`read_routing_csv` reads (loads, then pairs)."""
    lines = [",".join(ROUTING_COLUMNS)]
    for layer, expert in np.ndindex(*stats.tokens_per_expert.shape):
        lines.append(f"{layer},{expert},,{stats.tokens_per_expert[layer, expert]:g}")
    if stats.coactivation is not None:
        for layer, expert, next_expert in zip(*np.nonzero(stats.coactivation)):
            lines.append(f"{layer},{expert},{next_expert},{stats.coactivation[layer, expert, next_expert]:g}")
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def parse_skew(spec: str) -> float:
    """The exponent of a ``zipf:S`` skew spec (S ≥ 0; 0 is a uniform router)."""
    kind, _, value = spec.partition(":")
    try:
        exponent = float(value)
    except ValueError:
        exponent = -1.0
    if kind != "zipf" or not math.isfinite(exponent) or exponent < 0:
        raise InputError(f"skew {spec!r} is not understood; write zipf:S with S >= 0, e.g. zipf:1.2")
    return exponent


def zipf_routing(num_layers: int, num_experts: int, exponent: float, tokens_per_layer: float,
                 seed: int = 0) -> RoutingStats:
    """Synthetic skew: in each layer the expert of popularity rank r gets tokens ∝ 1 / r^exponent,
    with the popularity order shuffled per layer (seeded), co-activation independent across layers."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, num_experts + 1) ** exponent
    frac = np.stack([rng.permutation(weights) for _ in range(num_layers)])
    frac /= frac.sum(axis=1, keepdims=True)
    load = frac * tokens_per_layer
    coactivation = load[:-1, :, None] * frac[1:, None, :]
    return RoutingStats(tokens_per_expert=load, coactivation=coactivation, source=f"zipf:{exponent:g} (synthetic)")
