"""Mixed GPU types in one pipeline: which pipeline stages run on which GPU type, and how many layers
each stage holds.

Under Megatron's order stage s is one contiguous block of tp·cp·dp ranks, so it sits on whole nodes
of one type; a type with k such blocks of nodes runs k stages. For every distinct order of types
along the pipeline the stage-partition MILP finds the best split (layer time scaled by that type's
speed, memory against that type's HBM); the best of them is the answer, proven when every MILP is.
Compared with: the naive even split on the same mixed pipeline, and the faster type alone (its
nodes only, fewer data-parallel replicas, more micro-batches each).

Step time per pipeline: 1F1B with m micro-batches and stage times t_s, m·max t + (Σ t − max t)
(Narayanan et al. 2021, section 2.2; the formula cost_models.estimate uses); data-parallel and
optimizer time are not part of this comparison.

The whole step of a typed pipeline (``whole_step_s``): the search priced the plan with every stage on the
weakest type; the typed pipeline changes only the pipeline part, so the whole step is the search's step
plus the typed pipeline's time less the same pipeline's time on the weakest type (both from one stage
model, so the difference carries no bias of its own). Data-parallel and optimizer time stay as the search
priced them, on the weakest type and the slowest link: a bound, not a refinement.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from paraplan.errors import InputError
from paraplan.hardware_profiles import ClusterSpec
from paraplan.hardware_profiles.topology import Topology
from paraplan.planner.job import ParallelConfig, TrainingJob
from paraplan.planner.placement.solver import SolverConfig, SolveStats
from paraplan.planner.placement.stage_costs import stage_instance
from paraplan.planner.placement.stage_partition import baseline_split, fits, partition, stage_times

MIN_ORDER_LIMIT_S = 0.5
"""Least time one type order's MILP gets, seconds (CBC needs a few tenths to start and presolve): with more
orders than the limit has half-seconds, the call may run orders x MIN_ORDER_LIMIT_S."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MixedPipeline:
    """The answer and its two comparisons (step times in seconds, pipeline part only)."""

    stage_types: tuple[str, ...]
    """GPU type of each pipeline stage."""
    stage_layers: tuple[int, ...]
    """Decoder layers per stage."""
    step_s: float
    """1F1B step time of the answer."""
    naive_step_s: float
    """Same stage types, Megatron's even split."""
    naive_fits: bool
    """Whether the even split fits every stage's memory."""
    fast_only_type: str
    """The faster GPU type."""
    fast_only_step_s: float | None
    """The faster type's nodes alone at the same tp, pp, cp (None when they cannot hold one replica)."""
    weakest_type: str
    """The type the search priced every stage on (``Topology.weakest_node``)."""
    weakest_only_step_s: float
    """Every stage on the weakest type with the searched split: the pipeline part of the search's step."""
    stats: SolveStats
    """Slowest-stage objective and bound over all type orders, seconds."""


def whole_step_s(searched_step_s: float, mixed: MixedPipeline) -> float:
    """The plan's step on its typed pipeline: the search's step with its pipeline part replaced."""
    return searched_step_s - mixed.weakest_only_step_s + mixed.step_s


def pipeline_step_s(stage_s: Sequence[float] | np.ndarray, microbatches: float) -> float:
    """1F1B: m·max t + (Σ t − max t)."""
    slowest = max(stage_s)
    return microbatches * slowest + sum(stage_s) - slowest


def stage_blocks(topology: Topology, config: ParallelConfig) -> dict[str, int]:
    """Pipeline stages each GPU type can host (whole blocks of tp·cp·dp GPUs)."""
    per_node = topology.nodes[0].gpus_per_node
    block_gpus = config.tp * config.cp * config.dp
    if block_gpus % per_node:
        raise InputError(f"a pipeline stage of tp·cp·dp = {block_gpus} GPUs must fill whole {per_node}-GPU nodes to "
                         "run on one GPU type; choose a larger tp·dp")
    counts: dict[str, int] = {}
    for node in topology.nodes:
        counts[node.gpu.name] = counts.get(node.gpu.name, 0) + 1
    block_nodes = block_gpus // per_node
    if any(n % block_nodes for n in counts.values()) or sum(counts.values()) // block_nodes != config.pp:
        raise InputError(f"the node counts per GPU type {counts} do not split into pp = {config.pp} stages of "
                         f"{block_nodes} node(s); choose pp and tp·dp so each type holds whole stages")
    return {gpu: n // block_nodes for gpu, n in counts.items()}


def mixed_pipeline(job: TrainingJob, config: ParallelConfig, topology: Topology, solver: SolverConfig,
                   searched_split: tuple[int, ...] | None = None) -> MixedPipeline:
    """Best type order and split; InputError when the types cannot hold whole stages. ``searched_split``:
    the layers per stage the search priced (default Megatron's, ``baseline_split``)."""
    if config.vpp > 1 or config.pp < 2:
        raise InputError(f"GPU types per stage need pp >= 2 with one chunk per rank (vpp = 1), got pp = {config.pp}, "
                         f"vpp = {config.vpp}; constrain the search with --pp and --vpp 1")
    blocks = stage_blocks(topology, config)
    clusters = {gpu: _cluster_of(topology, gpu, config) for gpu in blocks}
    fast = min(clusters, key=lambda gpu: stage_instance(job, config, [clusters[gpu]]).layer_time_s[0])
    reference = clusters[fast]
    m = job.global_batch / (config.dp * config.mbs)
    best = None
    bounds, statuses = [], []
    orders = sorted(set(itertools.permutations([g for g, k in blocks.items() for _ in range(k)])))
    # The time limit covers the whole answer: each order gets its share.
    solver = solver.started()
    for done, order in enumerate(orders):
        instance = stage_instance(job, config, [clusters[g] for g in order], reference)
        each = solver.share(len(orders) - done)
        if each.remaining_s() < MIN_ORDER_LIMIT_S:
            each = each.restarted(MIN_ORDER_LIMIT_S)
        result = partition(instance, each)
        bounds.append(result.stats.bound)
        statuses.append(result.stats.status)
        step = pipeline_step_s(stage_times(instance, result.stage_layers), m)
        naive = baseline_split(instance.num_layers, instance.num_stages)
        naive_step = pipeline_step_s(stage_times(instance, naive), m)
        key = (result.slowest_s, step)  # the MILP objective first, then the step it gives
        if fits(instance, result.stage_layers) and (best is None or key < best[0]):
            best = (key, order, result, naive_step, fits(instance, naive))
    if best is None:
        raise InputError("no order of GPU types along the pipeline fits every stage's memory; use more stages or "
                         "recompute")
    (_, step), order, result, naive_step, naive_fits = best
    # Every type order was solved: the answer is proven when each of those MILPs was, and the
    # smallest of their bounds bounds them all.
    status = result.stats.status if result.stats.status == "heuristic" else \
        "optimal" if all(s == "optimal" for s in statuses) else "feasible"
    stats = SolveStats(status=status, objective=result.slowest_s, bound=min(min(bounds), result.slowest_s),
                       wall_s=result.stats.wall_s)
    weakest = topology.weakest_node().gpu.name
    weakest_instance = stage_instance(job, config, [clusters[weakest]] * config.pp, reference)
    split = searched_split or baseline_split(weakest_instance.num_layers, config.pp)
    return MixedPipeline(stage_types=order, stage_layers=result.stage_layers, step_s=float(step),
                         naive_step_s=float(naive_step),
                         naive_fits=naive_fits, fast_only_type=fast,
                         fast_only_step_s=_fast_only(job, config, blocks[fast], clusters[fast]),
                         weakest_type=weakest,
                         weakest_only_step_s=pipeline_step_s(stage_times(weakest_instance, split), m), stats=stats)


def _fast_only(job: TrainingJob, config: ParallelConfig, fast_blocks: int, cluster: ClusterSpec) -> float | None:
    """The fast type's nodes alone: pp stages of tp·cp·dp' GPUs, dp' = dp · fast blocks / pp."""
    if (config.dp * fast_blocks) % config.pp:
        return None
    dp = config.dp * fast_blocks // config.pp
    if dp < 1 or job.global_batch % (dp * config.mbs):
        return None
    fast_config = ParallelConfig(**{**config.as_dict(), "dp": dp})
    instance = stage_instance(job, fast_config, [cluster] * config.pp)
    split = baseline_split(instance.num_layers, config.pp)
    if not fits(instance, split):
        return None
    return float(pipeline_step_s(stage_times(instance, split), job.global_batch / (dp * config.mbs)))


def _cluster_of(topology: Topology, gpu: str, config: ParallelConfig) -> ClusterSpec:
    """The uniform cluster of ``gpu``'s nodes alone."""
    nodes = [i for i, node in enumerate(topology.nodes) if node.gpu.name == gpu]
    sub = Topology(name=f"{topology.name}:{gpu}", nodes=tuple(topology.nodes[i] for i in nodes),
                   leaf_oversubscription=topology.leaf_oversubscription,
                   inter_node_latency_s=topology.inter_node_latency_s,
                   intra_domain_latency_s=topology.intra_domain_latency_s)
    return sub.nominal_cluster()
