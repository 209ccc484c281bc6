"""Fitting the learned models: gradient-boosted trees on log(measured / analytical).

Hyper-parameters are fixed (no tuning on held-out rows): shallow trees, many of them, a small
learning rate, and a fixed seed so a refit on the same data gives the same model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from paraplan.cost_models.learned.artifacts import Regressor
from paraplan.cost_models.learned.features import (
    MeasuredCollective,
    attention_features,
    attention_rates,
    baseline_rates,
    collective_features,
    gemm_features,
    reference_cluster,
)

SEED = 0
# Trees of depth 6 on <= 7 features, 400 rounds at rate 0.1, chosen before looking at held-out
# errors; sensitivity checked afterwards on H100 (vidur): 200 / 400 / 800 rounds give GEMM held-out
# MAPE 6.11 / 5.95 / 5.89% and all-reduce 4.39 / 4.33 / 4.29%. min_samples_leaf 20 keeps leaves
# above single noisy rows.
TREE_SETTINGS = {"max_iter": 400, "learning_rate": 0.1, "max_depth": 6, "min_samples_leaf": 20,
                 "random_state": SEED}


if TYPE_CHECKING:  # pandas and threadpoolctl load where models are fitted or applied, not when planning
    import pandas as pd
    from sklearn.ensemble import HistGradientBoostingRegressor
    from threadpoolctl import threadpool_limits


def regressor() -> HistGradientBoostingRegressor:
    """A fresh, unfitted regressor with the fixed settings (scikit-learn loads here, not at import)."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    return HistGradientBoostingRegressor(**TREE_SETTINGS)


def gemm_xy(frame: pd.DataFrame, hardware: str, dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features, log residual target, analytical seconds) of the GEMM rows of ``frame``."""
    x = gemm_features(frame["m"], frame["n"], frame["k"], baseline_rates(hardware, dtype))
    analytical = np.exp(x[:, -1])
    return x, np.log(frame["time_s"].to_numpy() / analytical), analytical


def causal_flops(frame: pd.DataFrame) -> pd.Series:
    """Forward FLOPs of causal attention: QKᵀ and PV over the lower triangle, 2·b·h·s²·d."""
    return 2.0 * frame["batch"] * frame["heads"] * frame["seq_len"] ** 2 * frame["head_dim"]


def attention_xy(frame: pd.DataFrame, hardware: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features, log residual target, analytical seconds) of the attention rows of ``frame``."""
    backward = (frame["pass"] == "backward").to_numpy().astype(float)
    x = attention_features(causal_flops(frame).to_numpy(), backward, attention_rates(hardware))
    analytical = np.exp(x[:, -1])
    return x, np.log(frame["time_s"].to_numpy() / analytical), analytical


def collective_xy(frame: pd.DataFrame, hardware: str,
                  name: MeasuredCollective) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features, log residual target, analytical seconds) of one collective's rows of ``frame``."""
    pairwise = frame["setup"].fillna("").str.contains("pairwise").astype(float) if "setup" in frame else 0.0
    x = collective_features(name, frame["size_bytes"], frame["group_size"], frame["devices_per_node"], pairwise,
                            reference_cluster(hardware))
    analytical = np.exp(x[:, -1])
    return x, np.log(frame["time_s"].to_numpy() / analytical), analytical


def fit_residual(x: np.ndarray, y: np.ndarray) -> HistGradientBoostingRegressor:
    """A regressor fitted to predict ``y`` (log measured/analytical) from ``x``."""
    with one_thread():
        return regressor().fit(x, y)


def predict_residual(estimator: Regressor, x: np.ndarray) -> np.ndarray:
    """``estimator``'s prediction for ``x`` (log measured/analytical)."""
    with one_thread():
        return estimator.predict(x)


def one_thread() -> threadpool_limits:
    """One OpenMP thread: the trees are small, and on a shared machine OpenMP's spinning threads
    made a 2 s fit take 80 s (measured on the 2-core CI box under load)."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1)
