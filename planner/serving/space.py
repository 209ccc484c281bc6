"""What a serving search may choose: the workload, the user's choices, and every worker sharding an engine can run.

A worker is one engine instance: ``tp`` attention tensor parallel x ``dp`` attention data parallel ranks x ``pp``
pipeline stages; an MoE model's experts spread over the tp·dp GPUs as moe_tp x moe_ep. Each engine expresses a
subset (checked against their argument parsers, exporters/serving.py):

- vLLM: expert parallelism is on or off (``--enable-expert-parallel``: EP = TP x DP), so moe_ep is 1 or tp·dp;
  a worker over several nodes places whole data-parallel ranks (tp·pp GPUs) on a node.
- SGLang: ``--tp-size`` is the worker's GPUs, ``--dp-size`` with ``--enable-dp-attention`` splits attention, and
  ``--ep-size`` any divisor of the GPUs.
- TensorRT-LLM: ``enable_attention_dp`` makes attention tensor parallelism 1, so either dp = 1 or tp = 1.

Attention data parallelism serves MoE models (every engine documents it for DeepSeek/Qwen-MoE-style models);
dense models scale out by replicas instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args, overload

import numpy as np

from paraplan.arrays import Column
from paraplan.choices import SERVING_ENGINES, SERVING_OBJECTIVES
from paraplan.cost_models.inference_step import Sharding
from paraplan.errors import InputError
from paraplan.hardware_profiles import ClusterSpec
from paraplan.model_specs.model_spec import ModelSpec
from paraplan.planner.serving.arrivals import Arrivals
from paraplan.planner.serving.queueing import gamma_quantile

PERCENTILES = (50, 90, 99)
DeploymentMode = Literal["agg", "disagg"]
"""How a deployment runs: aggregated workers, or prefill and decode pools apart."""
MODES: tuple[DeploymentMode, ...] = get_args(DeploymentMode)
KvDtype = Literal["bf16", "fp8"]
"""The KV cache's element type."""
KV_DTYPES: tuple[KvDtype, ...] = get_args(KvDtype)
TARGET_REL_TOLERANCE = 1e-9
"""Slack on each latency target, relative, the same at screening and after exact pricing: a deployment can land on
its own target up to float rounding (a fleet worker bisected to the rate that just meets it), and rounding must
not refuse it. Far above double rounding (~1e-16), far below any latency difference that matters."""
CHUNK_GRID = (2048, 4096, 8192, 16384)
"""Max batched tokens per step searched (vLLM max_num_batched_tokens, SGLang chunked_prefill_size, TRT-LLM
max_num_tokens); 8192 is each engine's default on >= 70 GiB GPUs (cost_models/serving.ENGINE_TRAITS)."""
BATCH_GRID = (4, 8, 16, 32, 64, 128, 256, 512, 1024)
"""Running-batch caps searched below the engine's default (vLLM max_num_seqs, SGLang max_running_requests,
TRT-LLM max_batch_size): a lower cap trades time to first token for time per output token."""
PP_GRID = (1, 2, 4, 8)
LONGEST_QUANTILE = 0.99
"""Varying lengths: workers must admit a request at the p99 of each length (the engines refuse a longer one)."""
MAX_WORKER_GPUS = 128
"""Largest engine instance searched: 16 nodes of 8 GPUs, room for DeepSeek-style wide expert parallelism, which
runs one decode worker over several nodes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingWorkload:
    """The traffic a deployment must carry and the latency it must meet."""

    isl: int
    """Mean prompt (input) tokens per request."""
    osl: int
    """Mean generated (output) tokens per request."""
    isl_cv: float = 0.0
    """Coefficient of variation of prompt lengths (0: every prompt is isl tokens)."""
    osl_cv: float = 0.0
    """Coefficient of variation of output lengths."""
    concurrency: int | None = None
    """Closed loop: requests in flight over the whole deployment (a benchmark's --max-concurrency)."""
    arrivals: Arrivals | None = None
    """Open loop: the request arrival process (rate and burstiness)."""
    ttft_target_s: float | None = None
    """Time to first token the chosen percentile must meet."""
    tpot_target_s: float | None = None
    """Time per output token the chosen percentile must meet."""
    percentile: int = 50
    """Which percentile of requests the targets bind: 50, 90 or 99."""

    def __post_init__(self) -> None:
        if self.isl < 1 or self.osl < 1:
            raise InputError(f"--isl and --osl must be positive token counts, got {self.isl} and {self.osl}")
        if (self.concurrency is None) == (self.arrivals is None):
            raise InputError("give one of --concurrency C (requests in flight) or --rate R (requests per second)")
        if self.concurrency is not None and self.concurrency < 1:
            raise InputError(f"--concurrency must be a positive integer, got {self.concurrency}")
        if self.percentile not in PERCENTILES:
            raise InputError(f"--percentile must be 50, 90 or 99, got {self.percentile}")
        for name, value in (("--ttft-ms", self.ttft_target_s), ("--tpot-ms", self.tpot_target_s)):
            if value is not None and not value > 0:
                raise InputError(f"{name} must be a positive number of milliseconds")
        for name, value in (("--isl-dist", self.isl_cv), ("--osl-dist", self.osl_cv)):
            if not 0 <= value <= 10:
                raise InputError(f"{name}: a coefficient of variation between 0 and 10, got {value}")

    @property
    def max_model_len(self) -> int:
        """Longest sequence a worker must admit: prompt plus output at the mean lengths, or at each length's p99
        when the lengths vary (gamma-distributed with the given coefficients of variation)."""
        longest = self.isl * gamma_quantile(1.0, self.isl_cv, LONGEST_QUANTILE) \
            + self.osl * gamma_quantile(1.0, self.osl_cv, LONGEST_QUANTILE)
        return int(np.ceil(longest))

    @property
    def has_targets(self) -> bool:
        """Whether a TTFT or a TPOT target binds the deployment."""
        return self.ttft_target_s is not None or self.tpot_target_s is not None

    @overload
    def meets(self, ttft_s: float, tpot_s: float) -> bool: ...

    @overload
    def meets(self, ttft_s: np.ndarray, tpot_s: Column) -> np.ndarray: ...

    @overload
    def meets(self, ttft_s: float, tpot_s: np.ndarray) -> np.ndarray: ...

    def meets(self, ttft_s: Column, tpot_s: Column) -> bool | np.ndarray:
        """Whether latencies (seconds, at the bound percentile) meet the targets: both finite, and each within its
        target where one is set, up to TARGET_REL_TOLERANCE. Scalars give a bool, arrays a bool array of their
        broadcast shape."""
        ttft, tpot = np.asarray(ttft_s, dtype=float), np.asarray(tpot_s, dtype=float)
        ok = np.isfinite(ttft) & np.isfinite(tpot)
        if self.ttft_target_s is not None:
            ok &= ttft <= self.ttft_target_s * (1 + TARGET_REL_TOLERANCE)
        if self.tpot_target_s is not None:
            ok &= tpot <= self.tpot_target_s * (1 + TARGET_REL_TOLERANCE)
        return bool(ok) if ok.ndim == 0 else ok


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingChoices:
    """What the user fixed or left to the search."""

    engines: tuple[str, ...] = SERVING_ENGINES
    """Serving engines searched (SERVING_ENGINES; checked here, as the user named them)."""
    precision: str = "auto"
    """GEMM precision: auto (the checkpoint's own format), bf16, fp8 or fp4."""
    kv_dtypes: tuple[str, ...] = KV_DTYPES
    """KV cache dtypes searched (KV_DTYPES)."""
    modes: tuple[str, ...] = MODES
    """Deployment modes searched (MODES)."""
    fixed: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Axes the user fixed: tp, pp, ep, dp_attention, batch, chunk (each a tuple of allowed values)."""
    objective: str = "throughput"
    """What ranks the deployments (SERVING_OBJECTIVES)."""
    price_usd_per_gpu_hour: float | None = None
    """One price per GPU-hour for every GPU type, USD; None: the catalog's."""

    def __post_init__(self) -> None:
        unknown = [e for e in self.engines if e not in SERVING_ENGINES]
        if unknown or not self.engines:
            raise InputError(f"--engine {','.join(unknown) or '(none)'}: choose from {', '.join(SERVING_ENGINES)}")
        if self.objective not in SERVING_OBJECTIVES:
            raise InputError(f"--objective {self.objective!r}: choose throughput, cost or latency")
        bad = [m for m in self.modes if m not in MODES]
        if bad or not self.modes:
            raise InputError(f"--mode {','.join(bad) or '(none)'}: choose agg, disagg or both")
        bad = [k for k in self.kv_dtypes if k not in KV_DTYPES]
        if bad or not self.kv_dtypes:
            raise InputError(f"--kv-dtype {','.join(bad) or '(none)'}: choose bf16, fp8 or auto")


def _powers_of_two(limit: int) -> np.ndarray:
    return 2 ** np.arange(int(np.log2(max(limit, 1))) + 1)


def _allowed(values: np.ndarray, fixed: dict[str, tuple[int, ...]], axis: str) -> np.ndarray:
    return values[np.isin(values, fixed[axis])] if axis in fixed else values


def _grid(model: ModelSpec, cluster: ClusterSpec, fixed: dict[str, tuple[int, ...]], max_gpus: int) -> tuple:
    """Every (tp, dp, moe_ep, pp) combination before engine rules, as flat arrays."""
    limit = min(max_gpus, MAX_WORKER_GPUS)
    tps = _allowed(_powers_of_two(cluster.domain_gpus), fixed, "tp")
    dps = _allowed(_powers_of_two(limit) if model.is_moe else np.array([1]), fixed, "dp_attention")
    pps = _allowed(np.array([p for p in PP_GRID if p <= model.num_layers]), fixed, "pp")
    eps = _allowed(_powers_of_two(limit) if model.is_moe else np.array([1]), fixed, "ep")
    tp, dp, ep, pp = (a.ravel() for a in np.meshgrid(tps, dps, eps, pps, indexing="ij"))
    return tp, dp, ep, pp


def worker_shardings(model: ModelSpec, cluster: ClusterSpec, engine: str, fixed: dict[str, tuple[int, ...]],
                     max_gpus: int) -> Sharding:
    """Every worker sharding ``engine`` can run for ``model`` within ``max_gpus`` GPUs (arrays, one entry each)."""
    tp, dp, ep, pp = _grid(model, cluster, fixed, max_gpus)
    world = tp * dp
    ok = (model.num_heads % tp == 0) & (world * pp <= min(max_gpus, MAX_WORKER_GPUS)) & (world % ep == 0)
    if model.is_moe:
        ok &= model.num_experts % ep == 0
    if engine == "vllm" and model.is_moe:
        ok &= (ep == 1) | (ep == world)
    if engine == "vllm":  # a data-parallel rank lives on one node when a worker spans nodes
        node = cluster.gpus_per_node
        ok &= ~((dp > 1) & (world * pp > node) & (node % (tp * pp) != 0))
    if engine == "trtllm":
        ok &= (dp == 1) | (tp == 1)
    tp, dp, ep, pp = tp[ok], dp[ok], ep[ok], pp[ok]
    return Sharding.of(tp, dp, tp * dp / ep, ep, pp)


def batch_caps(engine_default: int, fixed: dict[str, tuple[int, ...]]) -> np.ndarray:
    """Running-batch caps searched: the fixed ones, else the grid below the engine's default and the default."""
    if "batch" in fixed:
        return np.array(sorted(fixed["batch"]), dtype=float)
    return np.array([b for b in BATCH_GRID if b < engine_default] + [engine_default], dtype=float)


def chunk_sizes(fixed: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
    """Max batched tokens per step searched."""
    return tuple(sorted(fixed["chunk"])) if "chunk" in fixed else CHUNK_GRID
