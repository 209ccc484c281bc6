"""The planner's choice of cost model: analytical, learned, or learned where one exists (auto).

A learned GEMM model plugs into :class:`ComputeRates` as ``gemm_time_fn``: ``gemm_time_s`` defers
to it, every other term (attention, element-wise, communication) stays analytical, and
``ComputeRates.source`` names which is which and the learned model's data hash.
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


def with_learned_attention(rates: ComputeRates, store: Path, hardware: str) -> ComputeRates:
    """``rates`` with the learned flash-attention model of ``hardware``, for flash-family kernels, when one exists."""
    if rates.attention_kernel not in FLASH_FAMILY_KERNELS or not artifact_paths(
            models_dir(store), hardware, "attention")[1].is_file():
        return rates
    meta, estimator = load_artifact(models_dir(store), hardware, "attention", ATTENTION_FEATURES)
    source = f"attention: learned ({hardware}, data {meta.data_hash[:12]}); {rates.source}"
    return dataclasses.replace(rates, attention_time_fn=attention_predictor(estimator, attention_rates(hardware)),
                               source=source)


def learned_gemm_exists(store: Path, hardware: str, dtype: str) -> bool:
    """True when a GEMM model for ``hardware`` and ``dtype`` was saved beside ``store``."""
    return artifact_paths(models_dir(store), hardware, gemm_target(dtype))[1].is_file()


def op_rates(cost_model: str, gpu: GPUSpec, precision: str, attention_kernel: str, kernel_stack: str,
             store: Path) -> ComputeRates:
    """Per-op rates: analytical, or with the learned GEMM model (InputError when ``learned`` has none)."""
    if cost_model not in COST_MODELS:
        raise InputError(f"--cost-model expects {', '.join(COST_MODELS)}, got {cost_model!r}")
    try:
        base = analytical_rates(gpu, precision, attention_kernel, kernel_stack)
    except ValueError as exc:  # the GPU lacks this precision: the same sentence search() gives
        raise InputError(f"{exc}; choose another --precision") from None
    if cost_model == "analytical" or (cost_model == "auto" and not learned_gemm_exists(store, gpu.name, precision)):
        return base
    if not learned_gemm_exists(store, gpu.name, precision):
        raise InputError(f"no learned {precision} GEMM model for {gpu.name} beside {store}; run 'paraplan ingest' "
                         "and 'paraplan learn' first, or use --cost-model analytical")
    target = gemm_target(precision)
    meta, estimator = load_artifact(models_dir(store), gpu.name, target, GEMM_FEATURES)
    predictor = gemm_predictor(estimator, baseline_rates(gpu.name, meta.dtype))
    source = (f"GEMMs: learned ({gpu.name} {target}, data {meta.data_hash[:12]}, scikit-learn "
              f"{meta.sklearn_version}); attention, element-wise and communication: {base.source}")
    return dataclasses.replace(base, gemm_time_fn=predictor, source=source)


def with_step_calibration(rates: ComputeRates, store: Path, hardware: str) -> ComputeRates:
    """``rates`` with the learned step calibration of ``hardware`` when one was fitted against these rates."""
    meta_path = artifact_paths(models_dir(store), hardware, "step")[1]
    if not meta_path.is_file():
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
    """The rates ``estimate`` should use: learned and auto add the learned attention model and (unless
    ``step_calibration`` is False, as when fitting it) the step calibration, where they exist."""
    rates = op_rates(cost_model, gpu, precision, attention_kernel, kernel_stack, store)
    if cost_model == "analytical":
        return rates
    rates = with_learned_attention(rates, store, gpu.name)
    return with_step_calibration(rates, store, gpu.name) if step_calibration else rates
