"""The serving search's problem: a model, the GPU types it may use, the workload and the user's choices; the
setups (GPU type x engine x KV dtype) to price, what qualifies and how deployments are compared."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from paraplan.arrays import Column
from paraplan.cost_models.serving import ENGINE_TRAITS, EngineKnobs, weight_precision
from paraplan.errors import InputError
from paraplan.hardware_profiles import ClusterSpec
from paraplan.model_specs.model_spec import ModelSpec
from paraplan.planner.serving.pools import ServingSetup
from paraplan.planner.serving.search import Candidates, PoolSide, qualifies
from paraplan.planner.serving.space import ServingChoices, ServingWorkload

if TYPE_CHECKING:
    from paraplan.cost_models.serving_kernel_source import DeploymentTables

_PRECISION_MODES = {"bf16": "bf16", "fp8": "fp8", "fp4": "nvfp4"}
_CHECKPOINT_MODES = {"float8_e4m3fn": "fp8", "nvfp4": "nvfp4", "mxfp4": "mxfp4", "int4": "int4_wo"}


SetupKey = tuple[str, str, str]
"""(GPU name, engine, KV dtype): the deployments one set of measured engine tables prices."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredTables:
    """``--cost-model measured``: the profile store's engine tables per GPU type, engine and KV dtype."""

    store: str
    """The profile store they were read from."""
    by_setup: tuple[tuple[SetupKey, DeploymentTables | None], ...]
    """Each setup's tables; None where the store holds none (its deployments are priced analytically)."""

    def of(self, gpu: str, engine: str, kv_dtype: str) -> DeploymentTables | None:
        """The tables of one setup (None: analytical)."""
        return dict(self.by_setup).get((gpu, engine, kv_dtype))


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingProblem:
    """A model, the GPUs it may use (one or several types, each with its own count) and the traffic to serve."""

    model: ModelSpec
    """The model to serve, its linear-attention and indexer shapes (``model.mixers``) included."""
    clusters: tuple[ClusterSpec, ...]
    """The GPUs available, one cluster per GPU type; a plan uses at most each one's GPUs."""
    workload: ServingWorkload
    choices: ServingChoices
    prices_usd_per_gpu_hour: tuple[float | None, ...] = ()
    """Price per GPU-hour per cluster; () takes ``choices.price_usd_per_gpu_hour``, else the catalog's."""
    knobs: EngineKnobs = EngineKnobs()
    """The engine settings the user chose (memory fraction, CUDA graphs, speculative decoding)."""
    measured: MeasuredTables | None = None
    """Measured engine tables that price the terms they cover (``--cost-model measured``); None: analytical."""

    def tables_of(self, cluster: ClusterSpec, engine: str, kv_dtype: str) -> DeploymentTables | None:
        """The measured tables that price ``engine``'s deployments on ``cluster`` (None: analytical)."""
        return None if self.measured is None else self.measured.of(cluster.gpu.name, engine, kv_dtype)

    def priced_cluster(self, cluster: ClusterSpec, engine: str, kv_dtype: str) -> ClusterSpec:
        """``cluster`` carrying the tables of ``engine`` and ``kv_dtype`` on it, where measured ones price them."""
        tables = self.tables_of(cluster, engine, kv_dtype)
        return cluster if tables is None else replace(cluster, serving_kernels=tables.kernels)

    def price(self, index: int) -> float | None:
        """The price of cluster ``index``: the user's, else the catalog's list price, else None."""
        if self.prices_usd_per_gpu_hour:
            return self.prices_usd_per_gpu_hour[index]
        if self.choices.price_usd_per_gpu_hour is not None:
            return self.choices.price_usd_per_gpu_hour
        return self.clusters[index].gpu.price_usd_per_gpu_hour

    @property
    def gpus_text(self) -> str:
        """The GPUs available, in words: "16 h100-sxm + 8 h200-sxm"."""
        return " + ".join(f"{c.num_gpus} {c.gpu.name}" for c in self.clusters)


@dataclass(frozen=True, slots=True, kw_only=True)
class Priced:
    """One setup's per-sharding costs and price."""

    setup_id: int
    """Index of the setup in ``setups(problem)``."""
    cluster_id: int
    """Index of its GPU type in ``problem.clusters``."""
    side: PoolSide | None
    """None where no sharding of the setup fits its GPUs."""


def side_of(priced: list[Priced], setup: int) -> PoolSide:
    """The priced side of setup ``setup``: a candidate's setups always have one (no sharding fits: no candidate)."""
    side = priced[setup].side
    if side is None:
        raise ValueError(f"setup {setup} has no priced sharding, yet a candidate names it")
    return side


def quant_modes(model: ModelSpec, precision: str) -> tuple[str, str]:
    """(dense GEMM mode, routed-expert mode): the checkpoint's own format under ``auto`` (DeepSeek's 128x128 fp8
    blocks as fp8_block), else the precision asked for."""
    if precision != "auto":
        if precision not in _PRECISION_MODES:
            raise InputError(f"--precision {precision!r}: choose auto, bf16, fp8 or fp4")
        mode = _PRECISION_MODES[precision]
        return mode, mode
    weights = model.weights
    if weights is None:
        return "bf16", "bf16"
    mode = _CHECKPOINT_MODES.get(weights.weight_format, "bf16")
    if mode == "fp8" and weights.block_size:
        mode = "fp8_block"
    return mode, mode


def setups(problem: ServingProblem) -> list[tuple[int, ServingSetup]]:
    """(cluster index, setup) per GPU type, engine and KV dtype."""
    gemm, experts = quant_modes(problem.model, problem.choices.precision)
    return [(ci, ServingSetup(model=problem.model, cluster=problem.priced_cluster(cluster, engine, kv),
                              engine=problem.knobs.apply(ENGINE_TRAITS[engine]),
                              precision=weight_precision(problem.model, gemm, experts, kv), quant_modes=(gemm, experts),
                              kv_dtype=kv, isl=problem.workload.isl, osl=problem.workload.osl))
            for ci, cluster in enumerate(problem.clusters)
            for engine in problem.choices.engines for kv in problem.choices.kv_dtypes]


def feasible(c: Candidates, workload: ServingWorkload) -> np.ndarray:
    """Candidates that carry traffic and meet the targets (or, without targets, keep every queue at most 85%
    busy)."""
    return (c.tokens_per_s > 0) & qualifies(workload, c.ttft_s, c.tpot_s, c.busy)


def objective_key(objective: str, tokens_per_s: Column, gpus: Column, ttft_s: Column, tpot_s: Column, osl: float,
                  usd_per_hour: Column) -> Column:
    """Lower is better: GPU-seconds per output token (throughput), dollars per output token (cost) or a request's
    latency at the target percentile (latency)."""
    if objective == "latency":
        return ttft_s + osl * tpot_s
    with np.errstate(divide="ignore", invalid="ignore"):  # a deployment that carries nothing ranks last
        if objective == "cost":
            return np.asarray(usd_per_hour, dtype=float) / tokens_per_s
        return -tokens_per_s / gpus


def check_prices(problem: ServingProblem) -> None:
    """InputError where the cost objective meets a GPU type without a price."""
    if problem.choices.objective != "cost":
        return
    missing = [c.gpu.name for i, c in enumerate(problem.clusters) if problem.price(i) is None]
    if missing:
        raise InputError(f"--objective cost needs a price for {', '.join(missing)}: pass --price-per-gpu-hour USD "
                         "(one value, or one per --gpu type) (the catalog has none)")


