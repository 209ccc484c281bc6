"""Step-level calibration: how far paraplan's whole-step prediction sits from measured full runs.

Fitted on log(measured / predicted) step time of the runs in the store for one hardware with a
scikit-learn median regressor (``DummyRegressor``): one multiplicative factor, robust to an odd
run, and all a handful of runs can support. Scored leave-one-run-out only. Applied where the
estimate is finished (``apply_step_factor``): every time term scales by the factor, so the
breakdown still sums to the step, and the rates (tokens/s, MFU, HFU) scale by its inverse.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from paraplan.cost_models.estimate import EstimateTable

MIN_RUNS = 2  # one run cannot be held out from itself
STEP_FEATURES = ("log_predicted_step_s",)  # recorded for the artifact; the median regressor ignores it
TIME_TERMS = ("step_time_s", "compute_s", "tp_comm_s", "cp_comm_s", "pp_comm_s", "bubble_s", "dp_comm_s",
              "offload_s", "optimizer_s")
RATE_TERMS = ("tokens_per_s", "tokens_per_s_per_gpu", "model_flops_per_s_per_gpu", "mfu", "hfu")

if TYPE_CHECKING:  # scikit-learn loads where a calibration is fitted: it is most of every command's start-up
    from sklearn.dummy import DummyRegressor

    from paraplan.cost_models.learned.evaluate import Score


def fit_step_calibration(measured_s: np.ndarray, predicted_s: np.ndarray) -> DummyRegressor:
    """The median log ratio measured/predicted, as a fitted scikit-learn regressor."""
    from sklearn.dummy import DummyRegressor

    ratio = np.log(np.asarray(measured_s, dtype=float) / np.asarray(predicted_s, dtype=float))
    return DummyRegressor(strategy="median").fit(np.zeros((len(ratio), 1)), ratio)


def step_factor(estimator: DummyRegressor) -> float:
    """The multiplicative factor on predicted step time."""
    return float(np.exp(estimator.predict(np.zeros((1, 1)))[0]))


def evaluate_step_calibration(hardware: str, measured_s: np.ndarray, predicted_s: np.ndarray) -> Score:
    """Leave-one-run-out: each run's calibrated prediction uses a factor fitted on the other runs."""
    from paraplan.cost_models.learned.evaluate import Score  # pandas: only when scoring, never when planning

    measured, predicted = np.asarray(measured_s, dtype=float), np.asarray(predicted_s, dtype=float)
    calibrated = np.array([predicted[i] * step_factor(fit_step_calibration(np.delete(measured, i),
                                                                           np.delete(predicted, i)))
                           for i in range(len(measured))])
    learned_err, analytical_err = np.abs(calibrated / measured - 1), np.abs(predicted / measured - 1)
    return Score(target="step", hardware=hardware, split="leave-one-run-out", group="all", num_rows=len(measured),
                 learned_mape_frac=float(learned_err.mean()), learned_worst_frac=float(learned_err.max()),
                 analytical_mape_frac=float(analytical_err.mean()), analytical_worst_frac=float(analytical_err.max()))


def apply_step_factor(est: EstimateTable, factor: float) -> EstimateTable:
    """``est`` with every time term times ``factor`` and every rate divided by it."""
    if factor == 1.0:
        return est
    changes = {name: getattr(est, name) * factor for name in TIME_TERMS}
    changes |= {name: getattr(est, name) / factor for name in RATE_TERMS}
    return dataclasses.replace(est, **changes)
