"""Held-out evaluation only: every error here is on rows the model never saw.

GEMMs: leave-one-model-out (fit on every other model's layers, predict the held-out model's).
Attention: held-out sequence lengths, the same way. Collectives: held-out sizes (every HELD_OUT_EVERY-th distinct
message size, all its group shapes, is kept out of training). The analytical model is scored on exactly the same
rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from paraplan.cost_models.learned.features import MeasuredCollective
from paraplan.cost_models.learned.fit import attention_xy, collective_xy, fit_residual, gemm_xy, predict_residual

# One distinct size in four held out, starting at the third: spread over the whole size range,
# the smallest and largest sizes stay in training so the test is interpolation in size.
HELD_OUT_EVERY = 4
HELD_OUT_OFFSET = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Score:
    """Errors of the learned and the analytical model on the same held-out rows."""

    target: str
    """What was predicted: ``gemm`` or a collective name."""
    hardware: str
    """GPU catalog name."""
    split: str
    """How rows were held out."""
    group: str
    """The held-out group (a model name), or ``all`` for the pooled score."""
    num_rows: int
    """Held-out rows scored."""
    learned_mape_frac: float
    """Mean |predicted/measured − 1| of the learned model (0-1, not percent)."""
    learned_worst_frac: float
    """Largest |predicted/measured − 1| of the learned model."""
    analytical_mape_frac: float
    """The same for paraplan's analytical model."""
    analytical_worst_frac: float
    """The same for paraplan's analytical model."""


def _score(target: str, hardware: str, split: str, group: str, measured: np.ndarray, learned: np.ndarray,
           analytical: np.ndarray) -> Score:
    """The errors of ``learned`` and ``analytical`` seconds against the ``measured`` seconds of the same rows."""
    learned_err = np.abs(np.asarray(learned) / measured - 1.0)
    analytical_err = np.abs(np.asarray(analytical) / measured - 1.0)
    return Score(target=target, hardware=hardware, split=split, group=group, num_rows=len(measured),
                 learned_mape_frac=float(learned_err.mean()), learned_worst_frac=float(learned_err.max()),
                 analytical_mape_frac=float(analytical_err.mean()),
                 analytical_worst_frac=float(analytical_err.max()))


def _held_out(target: str, hardware: str, split: str, folds: list[tuple[str, np.ndarray, np.ndarray]],
              xy: tuple[np.ndarray, np.ndarray, np.ndarray], measured: np.ndarray) -> list[Score]:
    """Per fold and pooled scores; each fold's model is fitted without that fold's ``held`` rows
    and scored on its ``scored`` rows (a subset of them)."""
    x, y, analytical = xy
    predicted = np.full(len(y), np.nan)
    scores = []
    for group, held, scored in folds:
        if not scored.any():
            continue
        model = fit_residual(x[~held], y[~held])
        predicted[scored] = analytical[scored] * np.exp(predict_residual(model, x[scored]))
        scores.append(_score(target, hardware, split, group, measured[scored], predicted[scored],
                             analytical[scored]))
    scored = ~np.isnan(predicted)
    return [_score(target, hardware, split, "all", measured[scored], predicted[scored], analytical[scored]), *scores]


def evaluate_gemm(frame: pd.DataFrame, hardware: str, dtype: str, unseen_shapes_only: bool = False) -> list[Score]:
    """Leave-one-model-out scores of the GEMM model: pooled first, then one per model.

    Models share some GEMM shapes (two models with hidden 8192 have the same output projection);
    ``unseen_shapes_only`` scores only held-out rows whose (m, n, k) no training row has.
    """
    shape = frame["m"].astype(str) + "x" + frame["n"].astype(str) + "x" + frame["k"].astype(str)
    folds = []
    for name in sorted(frame["model"].unique()):
        held = (frame["model"] == name).to_numpy()
        scored = held & ~shape.isin(set(shape[~held])).to_numpy() if unseen_shapes_only else held
        folds.append((name, held, scored))
    split = "leave-one-model-out" + (", unseen shapes only" if unseen_shapes_only else "")
    return _held_out("gemm", hardware, split, folds, gemm_xy(frame, hardware, dtype), frame["time_s"].to_numpy())


def held_out_sizes(sizes: pd.Series) -> np.ndarray:
    """Mask of rows whose size is one of the held-out distinct sizes."""
    distinct = np.sort(sizes.unique())
    return sizes.isin(distinct[HELD_OUT_OFFSET::HELD_OUT_EVERY]).to_numpy()


def evaluate_collective(frame: pd.DataFrame, hardware: str, name: MeasuredCollective) -> list[Score]:
    """Held-out-size score of one collective's model (pooled is the only fold)."""
    held = held_out_sizes(frame["size_bytes"])
    scores = _held_out(name, hardware, f"held-out sizes (1 in {HELD_OUT_EVERY})", [("held-out sizes", held, held)],
                       collective_xy(frame, hardware, name), frame["time_s"].to_numpy())
    return scores[:1]


def evaluate_attention(frame: pd.DataFrame, hardware: str) -> list[Score]:
    """Held-out sequence lengths (1 in HELD_OUT_EVERY distinct lengths, both passes) for the attention model."""
    held = held_out_sizes(frame["seq_len"])
    return _held_out("attention", hardware, f"held-out sequence lengths (1 in {HELD_OUT_EVERY})",
                     [("held-out lengths", held, held)], attention_xy(frame, hardware), frame["time_s"].to_numpy())[:1]

