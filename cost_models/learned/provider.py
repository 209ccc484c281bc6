"""The planner's choice of cost model: analytical, learned, learned where one exists (auto), or measured kernels.

``measured`` prices GEMMs from a measured kernel table of the GPU (cost_models/kernel_source.py) and, where the
training suite measured them, attention, memory-bound kernels, the optimizer step and routed experts' grouped GEMMs
(kernel_source_memory.py, kernel_source_grouped.py); analytical outside their shapes and for every other term.

Learned models plug into :class:`ComputeRates`: a GEMM model as ``gemm_time_fn`` (``gemm_time_s``
defers to it), a flash-attention model as ``attention_time_fn``, the step calibration as
``step_time_factor``; collective models into the :class:`ClusterSpec` as ``collective_time_fn``, used
only for groups inside one NVLink domain at the sizes and group sizes they were measured on.
Element-wise kernels and everything else stay analytical. ``ComputeRates.source`` and
``ClusterSpec.collective_source`` name the model of each term and the learned models' data hashes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from paraplan.arrays import Column
from paraplan.cost_models.collectives import Collective
from paraplan.cost_models.compute import AttentionTimeFn, ComputeRates, GemmTimeFn, analytical_rates
from paraplan.cost_models.learned.artifacts import (
    ArtifactMeta,
    Regressor,
    artifact_paths,
    gemm_target,
    load_artifact,
    models_dir,
)
from paraplan.cost_models.learned.features import (
    ATTENTION_FEATURES,
    COLLECTIVE_FEATURES,
    GEMM_FEATURES,
    attention_features,
    attention_rates,
    baseline_rates,
    collective_features,
    gemm_features,
    reference_cluster,
)
from paraplan.cost_models.learned.fit import predict_residual
from paraplan.cost_models.learned.step_calibration import STEP_FEATURES, step_factor
from paraplan.errors import InputError
from paraplan.hardware_profiles import ClusterSpec, GPUSpec
from paraplan.hardware_profiles.run_factor import job_factors
from paraplan.hardware_profiles.specs import FLASH_FAMILY_KERNELS

COST_MODELS = ("analytical", "learned", "auto", "measured")
"""``measured``: GEMMs, attention, grouped GEMMs, element-wise kernels and the optimizer step from measured kernel
tables (kernel_source*.py), the table-priced GEMMs and attention divided by the distributed-run factor of a job on
many GPUs (hardware_profiles/run_factor.py). Not part of ``auto``: on the 154 16-bit dense reference runs the
tables cover it is 6.9% off at the median against the analytical model's 4.2% (docs/accuracy.md, "Measured kernel
tables"); on one GPU of today's stack it is the closer of the two (the H100 probe: 3.8% with aiconfigurator's GEMMs,
6.8% analytical)."""


def gemm_predictor(estimator: Regressor, rates: ComputeRates) -> GemmTimeFn:
    """Seconds for GEMMs (m, n, k), broadcast like ``gemm_time_s``: analytical · exp(learned residual).

    Distinct shapes are predicted once: a search table repeats a few shapes many times.
    """
    def predict(m: Column, n: Column, k: Column) -> np.ndarray:
        m, n, k = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (m, n, k)))
        shapes = np.column_stack([m.ravel(), n.ravel(), k.ravel()])
        distinct, inverse = np.unique(shapes, axis=0, return_inverse=True)
        x = gemm_features(distinct[:, 0], distinct[:, 1], distinct[:, 2], rates)
        seconds = np.exp(x[:, -1]) * np.exp(predict_residual(estimator, x))
        return seconds[inverse.ravel()].reshape(m.shape)
    return predict


def attention_predictor(estimator: Regressor, rates: ComputeRates) -> AttentionTimeFn:
    """(forward, backward) seconds for forward causal FLOPs, broadcast like ``flash_attention_time_s``."""
    def predict(causal_flops: Column) -> tuple[np.ndarray, np.ndarray]:
        flops = np.asarray(causal_flops, dtype=float)
        distinct, inverse = np.unique(flops.ravel(), return_inverse=True)
        passes = []
        for backward in (0.0, 1.0):
            x = attention_features(distinct, backward, rates)
            seconds = np.exp(x[:, -1]) * np.exp(predict_residual(estimator, x))
            passes.append(seconds[inverse.ravel()].reshape(flops.shape))
        return passes[0], passes[1]
    return predict


# The collectives the cost model prices with collective_time_s (send/recv goes through p2p_time_s).
PLANNED_COLLECTIVES: tuple[Collective, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")

CollectiveTimeFn = Callable[[Collective, Column, Column, Column], tuple[np.ndarray, np.ndarray]]
"""(kind, bytes, group size, members per NVLink domain) -> (where the learned model applies, its seconds): what
``ClusterSpec.collective_time_fn`` holds."""


def collective_predictor(models: dict[Collective, tuple[ArtifactMeta, Regressor]],
                         hardware: str) -> CollectiveTimeFn:
    """(kind, bytes, group size, members per NVLink domain) -> (mask, seconds): the learned time
    (analytical on the reference cluster · exp(learned residual)) where the group sits inside one
    domain and its size and group size lie in the measured range, else mask False."""
    reference = reference_cluster(hardware)

    def predict(kind: Collective, size_bytes: Column, group_size: Column,
                members_per_domain: Column) -> tuple[np.ndarray, np.ndarray]:
        size, n, k = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in
                                           (size_bytes, group_size, members_per_domain)))
        mask, seconds = np.zeros(size.shape, dtype=bool), np.zeros(size.shape)
        if kind not in models:
            return mask, seconds
        meta, estimator = models[kind]
        d = meta.domain
        mask = (n > 1) & (k >= n) & (n <= d["max_group_size"]) & (size >= d["min_size_bytes"]) \
            & (size <= d["max_size_bytes"])
        if mask.any():
            distinct, inverse = np.unique(np.column_stack([size[mask], n[mask]]), axis=0, return_inverse=True)
            x = collective_features(kind, distinct[:, 0], distinct[:, 1], distinct[:, 1], 0.0, reference)
            seconds[mask] = (np.exp(x[:, -1]) * np.exp(predict_residual(estimator, x)))[inverse.ravel()]
        return mask, seconds
    return predict


def _measured_cluster(cluster: ClusterSpec, store: Path) -> ClusterSpec:
    """``cluster`` with the store's measured NCCL tables of its GPU pricing the collectives they cover."""
    from paraplan.cost_models.kernel_pricing import table_collective_fn  # the store's readers: only for this model
    from paraplan.cost_models.kernel_source import collective_tables

    tables = collective_tables(store, cluster.gpu.name)
    if not tables:
        return cluster
    source = ("collectives inside one NVLink domain in the measured range: measured tables "
              + ", ".join(t.label for t in tables.values()))
    return dataclasses.replace(cluster, collective_time_fn=table_collective_fn(tables), collective_source=source)


def learned_cluster(cost_model: str, cluster: ClusterSpec, store: Path) -> ClusterSpec:
    """``cluster`` with the learned collective models of its GPU (learned or auto), or its measured NCCL tables
    (measured), where they exist."""
    if cost_model == "measured":
        return _measured_cluster(cluster, store)
    if cost_model == "analytical":
        return cluster
    hardware = cluster.gpu.name
    models = {kind: load_artifact(models_dir(store), hardware, kind, COLLECTIVE_FEATURES)
              for kind in PLANNED_COLLECTIVES if _exists(store, hardware, kind)}
    models = {kind: loaded for kind, loaded in models.items() if loaded[0].domain}
    if not models:
        return cluster
    labels = [f"{kind} (data {meta.data_hash[:12]}, {meta.domain['min_size_bytes']:.0f}–"
              f"{meta.domain['max_size_bytes']:.0f} B, groups <= {meta.domain['max_group_size']})"
              for kind, (meta, _) in models.items()]
    source = f"collectives inside one NVLink domain in the measured range: learned {', '.join(labels)}"
    return dataclasses.replace(cluster, collective_time_fn=collective_predictor(models, hardware),
                               collective_source=source)


def _exists(store: Path, hardware: str, target: str) -> bool:
    """Whether the metadata of learned model ``target`` of ``hardware`` was saved beside ``store``."""
    return artifact_paths(models_dir(store), hardware, target)[1].is_file()


def learned_gemm_exists(store: Path, hardware: str, dtype: str) -> bool:
    """True when a GEMM model for ``hardware`` and ``dtype`` was saved beside ``store``."""
    return _exists(store, hardware, gemm_target(dtype))


def _analytical(gpu: GPUSpec, precision: str, attention_kernel: str, kernel_stack: str) -> ComputeRates:
    """``analytical_rates``, with an InputError naming the flag where the GPU lacks the precision."""
    try:
        return analytical_rates(gpu, precision, attention_kernel, kernel_stack)
    except ValueError as exc:  # the GPU lacks this precision: the same sentence search() gives
        raise InputError(f"{exc}; choose another --precision") from None


def _learned_gemm(store: Path, gpu: GPUSpec, precision: str) -> tuple[GemmTimeFn, str]:
    """(the learned GEMM model of ``gpu`` for ``precision`` as a predictor, its provenance label)."""
    target = gemm_target(precision)
    meta, estimator = load_artifact(models_dir(store), gpu.name, target, GEMM_FEATURES)
    label = f"GEMMs: learned ({gpu.name} {target}, data {meta.data_hash[:12]}, scikit-learn {meta.sklearn_version})"
    return gemm_predictor(estimator, baseline_rates(gpu.name, meta.dtype)), label


def _learned_attention(store: Path, hardware: str) -> tuple[AttentionTimeFn, str]:
    """(the learned flash-attention model of ``hardware`` as a predictor, its provenance label)."""
    meta, estimator = load_artifact(models_dir(store), hardware, "attention", ATTENTION_FEATURES)
    label = f"attention: learned ({hardware}, data {meta.data_hash[:12]})"
    return attention_predictor(estimator, attention_rates(hardware)), label


def kernel_stores(store: Path) -> tuple[Path, ...]:
    """Where measured kernel tables are looked for, in order: the user's store, then paraplan's shipped tables
    (measurements/builtin_kernels.py), when they can be built."""
    from paraplan.measurements.builtin_kernels import builtin_store

    builtin = builtin_store()
    return (store,) if builtin is None else (store, builtin)


def has_gemm_table(store: Path, hardware: str, precision: str) -> bool:
    """Whether ``--cost-model measured`` finds a GEMM table for ``hardware`` and ``precision`` (in ``store`` or the
    shipped tables)."""
    from paraplan.cost_models.kernel_source import training_gemm_table

    return any(training_gemm_table(s, hardware, precision) is not None for s in kernel_stores(store))


def _suite_tables(base: ComputeRates, hardware: str, precision: str, stores: tuple[Path, ...],
                  gemm_run_factor: float = 1.0) -> tuple[dict[str, Any], list[str]]:
    """The ``ComputeRates`` fields that price memory-bound kernels, the optimizer step and routed experts' grouped
    GEMMs from measured tables of ``hardware`` (the first store holding each), and their provenance labels."""
    from paraplan.cost_models.kernel_pricing import table_grouped_gemm_fn, table_memory_fn, table_parameter_fn
    from paraplan.cost_models.kernel_source_grouped import grouped_gemm_table
    from paraplan.cost_models.kernel_source_memory import elementwise_table, optimizer_table

    fields: dict[str, Any] = {}
    labels = []
    curve = next((t for t in (elementwise_table(s, hardware) for s in stores) if t is not None), None)
    if curve is not None:
        fields["memory_time_fn"] = table_memory_fn(curve, base)
        labels.append(f"element-wise: {curve.label} at each kernel's share of the bytes, roofline outside them")
    adamw = next((t for t in (optimizer_table(s, hardware) for s in stores) if t is not None), None)
    if adamw is not None:
        fields["optimizer_table_fn"] = table_parameter_fn(adamw)
        labels.append(f"optimizer step: {adamw.label}, linear past the largest; clipping and any 16-bit weight copy "
                      "at its bandwidth")
    grouped = next((t for t in (grouped_gemm_table(s, hardware, precision) for s in stores) if t is not None), None)
    if grouped is not None:
        fields["grouped_gemm_table_fn"] = table_grouped_gemm_fn(grouped, gemm_run_factor)
        labels.append(f"routed experts' forward and input-gradient grouped GEMMs: {grouped.label}, the GEMM model "
                      "outside it and for weight gradients")
    return fields, labels


def _measured_rates(base: ComputeRates, gpu: GPUSpec, precision: str, store: Path,
                    kernel_stack: str = "transformer_engine") -> ComputeRates:
    """``base`` with its GEMMs priced by a measured kernel table of ``gpu`` and, where paraplan's training suite
    measured them, its attention kernel, memory-bound kernels, optimizer step and grouped expert GEMMs too
    (kernel_source*.py); analytical outside the tables' shapes. Each table comes from the user's ``store`` where
    it has one, else from paraplan's shipped tables. Table-priced GEMMs and attention are divided by the
    distributed-run factor ``gpu`` carries for its job (hardware_profiles/run_factor.py: none on one GPU). InputError
    when neither has a GEMM table for this GPU and precision."""
    from paraplan.cost_models.kernel_pricing import table_attention_fn, table_gemm_fn  # the store's readers: only
    from paraplan.cost_models.kernel_source import training_attention_tables, training_gemm_table  # for this model

    stores = kernel_stores(store)
    table = next((t for t in (training_gemm_table(s, gpu.name, precision) for s in stores) if t is not None), None)
    if table is None:
        raise InputError(f"no measured {precision} GEMM table for {gpu.name} in {store} or paraplan's shipped "
                         "tables; ingest one ('paraplan ingest --kind aiconfigurator WHEEL' or a 'paraplan profile' "
                         "suite) or use --cost-model auto")
    attention = next((t for t in (training_attention_tables(s, gpu.name, base.attention_kernel) for s in stores)
                      if t), {})
    labels = [f"GEMMs: {table.label}, analytical outside its shapes"]
    if attention:
        table_name = next(iter(attention.values()))[0].label.split(", head dim")[0]
        labels.append(f"attention: {table_name} for head dims {', '.join(str(d) for d in attention)}, analytical "
                      "outside it")
    gemm_factor, attention_factor = (1.0, 1.0) if gpu.efficiency.run_gpus is None else job_factors(
        gpu, precision, base.attention_kernel, kernel_stack)  # a GPU not scaled to a job (gpu_at_scale): none
    if (gemm_factor, attention_factor) != (1.0, 1.0):
        labels.append(f"measured GEMM and attention times / distributed-run factor {gemm_factor:.3f} and "
                      f"{attention_factor:.3f} ({gpu.efficiency.run_gpus} GPUs)")
    fields, suite_labels = _suite_tables(base, gpu.name, precision, stores, gemm_factor)
    rest = [name for name, priced in (("attention", attention), ("element-wise", "memory_time_fn" in fields),
                                      ("optimizer step", "optimizer_table_fn" in fields)) if not priced]
    return dataclasses.replace(base, gemm_time_fn=table_gemm_fn(table, base, gemm_factor),
                               attention_table_fn=table_attention_fn(attention, attention_factor) if attention
                               else None, **fields,
                               source="; ".join([*labels, *suite_labels,
                                                 f"{', '.join([*rest, 'communication'])}: {base.source}"]))


def op_rates(cost_model: str, gpu: GPUSpec, precision: str, attention_kernel: str, kernel_stack: str,
             store: Path) -> ComputeRates:
    """Per-op rates: analytical; ``measured``: GEMMs from the store's measured kernel table; ``auto``: with the learned
    GEMM and attention models that exist; ``learned`` insists on the GEMM model (InputError when there is none)."""
    if cost_model not in COST_MODELS:
        raise InputError(f"--cost-model expects {', '.join(COST_MODELS)}, got {cost_model!r}")
    base = _analytical(gpu, precision, attention_kernel, kernel_stack)
    if cost_model == "measured":
        return _measured_rates(base, gpu, precision, store, kernel_stack)
    has_gemm = learned_gemm_exists(store, gpu.name, precision)
    if cost_model == "learned" and not has_gemm:
        raise InputError(f"no learned {precision} GEMM model for {gpu.name} beside {store}; run 'paraplan ingest' "
                         "and 'paraplan learn' first, or use --cost-model analytical")
    has_attention = attention_kernel in FLASH_FAMILY_KERNELS and _exists(store, gpu.name, "attention")
    if cost_model == "analytical" or not (has_gemm or has_attention):
        return base
    gemm_time_fn, attention_time_fn, labels = base.gemm_time_fn, base.attention_time_fn, []
    if has_gemm:
        gemm_time_fn, label = _learned_gemm(store, gpu, precision)
        labels.append(label)
    if has_attention:
        attention_time_fn, label = _learned_attention(store, gpu.name)
        labels.append(label)
    rest = "element-wise and communication" if has_attention else "attention, element-wise and communication"
    return dataclasses.replace(base, gemm_time_fn=gemm_time_fn, attention_time_fn=attention_time_fn,
                               source="; ".join([*labels, f"{rest}: {base.source}"]))


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
    if cost_model in ("analytical", "measured") or not step_calibration:
        return rates
    return with_step_calibration(rates, store, gpu.name)
