"""``paraplan learn``: fit every model the store has data for, score it held out, save it.

Per hardware: one GEMM model per operand width (16-bit, fp8) and one model per collective.
Each is scored held out (``evaluate``) and then refitted on all rows for use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from paraplan.cost_models.learned.artifacts import (
    ArtifactMeta,
    gemm_target,
    models_dir,
    save_artifact,
    sklearn_version,
    training_hash,
)
from paraplan.cost_models.learned.evaluate import (
    HELD_OUT_EVERY,
    Score,
    evaluate_attention,
    evaluate_collective,
    evaluate_gemm,
    held_out_sizes,
)
from paraplan.cost_models.learned.features import ATTENTION_FEATURES, COLLECTIVE_FEATURES, GEMM_FEATURES
from paraplan.cost_models.learned.fit import attention_xy, collective_xy, fit_residual, gemm_xy
from paraplan.cost_models.learned.megatron_runs import is_moe, predict_step_s, runs_from_steps
from paraplan.cost_models.learned.provider import compute_rates
from paraplan.cost_models.learned.step_calibration import (
    MIN_RUNS,
    STEP_FEATURES,
    evaluate_step_calibration,
    fit_step_calibration,
)
from paraplan.errors import InputError
from paraplan.hardware_profiles import load_gpu
from paraplan.measurements.store import load_measurements, summarize

# Fewer rows than this cannot be split into a meaningful held-out test.
MIN_ROWS = 20


@dataclass(frozen=True, slots=True, kw_only=True)
class LearnedTarget:
    """One fitted model: its held-out scores and where it was saved."""

    meta: ArtifactMeta
    """What it was trained on."""
    scores: tuple[Score, ...]
    """Held-out scores, pooled first."""
    path: Path
    """Its metadata file."""


def _save(store: Path, target: str, hardware: str, dtype: str, xy: tuple[np.ndarray, np.ndarray, np.ndarray],
          features: tuple[str, ...], scores: list[Score], domain: dict[str, float] | None = None) -> LearnedTarget:
    """Fit the residual model on all of ``xy`` (features, target, analytical seconds), save it with its metadata
    (the pooled held-out score first in ``scores``) beside ``store``, and describe it."""
    x, y, _ = xy
    pooled = scores[0]
    meta = ArtifactMeta(target=target, hardware=hardware, dtype=dtype, features=tuple(features),
                        data_hash=training_hash(x, y), sklearn_version=sklearn_version(), num_rows=len(y),
                        held_out={"split": pooled.split, "rows": pooled.num_rows,
                                  "learned_mape_frac": pooled.learned_mape_frac,
                                  "analytical_mape_frac": pooled.analytical_mape_frac},
                        domain=domain or {})
    path = save_artifact(models_dir(store), meta, fit_residual(x, y))
    return LearnedTarget(meta=meta, scores=tuple(scores), path=path)


def _gemm_scores(frame: pd.DataFrame, hardware: str, dtype: str) -> list[Score]:
    """Held-out scores of the GEMM model: leave one model out, or with one model only, held-out sizes of M."""
    if frame["model"].fillna("").nunique() >= 2:
        return evaluate_gemm(frame, hardware, dtype)
    # One model only (e.g. a microbenchmark sweep): hold out sizes of M instead.
    shaped = frame.assign(size_bytes=frame["m"], model="")
    held = held_out_sizes(shaped["size_bytes"])
    return evaluate_gemm(shaped.assign(model=np.where(held, "held-out M", "train")), hardware, dtype)[:1]


def learn_hardware(store: Path, hardware: str) -> list[LearnedTarget]:
    """Fit, score and save every model ``hardware`` has enough rows for."""
    learned = []
    gemms = _forward_rows(load_measurements(store, hardware, "gemm"))
    gemms = gemms[gemms["name"] != "grouped_mm"] if len(gemms) else gemms  # experts' grouped GEMMs: another kernel
    for dtype, frame in gemms.groupby(gemms["dtype"].replace({"bf16": "fp16"}) if len(gemms) else []):
        if len(frame) >= MIN_ROWS:
            frame = frame.reset_index(drop=True)
            learned.append(_save(store, gemm_target(dtype), hardware, dtype, gemm_xy(frame, hardware, dtype),
                                 GEMM_FEATURES, _gemm_scores(frame, hardware, dtype)))
    learned += _learn_attention(store, hardware)
    collectives = load_measurements(store, hardware, "collective")
    for name, frame in collectives.groupby("name") if len(collectives) else []:
        if len(frame) >= MIN_ROWS and frame["size_bytes"].nunique() >= 2 * 4:
            frame = frame.reset_index(drop=True)
            learned.append(_save(store, name, hardware, "", collective_xy(frame, hardware, name),
                                 COLLECTIVE_FEATURES, evaluate_collective(frame, hardware, name),
                                 _collective_domain(frame)))
    return learned + _learn_steps(store, hardware)


def _collective_domain(frame: pd.DataFrame) -> dict[str, float]:
    """The regime a collective model may price in plans: groups inside one NVLink domain, sizes and
    group sizes as measured (tree models do not extrapolate)."""
    inside = frame[frame["devices_per_node"] >= frame["group_size"]]
    if len(inside) == 0:
        return {}
    return {"min_size_bytes": float(inside["size_bytes"].min()), "max_size_bytes": float(inside["size_bytes"].max()),
            "max_group_size": int(inside["group_size"].max())}


def _training_stack(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows a training step's kernels match: untagged rows and paraplan's own PyTorch suite, not a serving engine's
    kernel tables (aiconfigurator's FA3 or TensorRT-LLM attention, Cutlass fp8 GEMMs), which price ``--cost-model
    measured`` through kernel_source.py instead."""
    if "stack" not in frame.columns:
        return frame
    return frame[frame["stack"].isna() | frame["stack"].astype(str).str.startswith("pytorch")]


def _forward_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of forward GEMMs: the training suite also times each GEMM's data and weight gradients (``pass``), which
    the learned model, a function of the forward shape, does not describe."""
    frame = _training_stack(frame)
    if "pass" not in frame.columns:
        return frame
    return frame[frame["pass"].isna() | (frame["pass"] == "forward")]


def _learn_attention(store: Path, hardware: str) -> list[LearnedTarget]:
    """The flash-attention model, when the store has causal attention timings over enough sequence lengths."""
    frame = _training_stack(load_measurements(store, hardware, "attention"))
    if "backend" in frame.columns:  # the training suite times every SDPA backend; the model is flash attention's
        frame = frame[frame["backend"].isna() | frame["backend"].isin(["default", "flash"])]
    if "pass" in frame.columns:  # decode attention (aiconfigurator's generation tables) is another kernel
        frame = frame[frame["pass"].isin(["forward", "backward"])]
    if len(frame) < MIN_ROWS or frame["seq_len"].nunique() < 2 * HELD_OUT_EVERY:
        return []
    frame = frame.reset_index(drop=True)
    return [_save(store, "attention", hardware, "bf16", attention_xy(frame, hardware), ATTENTION_FEATURES,
                  evaluate_attention(frame, hardware))]


def _learn_steps(store: Path, hardware: str) -> list[LearnedTarget]:
    """The step calibration, fitted against the cost model the planner will use for ``hardware`` (auto)."""
    steps = load_measurements(store, hardware, "step")
    runs = [run for run in runs_from_steps(steps) if not is_moe(run.config)] if len(steps) else []
    if len(runs) < MIN_RUNS:
        return []
    rates = compute_rates("auto", load_gpu(hardware), "bf16", "fused", "transformer_engine", store,
                          step_calibration=False)
    measured = np.array([run.measured_step_s for run in runs])
    predicted = np.array([predict_step_s(run.config, hardware, rates) for run in runs])
    score = evaluate_step_calibration(hardware, measured, predicted)
    x, y = np.log(predicted)[:, None], np.log(measured / predicted)
    meta = ArtifactMeta(target="step", hardware=hardware, dtype="", features=STEP_FEATURES,
                        data_hash=training_hash(x, y), sklearn_version=sklearn_version(), num_rows=len(runs),
                        held_out={"split": score.split, "rows": score.num_rows,
                                  "learned_mape_frac": score.learned_mape_frac,
                                  "analytical_mape_frac": score.analytical_mape_frac}, base=rates.source)
    path = save_artifact(models_dir(store), meta, fit_step_calibration(measured, predicted))
    return [LearnedTarget(meta=meta, scores=(score,), path=path)]


def learn(store: Path, hardware: str | None = None) -> dict[str, list[LearnedTarget]]:
    """Learned models per hardware in ``store`` (or only ``hardware``); InputError when there is nothing."""
    available = sorted(set(summarize(store)["hardware"]))
    if hardware is not None and hardware not in available:
        have = ", ".join(available) or "nothing"
        raise InputError(f"the store {store} has no measurements for {hardware!r} (it has: {have})")
    result = {name: learn_hardware(store, name) for name in available if name != "cpu"}
    if not any(result.values()):
        raise InputError(f"the store {store} has too few measurements to learn from (per model at least {MIN_ROWS} "
                         f"rows over {2 * HELD_OUT_EVERY} distinct sizes, or {MIN_RUNS} Megatron runs); ingest more")
    return result
