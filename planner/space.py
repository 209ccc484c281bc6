"""Enumerate every parallel configuration for a job and say why each rejected one is invalid.

Two passes keep the table small: first the (tp, pp, cp, ep, etp) shapes, then, for the valid shapes,
every (vpp, mbs, zero, recompute, sp). A shape rejected in the first pass counts for all the
second-pass combinations it would have had, so rejection counts are per candidate. Activation
offload exists only without pipeline parallelism or recompute, so a free search adds its
layer counts to those rows alone instead of multiplying the whole grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import numpy as np

from paraplan.cost_models.stages import edge_accounted_split, even_split
from paraplan.cost_models.table import RECOMPUTE_CODES, ConfigTable
from paraplan.hardware_profiles import ClusterSpec
from paraplan.planner.engines import EngineRules
from paraplan.planner.job import TrainingJob

AXES = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "zero", "recompute", "sp", "offload")
# A free search offloads 1/16, 2/16, ... of the layers: fine enough that the last step moves
# under 7% of the activations, coarse enough to add at most 15 rows per pp = 1 candidate.
OFFLOAD_STEPS = 16
# Micro-batches beyond this many tokens do not raise GEMM efficiency further; the free search
# stops there (a fixed --mbs may exceed it).
MAX_FREE_MICROBATCH_TOKENS = 131_072


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """Valid candidates plus the count of rejected candidates per reason."""

    table: ConfigTable
    rejected: dict[str, int]
    considered: int


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
    chunks = sorted(set(divisors(layers) + (divisors(layers + 2) if engine.edge_accounted_stages else [])))
    return {
        "tp": divisors(n), "pp": divisors(n), "cp": divisors(n), "dp": divisors(n), "vpp": chunks,
        "ep": divisors(job.model.num_experts) if job.model.is_moe else [1],
        "etp": divisors(cluster.domain_gpus) if job.model.is_moe else [1],
        "mbs": [d for d in divisors(job.global_batch) if d * job.seq_len <= MAX_FREE_MICROBATCH_TOKENS] or [1],
        "zero": list(engine.zero_stages),
        "recompute": [RECOMPUTE_CODES[mode] for mode in engine.recompute_modes],
        "sp": [0, 1],
        "offload": [0] + (offload_choices(layers) if engine.activation_offload else []),
    }


def _expert_reasons(job: TrainingJob, engine: EngineRules, tp, dp, cp, ep, etp) -> list[tuple]:
    model = job.model
    axes = {"tp": tp, "dp": dp, "cp": cp}
    carved = np.prod([axes[a] for a in engine.expert_ranks_from], axis=0)
    folded = np.where("tp" in engine.expert_ranks_from, ep * etp, ep)
    etp_ok = {"divisors_of_tp": tp % etp == 0, "one_or_tp": (etp == 1) | (etp == tp), "one": etp == 1}
    return [
        (((ep > 1) | (etp > 1)) & (not model.is_moe), "ep and etp apply to MoE models only"),
        (model.num_experts % ep != 0 if model.is_moe else ep < 1, "ep does not divide the routed experts"),
        (~etp_ok[engine.etp_choices], f"{engine.name} does not offer this expert tensor-parallel degree"),
        (carved % np.maximum(folded, 1) != 0,
         f"{engine.name} carves expert groups from {'·'.join(engine.expert_ranks_from)}: ep"
         f"{'·etp' if 'tp' in engine.expert_ranks_from else ''} must divide it"),
    ]


def _shape_reasons(job: TrainingJob, cluster: ClusterSpec, engine: EngineRules, tp, pp, cp, ep, etp) -> list[tuple]:
    model, n = job.model, cluster.num_gpus
    layers_ok = even_split(model.num_layers, pp, 1) | (
        engine.edge_accounted_stages & edge_accounted_split(model.num_layers, pp, 1))
    dp = np.where(n % (tp * pp * cp) == 0, n // (tp * pp * cp), 0)
    return [
        (n % (tp * pp * cp) != 0, "tp·pp·cp does not divide the GPU count"),
        (tp > cluster.domain_gpus, "tp spans more than one NVLink domain"),
        ((model.num_heads % tp != 0) | (model.num_kv_heads % tp != 0), "tp does not divide the attention/KV heads"),
        (~layers_ok, "pp does not divide the layers"),
        ((cp > 1) & (job.seq_len % (2 * cp) != 0), "cp does not divide seq_len/2 (load-balanced causal ring)"),
        ((cp > 1) & (not engine.supports_cp), f"{engine.name} has no context parallelism"),
        ((cp > 1) & (job.attention_kernel == "unfused"),
         "cp > 1 needs a flash-family attention kernel (ring attention)"),
        *_expert_reasons(job, engine, tp, dp, cp, ep, etp),
    ]


def _detail_reasons(job: TrainingJob, engine: EngineRules, t: dict[str, np.ndarray]) -> list[tuple]:
    tp, pp, dp, cp, vpp, mbs, zero, sp, offload = (
        t[k] for k in ("tp", "pp", "dp", "cp", "vpp", "mbs", "zero", "sp", "offload"))
    layers = job.model.num_layers
    batch_ok = job.global_batch % (dp * mbs) == 0
    micro = np.where(batch_ok, job.global_batch // np.maximum(dp * mbs, 1), 0)
    chunks_ok = even_split(layers, pp, vpp) | (engine.edge_accounted_stages & edge_accounted_split(layers, pp, vpp))
    sp_allowed = np.isin(sp, engine.sp_modes_with_tp)
    recompute_allowed = np.isin(t["recompute"], [RECOMPUTE_CODES[m] for m in engine.recompute_modes])
    return [
        (~np.isin(zero, engine.zero_stages), f"{engine.name} has no such ZeRO stage"),
        (~recompute_allowed, f"{engine.name} has no such recompute mode"),
        (~batch_ok, "global batch not divisible by dp·mbs"),
        ((vpp > 1) & (pp == 1), "vpp > 1 needs pp > 1"),
        ((vpp > 1) & (not engine.supports_interleaved), f"{engine.name} has no interleaved schedule"),
        ((vpp > 1) & ~chunks_ok, "layers per stage not divisible by vpp"),
        ((vpp > 1) & engine.interleaved_needs_pp_multiple & (micro % pp != 0),
         "interleaved schedule needs micro-batches divisible by pp"),
        ((sp == 1) & (tp == 1), "sequence parallel needs tp > 1"),
        ((sp == 0) & (tp > 1) & job.model.is_moe, "MoE layers with tp > 1 need sequence parallel"),
        ((tp > 1) & ~sp_allowed, f"{engine.name} does not offer this sequence-parallel setting"),
        ((zero > 0) & (dp * cp == 1), "ZeRO stage > 0 with dp·cp = 1 is the same as stage 0"),
        ((zero > engine.max_zero_with_pp) & (pp > 1), f"{engine.name} cannot combine this ZeRO stage with pp"),
        ((offload > 0) & (not engine.activation_offload), f"{engine.name} has no activation offloading"),
        ((offload > 0) & (pp > 1), "activation offload needs pp = 1"),
        ((offload > 0) & (t["recompute"] > 0), "activation offload cannot be combined with recompute"),
        (offload >= layers, "activation offload must leave at least one layer on the GPU"),
    ]


def _first_reason(reasons: list[tuple], size: int) -> np.ndarray:
    """Index of the first failing reason per row, -1 when valid."""
    code = np.full(size, -1, dtype=np.int64)
    for index, (mask, _) in reversed(list(enumerate(reasons))):
        code = np.where(np.broadcast_to(mask, (size,)), index, code)
    return code


def _count(counts: dict[str, int], reasons: list[tuple], code: np.ndarray, weight) -> None:
    for index, (_, label) in enumerate(reasons):
        hits = int(np.sum(np.where(code == index, weight, 0)))
        if hits:
            counts[label] = counts.get(label, 0) + hits


def enumerate_space(job: TrainingJob, cluster: ClusterSpec, engine: EngineRules,
                    fixed: dict[str, list[int]] | None = None) -> SearchSpace:
    """All valid configurations, with ``fixed`` axes limited to the given values."""
    values = {**_free_values(job, cluster, engine), **(fixed or {})}
    # A free offload axis: the grid takes 0 and the offloading variants join the rows that allow them.
    extra_offload = [] if "offload" in (fixed or {}) else [v for v in values["offload"] if v > 0]
    if extra_offload:
        values["offload"] = [0]
    detail_axes = ("vpp", "mbs", "zero", "recompute", "sp", "offload")
    per_shape = int(np.prod([len(values[a]) for a in detail_axes]))
    shape_axes = ("tp", "pp", "cp", "ep", "etp")
    grid = np.array(list(product(*(values[a] for a in shape_axes))), dtype=np.int64).reshape(-1, len(shape_axes))
    tp, pp, cp, ep, etp = grid.T
    counts: dict[str, int] = {}
    reasons = _shape_reasons(job, cluster, engine, tp, pp, cp, ep, etp)
    code = _first_reason(reasons, len(grid))
    dp = np.where(code == -1, cluster.num_gpus // (tp * pp * cp), 0)
    wrong_dp = (code == -1) & ~np.isin(dp, values["dp"])
    code = np.where(wrong_dp, len(reasons), code)
    reasons.append((wrong_dp, "dp differs from the requested values"))
    _count(counts, reasons, code, per_shape)
    keep = code == -1
    detail = np.array(list(product(*(values[a] for a in detail_axes))), dtype=np.int64).reshape(-1, len(detail_axes))
    shapes = np.stack([tp[keep], pp[keep], dp[keep], cp[keep], ep[keep], etp[keep]], axis=1)
    rows = np.concatenate([np.repeat(shapes, len(detail), axis=0), np.tile(detail, (len(shapes), 1))], axis=1)
    if extra_offload:
        offloadable = rows[(rows[:, 1] == 1) & (rows[:, shapes.shape[1] + detail_axes.index("recompute")] == 0)]
        variants = np.repeat(offloadable, len(extra_offload), axis=0)
        variants[:, -1] = np.tile(extra_offload, len(offloadable))
        rows = np.concatenate([rows, variants])
    columns = dict(zip(("tp", "pp", "dp", "cp", "ep", "etp") + detail_axes, rows.T))
    detail_reasons = _detail_reasons(job, engine, columns)
    code = _first_reason(detail_reasons, len(rows))
    _count(counts, detail_reasons, code, 1)
    valid = code == -1
    table = ConfigTable.from_columns(**{axis: columns[axis][valid] for axis in AXES})
    considered = len(grid) * per_shape + len(rows) - len(shapes) * len(detail)
    return SearchSpace(table=table, rejected=counts, considered=considered)
