"""The planner's choice of cost model: analytical, learned, or learned where one exists (auto).

Learned models plug into :class:`ComputeRates`: a GEMM model as ``gemm_time_fn`` (``gemm_time_s``
defers to it), a flash-attention model as ``attention_time_fn``, the step calibration as
``step_time_factor``. Element-wise kernels and communication stay analytical. ``ComputeRates.source``
names the model of each term and the learned models' data hashes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np

from paraplan.cost_models.compute import ComputeRates, analytical_rates
from paraplan.cost_models.learned.artifacts import artifact_paths, gemm_target, load_artifact, models_dir
from paraplan.cost_models.learned.features import (
    ATTENTION_FEATURES,
    GEMM_FEATURES,
    attention_features,
    attention_rates,
    baseline_rates,
    gemm_features,
)
from paraplan.cost_models.learned.fit import predict_residual
from paraplan.cost_models.learned.step_calibration import STEP_FEATURES, step_factor
from paraplan.errors import InputError
from paraplan.hardware_profiles import GPUSpec
from paraplan.hardware_profiles.specs import FLASH_FAMILY_KERNELS

COST_MODELS = ("analytical", "learned", "auto")


def gemm_predictor(estimator, rates: ComputeRates) -> Callable:
    """Seconds for GEMMs (m, n, k), broadcast like ``gemm_time_s``: analytical · exp(learned residual).

    Distinct shapes are predicted once: a search table repeats a few shapes many times.
    """
    def predict(m, n, k):
        m, n, k = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (m, n, k)))
        shapes = np.column_stack([m.ravel(), n.ravel(), k.ravel()])
        distinct, inverse = np.unique(shapes, axis=0, return_inverse=True)
        x = gemm_features(distinct[:, 0], distinct[:, 1], distinct[:, 2], rates)
        seconds = np.exp(x[:, -1]) * np.exp(predict_residual(estimator, x))
        return seconds[inverse.ravel()].reshape(m.shape)
    return predict


def attention_predictor(estimator, rates: ComputeRates) -> Callable:
    """(forward, backward) seconds for forward causal FLOPs, broadcast like ``flash_attention_time_s``."""
    def predict(causal_flops):
        flops = np.asarray(causal_flops, dtype=float)
        distinct, inverse = np.unique(flops.ravel(), return_inverse=True)
        passes = []
        for backward in (0.0, 1.0):
            x = attention_features(distinct, backward, rates)
            seconds = np.exp(x[:, -1]) * np.exp(predict_residual(estimator, x))
            passes.append(seconds[inverse.ravel()].reshape(flops.shape))
        return passes[0], passes[1]
    return predict


def _exists(store: Path, hardware: str, target: str) -> bool:
    return artifact_paths(models_dir(store), hardware, target)[1].is_file()


def learned_gemm_exists(store: Path, hardware: str, dtype: str) -> bool:
    """True when a GEMM model for ``hardware`` and ``dtype`` was saved beside ``store``."""
    return _exists(store, hardware, gemm_target(dtype))


def _analytical(gpu: GPUSpec, precision: str, attention_kernel: str, kernel_stack: str) -> ComputeRates:
    try:
        return analytical_rates(gpu, precision, attention_kernel, kernel_stack)
    except ValueError as exc:  # the GPU lacks this precision: the same sentence search() gives
        raise InputError(f"{exc}; choose another --precision") from None


def _learned_gemm(store: Path, gpu: GPUSpec, precision: str) -> tuple[Callable, str]:
    target = gemm_target(precision)
    meta, estimator = load_artifact(models_dir(store), gpu.name, target, GEMM_FEATURES)
    label = f"GEMMs: learned ({gpu.name} {target}, data {meta.data_hash[:12]}, scikit-learn {meta.sklearn_version})"
    return gemm_predictor(estimator, baseline_rates(gpu.name, meta.dtype)), label


def _learned_attention(store: Path, hardware: str) -> tuple[Callable, str]:
    meta, estimator = load_artifact(models_dir(store), hardware, "attention", ATTENTION_FEATURES)
    label = f"attention: learned ({hardware}, data {meta.data_hash[:12]})"
    return attention_predictor(estimator, attention_rates(hardware)), label


def op_rates(cost_model: str, gpu: GPUSpec, precision: str, attention_kernel: str, kernel_stack: str,
             store: Path) -> ComputeRates:
    """Per-op rates: analytical, or with the learned GEMM and attention models that exist (``auto``);
    ``learned`` insists on the GEMM model (InputError when there is none)."""
    if cost_model not in COST_MODELS:
        raise InputError(f"--cost-model expects {', '.join(COST_MODELS)}, got {cost_model!r}")
    base = _analytical(gpu, precision, attention_kernel, kernel_stack)
    has_gemm = learned_gemm_exists(store, gpu.name, precision)
    if cost_model == "learned" and not has_gemm:
        raise InputError(f"no learned {precision} GEMM model for {gpu.name} beside {store}; run 'paraplan ingest' "
                         "and 'paraplan learn' first, or use --cost-model analytical")
    has_attention = attention_kernel in FLASH_FAMILY_KERNELS and _exists(store, gpu.name, "attention")
    if cost_model == "analytical" or not (has_gemm or has_attention):
        return base
    changes, labels = {}, []
    if has_gemm:
        changes["gemm_time_fn"], label = _learned_gemm(store, gpu, precision)
        labels.append(label)
    if has_attention:
        changes["attention_time_fn"], label = _learned_attention(store, gpu.name)
        labels.append(label)
    rest = "element-wise and communication" if has_attention else "attention, element-wise and communication"
    return dataclasses.replace(base, **changes, source="; ".join([*labels, f"{rest}: {base.source}"]))


def with_step_calibration(rates: ComputeRates, store: Path, hardware: str) -> ComputeRates:
    """``rates`` with the learned step calibration of ``hardware`` when one was fitted against these rates."""
    if not _exists(store, hardware, "step"):
        return rates
    meta, estimator = load_artifact(models_dir(store), hardware, "step", STEP_FEATURES)
    if meta.base != rates.source:  # fitted against another op model: its factor does not apply
        return rates
    factor = step_factor(estimator)
    source = (f"{rates.source}; step time x {factor:.3f} (learned step calibration on {meta.num_rows} runs, "
              f"data {meta.data_hash[:12]})")
    return dataclasses.replace(rates, step_time_factor=factor, source=source)


def compute_rates(cost_model: str, gpu: GPUSpec, precision: str, attention_kernel: str, kernel_stack: str,
                  store: Path, step_calibration: bool = True) -> ComputeRates:
    """The rates ``estimate`` should use; learned and auto add the step calibration where it was fitted
    against the same op models (not when ``step_calibration`` is False, as while fitting it)."""
    rates = op_rates(cost_model, gpu, precision, attention_kernel, kernel_stack, store)
    if cost_model == "analytical" or not step_calibration:
        return rates
    return with_step_calibration(rates, store, gpu.name)
