"""Kernel speed and the distributed-run factor: the two things a fitted efficiency fraction folds together.

efficiency.yaml's fitted GEMM and attention fractions come from published runs on 8 to 3,072 GPUs. Each is the
speed of the kernel times what a distributed run loses around it: collectives sharing SMs and HBM with the
kernels they overlap, ranks waiting for the slowest one at every synchronisation, the run's own software stack.
The defaults are the kernel alone (isolated-kernel measurements; efficiency.yaml says which). This module keeps
the two apart:

- **kernel fraction** = max(default, fraction): what the GPU's kernels reach with nothing around them;
- **run factor** = fraction / kernel fraction (at most 1): what the published distributed runs kept of it.

A fraction fitted, assumed or borrowed for a GPU carries its own factor. A defaulted one (nothing measured on
the GPU informed it: H200, B300, bf16 on B200/GB200/GB300, a user GPU of an unknown architecture) takes the
median factor of the same fraction fitted on other GPUs, else of every fitted fraction of its kind: kernel speed
is the GPU's own, the run's losses carry over. Before this split an uncalibrated GPU ran distributed jobs at its
kernel speed: Llama-3.1-70B on 64 H200 (seq 8192, global batch 128) at 72.0% MFU against H100's 51.5%; it is
57.8% now (``paraplan plan llama-3.1-70b --gpu h200-sxm --gpus 64 --seq-len 8192 --global-batch 128``).

A job pays its run factor by the share of a data-parallel ring's traffic each GPU carries against the 8-GPU
runs the factor was first fitted on: ``share(n) = min(1, ((n - 1) / n) / (7 / 8))``, 0 on one GPU (no collective
at all) and 1 from 8 GPUs on, so every published run (all on 8 or more GPUs) is priced exactly as fitted. Between
2 and 7 GPUs nothing was measured; the ring share is the stated assumption. ``--cost-model measured`` divides its
table-priced GEMM and attention times by the same factor at the same share (``run_factors``: provider.py).

On one H100 (PyTorch 2.11, torchtitan; data/measured/torchtitan_memory_h100.csv) the kernel fractions put the 14
finished probe runs' step time within median 4.0% (max 14.0%; 6.8% while their cuDNN attention was priced as
FlashAttention-2), where H100's fitted fractions were 39.0% (max 55.1%) too slow (``python
bench/kernel_tables_accuracy.py --store none.sqlite`` prints the analytical column). On the 38
NeMo MoE reference runs that read a defaulted fraction (B300; bf16 on B200, GB200, GB300), which no fit ever saw,
the transferred factor moves every one closer to its measurement: median |error| 48.2% -> 38.8% (18 rows other than
GPT-OSS: 21.6% -> 12.1%; ``paraplan validate``).
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import numpy as np

from paraplan.hardware_profiles.specs import DEFAULTED, FITTED, EfficiencySpec, GPUSpec

FIT_GPUS = 8
"""The fewest GPUs of any published run the fractions were fitted to: the run factor applies in full from here."""
SIXTEEN_BIT_PEERS = {"fp16": "bf16", "tf32": "bf16"}
"""GEMM dtypes whose factor is bf16's: efficiency.yaml sets fp16 and tf32 to the bf16 fraction (``assumed``) and
fits neither on its own."""


def scale_share(num_gpus: int) -> float:
    """How much of the run factor a job on ``num_gpus`` GPUs pays: its data-parallel ring share (n-1)/n against
    the 8-GPU runs' 7/8, capped at 1 (0 on one GPU)."""
    n = max(int(num_gpus), 1)
    return min(1.0, ((n - 1) / n) / ((FIT_GPUS - 1) / FIT_GPUS))


def _paths(spec: EfficiencySpec) -> dict[str, float]:
    """Every GEMM and attention fraction of ``spec`` by its efficiency.yaml path."""
    paths = {f"gemm_peak_frac.{d}": v for d, v in spec.gemm_peak_frac.items()}
    paths |= {f"stack_gemm_peak_frac.{s}.{d}": v for s, table in spec.stack_gemm_peak_frac.items()
              for d, v in table.items()}
    return paths | {f"attention_peak_frac.{k}": v for k, v in spec.attention_peak_frac.items()}


def kernel_default(path: str, defaults: EfficiencySpec) -> float:
    """The defaults' fraction for ``path`` (a kernel stack's override reads the shared GEMM fraction of its dtype)."""
    field, *keys = path.split(".")
    if field == "stack_gemm_peak_frac":
        return defaults.gemm_peak_frac[keys[-1]]
    return float(getattr(defaults, field)[keys[0]])


def run_factor(value: float, default: float) -> float:
    """The run factor of a fraction ``value`` whose kernel default is ``default``: value / max(default, value)."""
    return value / max(default, value)


def transfer_key(path: str) -> tuple[str, str]:
    """What a defaulted fraction borrows its factor from: (field, the path's last key), e.g. ('gemm_peak_frac',
    'bf16'); fp16 and tf32 read bf16's. A kernel stack's override keeps its own field: its factor is the stack's
    (PyTorch-native fp8 casts unfused), not the GPU's."""
    field, *keys = path.split(".")
    return field, SIXTEEN_BIT_PEERS.get(keys[-1], keys[-1])


def transferred_factors(fitted: list[tuple[str, float]], defaults: EfficiencySpec) -> dict[tuple[str, str], float]:
    """Median run factor per transfer key and per field (key ``*``) over ``fitted`` (path, value) pairs."""
    by_key: dict[tuple[str, str], list[float]] = {}
    for path, value in fitted:
        factor = run_factor(value, kernel_default(path, defaults))
        field, key = transfer_key(path)
        by_key.setdefault((field, key), []).append(factor)
        by_key.setdefault((field, "*"), []).append(factor)
    return {key: float(np.median(values)) for key, values in by_key.items()}


@cache
def _catalog_factors() -> dict[tuple[str, str], float]:
    """Transferred factors over the fractions efficiency.yaml fits to a GPU's own runs (each fit counted once)."""
    from paraplan.hardware_profiles import catalog  # the catalog imports this module's users, not this module

    table = catalog._efficiencies()
    fitted = [(path, value) for name, spec in table.items() if name != "*"
              for path, value in _paths(spec).items() if spec.origin(path) == FITTED]
    return transferred_factors(fitted, table["*"])


def factor_for(spec: EfficiencySpec, path: str, value: float, defaults: EfficiencySpec,
               factors: dict[tuple[str, str], float]) -> float:
    """The run factor of ``spec``'s fraction at ``path``: its own, or for a defaulted one the transferred median."""
    if spec.origin(path) != DEFAULTED:
        return run_factor(value, kernel_default(path, defaults))
    field, key = transfer_key(path)
    return factors.get((field, key), factors.get((field, "*"), 1.0))


def efficiency_at_scale(spec: EfficiencySpec, num_gpus: int, defaults: EfficiencySpec | None = None,
                        factors: dict[tuple[str, str], float] | None = None) -> EfficiencySpec:
    """``spec`` as a job on ``num_gpus`` GPUs reads it: each fraction's kernel fraction times its run factor raised
    to ``scale_share(num_gpus)``. From 8 GPUs on, fitted fractions are unchanged and defaulted ones carry the
    transferred factor; on one GPU every fraction is its kernel fraction."""
    from paraplan.hardware_profiles import catalog

    defaults = catalog.default_efficiency() if defaults is None else defaults
    factors = _catalog_factors() if factors is None else factors
    share = scale_share(num_gpus)
    scaled: dict[str, float] = {}
    applied: dict[str, float] = {}
    for path, value in _paths(spec).items():
        default = kernel_default(path, defaults)
        kernel = value if spec.origin(path) == DEFAULTED else max(default, value)
        applied[path] = factor_for(spec, path, value, defaults, factors) ** share
        scaled[path] = kernel * applied[path]
    gemm = {d: scaled[f"gemm_peak_frac.{d}"] for d in spec.gemm_peak_frac}
    stacks = {s: {d: scaled[f"stack_gemm_peak_frac.{s}.{d}"] for d in table}
              for s, table in spec.stack_gemm_peak_frac.items()}
    attention = {k: scaled[f"attention_peak_frac.{k}"] for k in spec.attention_peak_frac}
    return replace(spec, gemm_peak_frac=gemm, stack_gemm_peak_frac=stacks, attention_peak_frac=attention,
                   run_gpus=int(num_gpus), run_factors=applied)


def job_factors(gpu: GPUSpec, precision: str, attention_kernel: str, kernel_stack: str) -> tuple[float, float]:
    """The run factors of the GEMM fraction and the attention fraction a job reads on ``gpu`` (the paths
    ``analytical_rates`` picks: ``EfficiencySpec.gemm_path``, ``attention_path``): the share a scaled GPU
    (``gpu_at_scale``) carries, else the full factors (8 GPUs or more)."""
    spec = gpu.efficiency if gpu.efficiency.run_gpus is not None else efficiency_at_scale(gpu.efficiency, FIT_GPUS)
    return (spec.run_factors[spec.gemm_path(precision, kernel_stack)],
            spec.run_factors[spec.attention_path(attention_kernel, kernel_stack)])


def gpu_at_scale(gpu: GPUSpec, num_gpus: int) -> GPUSpec:
    """``gpu`` with the efficiency a training job spanning ``num_gpus`` GPUs reads (``efficiency_at_scale``)."""
    return replace(gpu, efficiency=efficiency_at_scale(gpu.efficiency, num_gpus))


def scale_note(spec: EfficiencySpec, defaulted: bool) -> str:
    """The provenance phrase for the run factor ``spec`` carries (empty where it is the fitted one, as
    efficiency.yaml states it): ``defaulted`` says whether a fraction the job reads is efficiency.yaml's default."""
    if spec.run_gpus is None:
        return ""
    share = scale_share(spec.run_gpus)
    if share == 0.0:
        return "one GPU: kernel fractions, no distributed-run factor"
    if share < 1.0:
        return f"{spec.run_gpus} GPUs: {share:.2f} of the distributed-run factor (ring share against 8 GPUs)"
    return "defaulted fractions x the median distributed-run factor fitted on other GPUs" if defaulted else ""


__all__ = ["FIT_GPUS", "efficiency_at_scale", "gpu_at_scale", "job_factors", "run_factor", "scale_note", "scale_share",
           "transferred_factors"]
