"""Frozen specs of GPUs and clusters, in SI units."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

DTYPES = ("bf16", "fp16", "fp8", "fp4", "tf32")
ATTENTION_KERNELS = ("fused", "flash", "unfused")
"""Attention implementations the cost model knows:
fused: cuDNN fused attention through Transformer Engine (FlashAttention-3-class on Hopper and newer);
flash: FlashAttention-2-family kernels (flash-attn 2, PyTorch SDPA flash backend, Triton ports);
unfused: scores materialised in HBM (batched GEMMs plus a softmax kernel), as before 2022."""
KERNEL_STACKS = ("transformer_engine", "pytorch")
"""Where an engine's GEMM kernels come from: Transformer Engine modules (Megatron-LM, NeMo), or
PyTorch-native modules (torchtitan, DeepSpeed, llm-foundry), whose fp8 path casts unfused."""
FLASH_FAMILY_KERNELS = ("fused", "flash")
"""Kernels whose speed is a calibrated fraction of peak; ``unfused`` is costed from GEMMs and HBM."""
BUILTIN = "built-in"
"""The ``origin`` of catalog entries shipped with paraplan (as opposed to a user hardware file's path)."""
FITTED = "fitted"
"""An efficiency fraction fitted to this GPU's own measured runs (efficiency.yaml's entry for it)."""
ASSUMED = "assumed"
"""A fraction this GPU's efficiency.yaml entry sets without a fit (listed under ``assumed``; its source says why)."""
DEFAULTED = "default"
"""A fraction from efficiency.yaml's ``defaults``: nothing measured on this GPU or a sibling informed it."""
BORROWED = "borrowed:"
"""Prefix of a fraction fitted to another GPU and used on this one, followed by that GPU: ``borrowed:h100-sxm``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EfficiencySpec:
    """How close real kernels get to the datasheet on this GPU (fractions 0–1, seconds).

    These are the few physical constants the analytical cost model calibrates per GPU; each
    entry in ``efficiency.yaml`` carries the measurement or the published run it comes from.
    """

    gemm_peak_frac: dict[str, float]
    """Fraction of the dense datasheet peak that a large, well-shaped GEMM reaches, per dtype."""
    stack_gemm_peak_frac: dict[str, dict[str, float]]
    """Per kernel stack (``KERNEL_STACKS``), dtypes whose GEMM fraction differs from ``gemm_peak_frac``."""
    gemm_half_dim: float
    """A GEMM dimension of this size runs at half the large-GEMM rate (tile/wave saturation)."""
    attention_peak_frac: dict[str, float]
    """Fraction of the 16-bit peak that each flash-family attention kernel reaches at long sequences
    (keys in ``FLASH_FAMILY_KERNELS``)."""
    hbm_frac: float
    """Fraction of datasheet HBM bandwidth that memory-bound element-wise kernels reach."""
    nvlink_frac: float
    """Fraction of one-direction NVLink bandwidth that NCCL collectives reach as bus bandwidth."""
    nic_frac: float
    """Fraction of the NIC line rate that NCCL collectives reach as bus bandwidth across nodes."""
    host_link_frac: float
    """Fraction of the host link's one-direction rate that pinned-memory copies reach."""
    kernel_overhead_s: float
    """Fixed launch/synchronisation cost per kernel, seconds."""
    source: str
    """Where these numbers come from."""
    fraction_origin: dict[str, str] = field(default_factory=dict, compare=False)
    """Where each GEMM and attention fraction comes from, keyed by its efficiency.yaml path (``gemm_peak_frac.bf16``,
    ``stack_gemm_peak_frac.pytorch.fp8``, ``attention_peak_frac.flash``): FITTED, ASSUMED, DEFAULTED or BORROWED
    and a GPU; a key not listed is DEFAULTED. Not part of equality: GPUs reading the same constants compare equal."""
    run_gpus: int | None = None
    """The GPU count of the job these fractions were scaled for (run_factor.efficiency_at_scale); None as
    efficiency.yaml states them (fitted to runs on 8 or more GPUs)."""
    run_factors: dict[str, float] = field(default_factory=dict, compare=False)
    """Per efficiency.yaml path, the distributed-run factor (raised to the job's share) the scaled fractions carry:
    what a measured kernel time is divided by for that job (cost_models/learned/provider.py)."""

    def origin(self, path: str) -> str:
        """Where the fraction at efficiency.yaml ``path`` comes from (FITTED, ASSUMED, DEFAULTED, BORROWED...)."""
        return self.fraction_origin.get(path, DEFAULTED)

    def gemm_path(self, dtype: str, kernel_stack: str) -> str:
        """The efficiency.yaml path of the GEMM fraction ``analytical_rates`` reads for ``dtype`` on ``kernel_stack``
        (the stack's override, else the shared fraction, else the bf16 one)."""
        if dtype in self.stack_gemm_peak_frac.get(kernel_stack, {}):
            return f"stack_gemm_peak_frac.{kernel_stack}.{dtype}"
        return f"gemm_peak_frac.{dtype if dtype in self.gemm_peak_frac else 'bf16'}"

    def attention_path(self, kernel: str, kernel_stack: str) -> str:
        """The path of the attention rate's fraction: the kernel's own, or for ``unfused`` the 16-bit GEMM fraction
        it is costed from."""
        if kernel in FLASH_FAMILY_KERNELS:
            return f"attention_peak_frac.{kernel}"
        return self.gemm_path("bf16", kernel_stack)

    def gemm_origin(self, dtype: str, kernel_stack: str) -> str:
        """Origin of the GEMM fraction ``analytical_rates`` reads for ``dtype`` on ``kernel_stack``."""
        return self.origin(self.gemm_path(dtype, kernel_stack))

    def attention_origin(self, kernel: str, kernel_stack: str) -> str:
        """Origin of the attention rate's fraction (``attention_path``)."""
        return self.origin(self.attention_path(kernel, kernel_stack))

    def borrowed_as(self, gpu: str) -> EfficiencySpec:
        """These constants as another GPU uses them: a fraction fitted to ``gpu`` is borrowed from it there."""
        return replace(self, fraction_origin={path: f"{BORROWED}{gpu}" if origin == FITTED else origin
                                              for path, origin in self.fraction_origin.items()})


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """Whether the two efficiency fractions a training job reads on a GPU were fitted to it: its GEMM fraction
    (for its precision and kernel stack) and its attention kernel's. Each is FITTED, ASSUMED, DEFAULTED or
    ``borrowed:GPU``."""

    gpu: str
    """Catalog name of the GPU."""
    precision: str
    """The GEMM dtype."""
    gemm: str
    """Origin of the GEMM fraction."""
    attention_kernel: str
    """``fused``, ``flash`` or ``unfused`` (costed at the bf16 GEMM fraction)."""
    attention: str
    """Origin of the attention fraction."""

    @property
    def status(self) -> str:
        """``calibrated`` (both fitted, to this GPU or the one they are borrowed from), ``uncalibrated`` (neither:
        defaults or assumed) or ``partly calibrated``."""
        unfitted = sum(origin in (DEFAULTED, ASSUMED) for origin in (self.gemm, self.attention))
        return ("calibrated", "partly calibrated", "uncalibrated")[unfitted]

    def as_dict(self) -> dict[str, str]:
        """The plan document's ``provenance.efficiency_calibration``."""
        return {"gpu": self.gpu, "status": self.status, "precision": self.precision, "gemm": self.gemm,
                "attention_kernel": self.attention_kernel, "attention": self.attention}

    def text(self) -> str:
        """One phrase, e.g. 'h200-sxm: uncalibrated (bf16 GEMM and flash attention fractions: defaults)'."""
        return f"{self.gpu}: {self.detail()}"

    def detail(self) -> str:
        """The phrase without the GPU: 'uncalibrated (bf16 GEMM and flash attention fractions: defaults)'."""
        gemm, attention = f"{self.precision} GEMM", f"{self.attention_kernel} attention"

        def said(origin: str, plural: bool) -> str:
            if origin.startswith(BORROWED):
                return f"borrowed from {origin[len(BORROWED):]}"
            return {DEFAULTED: "defaults" if plural else "default", ASSUMED: "assumed, not fitted"}.get(origin, origin)

        if self.gemm == self.attention:
            parts = f"{gemm} and {attention} fractions: {said(self.gemm, True)}"
        else:
            parts = f"{gemm} fraction: {said(self.gemm, False)}; {attention}: {said(self.attention, False)}"
        return f"{self.status} ({parts})"


@dataclass(frozen=True, slots=True, kw_only=True)
class GPUSpec:
    """One GPU model, datasheet numbers in SI units."""

    name: str
    """Catalog name, e.g. ``h100-sxm``."""
    display_name: str
    """Marketing name."""
    vendor: str
    """``nvidia`` or ``amd``."""
    architecture: str
    """Chip generation, e.g. ``hopper``."""
    peak_flops_per_s: dict[str, float]
    """Dense tensor-core peak per dtype, FLOP/s. Missing dtype = the hardware lacks it."""
    hbm_bytes: float
    """HBM capacity, bytes."""
    hbm_bytes_per_s: float
    """HBM bandwidth, bytes/s."""
    nvlink_bytes_per_s: float
    """Scale-up link bandwidth per GPU, one direction, bytes/s."""
    nic_bytes_per_s: float
    """Default scale-out NIC bandwidth per GPU, one direction, bytes/s."""
    host_link_bytes_per_s: float
    """The GPU's link to host memory (PCIe or NVLink-C2C), one direction, bytes/s."""
    host_memory_bytes: float
    """Host (CPU) memory per GPU on the vendor's reference system, bytes."""
    price_usd_per_gpu_hour: float | None
    """A public list price per GPU-hour in US dollars with its date in ``sources["price"]``; None where
    the catalog has no sourced figure (run costs are then null unless the user gives a price)."""
    board_power_w: float | None = None
    """Board power (max thermal design power) in watts from the vendor datasheet (``sources["power"]``);
    None where none is sourced (run energy is then null)."""
    efficiency: EfficiencySpec
    """Achieved fractions of the datasheet (see :class:`EfficiencySpec`)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Citation per datasheet number."""
    origin: str = BUILTIN
    """Where the entry comes from: ``built-in`` (gpus.yaml) or the path of the user hardware file."""
    efficiency_from: str = "defaults"
    """Whose constants ``efficiency`` holds: a built-in GPU's name (its efficiency.yaml entry) or
    ``defaults`` (efficiency.yaml's defaults)."""

    def __post_init__(self) -> None:
        for dtype, peak in self.peak_flops_per_s.items():
            if dtype not in DTYPES or peak <= 0:
                raise ValueError(f"{self.name}: peak for {dtype!r} must be a positive FLOP/s of {DTYPES}")
        for label in ("hbm_bytes", "hbm_bytes_per_s", "nvlink_bytes_per_s", "nic_bytes_per_s", "host_link_bytes_per_s",
                      "host_memory_bytes"):
            if getattr(self, label) <= 0:
                raise ValueError(f"{self.name}: {label} must be positive")
        for label in ("price_usd_per_gpu_hour", "board_power_w"):
            value = getattr(self, label)
            if value is not None and not value > 0:
                raise ValueError(f"{self.name}: {label} must be positive or None, got {value!r}")

    def calibration(self, precision: str, attention_kernel: str, kernel_stack: str) -> Calibration:
        """Whether the GEMM and attention fractions a job at ``precision`` with ``attention_kernel`` on
        ``kernel_stack`` reads on this GPU were fitted to it."""
        eff = self.efficiency
        return Calibration(gpu=self.name, precision=precision, gemm=eff.gemm_origin(precision, kernel_stack),
                           attention_kernel=attention_kernel, attention=eff.attention_origin(attention_kernel,
                                                                                            kernel_stack))

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``; ValueError if this GPU has no such tensor-core mode."""
        if dtype not in self.peak_flops_per_s:
            have = ", ".join(sorted(self.peak_flops_per_s))
            raise ValueError(f"{self.name} has no {dtype} tensor cores (it has: {have})")
        return self.peak_flops_per_s[dtype]


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """A homogeneous cluster: identical nodes, an NVLink domain, a scale-out fabric."""

    name: str
    """Built-in name, file name or ``<gpu>x<N>`` for the quick form."""
    gpu: GPUSpec
    """The GPU in every node."""
    num_nodes: int
    """Number of nodes."""
    gpus_per_node: int
    """GPUs per node (per compute tray on NVL72 racks)."""
    nvlink_domain_gpus: int
    """GPUs that share one NVLink/NVSwitch domain (8 on DGX, 72 on NVL72 racks)."""
    nic_bytes_per_s_per_gpu: float
    """Scale-out bandwidth per GPU, one direction, bytes/s."""
    inter_node_latency_s: float
    """Per-message latency across the scale-out fabric, seconds."""
    intra_domain_latency_s: float
    """Per-message latency inside an NVLink domain, seconds."""
    oversubscription: float = 1.0
    """Fabric oversubscription ratio (>= 1; 1 = full bisection)."""
    host_memory_bytes_per_gpu: float | None = None
    """Host (CPU) memory per GPU for offloaded activations; None = the GPU's reference system."""
    collective_time_fn: Callable[..., tuple[np.ndarray, np.ndarray]] | None = None
    """A learned collective model: (kind, bytes, group size, members per NVLink domain) -> (mask, seconds)
    arrays; where the mask is true its seconds replace the analytical ones (cost_models.learned)."""
    collective_source: str = ""
    """Which learned collective models ``collective_time_fn`` holds, for provenance."""
    serving_kernels: Any | None = None
    """Measured serving-engine kernel tables (a ``cost_models.serving_kernels.ServingKernels``: one engine, version
    and quantization on this GPU) that price an inference step's terms where they cover them; None: analytical."""

    def __post_init__(self) -> None:
        for label in ("num_nodes", "gpus_per_node", "nvlink_domain_gpus"):
            value = getattr(self, label)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"cluster {self.name}: {label} must be a positive integer, got {value!r}")
        if self.nvlink_domain_gpus % self.gpus_per_node:
            raise ValueError(
                f"cluster {self.name}: an NVLink domain of {self.nvlink_domain_gpus} GPUs must hold whole "
                f"nodes of {self.gpus_per_node} GPUs"
            )
        if self.nic_bytes_per_s_per_gpu <= 0:
            raise ValueError(f"cluster {self.name}: NIC bandwidth must be positive")
        if self.inter_node_latency_s < 0 or self.intra_domain_latency_s < 0:
            raise ValueError(f"cluster {self.name}: latencies must not be negative")
        if self.host_memory_bytes_per_gpu is not None and self.host_memory_bytes_per_gpu <= 0:
            raise ValueError(f"cluster {self.name}: host memory per GPU must be positive")
        if self.oversubscription < 1:
            raise ValueError(f"cluster {self.name}: oversubscription must be >= 1, got {self.oversubscription}")

    @property
    def num_gpus(self) -> int:
        """Total GPUs."""
        return self.num_nodes * self.gpus_per_node

    @property
    def host_memory_per_gpu(self) -> float:
        """Host memory available to each GPU's offloaded activations, bytes."""
        return self.gpu.host_memory_bytes if self.host_memory_bytes_per_gpu is None else self.host_memory_bytes_per_gpu

    @property
    def domain_gpus(self) -> int:
        """GPUs in one NVLink domain as built (a small cluster may not fill a rack)."""
        return min(self.nvlink_domain_gpus, self.num_gpus)
