"""Leave-one-source-out refits of the constants fitted to published runs, and the errors they give.

The sustained GEMM and attention fractions of ``efficiency.yaml`` are the only constants of the analytical
model fitted to ``data/reference_runs.csv``; the rest come from datasheets and kernel measurements (the GEMM
shape curve and launch overhead from measured GEMMs, NVLink and NIC fractions from measured collectives). An
error measured on the rows those fractions were fitted to says how well the model fits, not how well it
predicts. Here every fitted fraction is refitted with one source left out, and that source is predicted with
constants it did not influence; ``paraplan validate --cross-source`` prints both errors side by side.

A fold is fitted in four steps:

1. Each dense row reads one GEMM fraction (its GPU's efficiency entry, its engine's kernel stack, its
   precision; unfused attention runs at it too) and, with flash-family attention, one attention fraction.
2. Each row is predicted through the planner's search on a coarse grid of those two fractions, and its time
   per token is interpolated bilinearly in (1/gemm, 1/attention), where it is close to linear: compute time
   is work over rate. A fine grid (0.01 steps) of the interpolant is what the fit searches.
3. Coordinate descent from efficiency.yaml's defaults: each constant in turn takes the value minimising the
   criterion of ``bench/calibrate.py`` (median |error| + max |error| / 4) over the training rows that read
   it, until none moves.
4. A constant that no training row reads is not fitted: a kernel stack's override falls back to the GPU's
   shared fraction (no evidence of a difference, none assumed); a shared fraction takes the median of the
   same constant fitted on the fold's other GPUs, else the defaults (from isolated-GEMM measurements).

The left-out rows are then predicted exactly, through the search, with the fold's constants. MoE rows read
the same constants but are in no fit (their error is dominated by MoE mechanisms, not by these fractions), so
they are not part of this report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from paraplan.arrays import Column
from paraplan.hardware_profiles import catalog
from paraplan.hardware_profiles.specs import EfficiencySpec, GPUSpec
from paraplan.model_specs.hf_config import load_model
from paraplan.planner.engines import engine_rules
from paraplan.validation.reference import measured_tokens_per_s_per_gpu, search_row

GEMM_FIELD, STACK_FIELD, ATTENTION_FIELD = "gemm_peak_frac", "stack_gemm_peak_frac", "attention_peak_frac"
COARSE_GEMM = (0.30, 0.40, 0.50, 0.60, 0.70, 0.80, 0.90)
COARSE_ATTENTION = (0.10, 0.15, 0.20, 0.30, 0.40, 0.50, 0.70)
"""Where each row is predicted through the search. Every fraction fitted today lies inside (0.18-0.70); the
attention grid is denser at the low end, where FlashAttention-2 on Hopper sits (0.18)."""
FINE_STEP = 0.01
"""The resolution of a fitted fraction (efficiency.yaml states them to 0.01 at best)."""
MAX_SWEEPS = 20
PRIOR_WEIGHT = 0.05
"""Criterion points per unit of |ln(fitted / default)|: a fraction 20% off its default costs 0.9 points.
Step times rarely separate a GEMM fraction from the attention fraction read beside it (one slower, the other
faster, predicts about the same), and on such a ridge an unweighted fit wanders to values no kernel reaches
(H100 fp8 at 0.86 of peak with cuDNN attention at 0.26). 0.05 is the smallest of 0, 0.01, 0.02, 0.05 for which
every fraction refitted on all rows stays under the isolated-GEMM fraction measured on that silicon (0.80
H100, 0.77 A100: efficiency.yaml's sources); the left-out-source median is 7.5% at 0, 0.02 and 0.05 alike
(python bench/cross_source.py --weights 0,0.02)."""
LEVELS = ("source", "table")
"""What a fold leaves out: a publication (the ``source`` column: a stack and GPUs the fit has not seen), or
one table of one (the ``table`` column: for NeMo one container release on one system)."""


@dataclass(frozen=True, slots=True, order=True)
class Constant:
    """One fitted fraction: where it lives in efficiency.yaml."""

    gpu: str
    """The efficiency.yaml entry (GPUs with identical constants, such as A100 40 GB and 80 GB, share it)."""
    field: str
    """``gemm_peak_frac``, ``stack_gemm_peak_frac`` or ``attention_peak_frac``."""
    key: str
    """The dtype, or the attention kernel."""
    stack: str = ""
    """The kernel stack of a ``stack_gemm_peak_frac`` override."""

    @property
    def label(self) -> str:
        """e.g. 'h100-sxm gemm fp8 (pytorch)' or 'gb200 attention fused'."""
        kind = "attention" if self.field == ATTENTION_FIELD else "gemm"
        return f"{self.gpu} {kind} {self.key}" + (f" ({self.stack})" if self.stack else "")


# -- which constants a row reads -----------------------------------------------------------------------------
def _constants_only(spec: EfficiencySpec) -> EfficiencySpec:
    return dataclasses.replace(spec, source="")


@cache  # efficiency.yaml's entries never change within a process (catalog_efficiency swaps GPU specs only)
def chip_entry(gpu_name: str) -> str:
    """The efficiency.yaml entry whose constants ``gpu_name`` uses: the first entry with identical constants
    (a100-sxm-40gb reads a100-sxm-80gb's), or ``*`` for a GPU on the defaults."""
    own, name = catalog.efficiency_of(gpu_name)
    if name == catalog.DEFAULT_EFFICIENCY:
        return "*"
    for entry in catalog._efficiency_file()["gpus"]:
        if _constants_only(catalog.efficiency_of(entry)[0]) == _constants_only(own):
            return entry
    return gpu_name


def entry_members(entry: str) -> list[str]:
    """Every catalog GPU that reads the constants of efficiency.yaml entry ``entry``."""
    return [name for name in catalog._gpu_table() if chip_entry(name) == entry]


def gemm_constant(entry: str, spec: EfficiencySpec, stack: str, dtype: str) -> Constant:
    """The fraction ``analytical_rates`` reads for ``dtype`` GEMMs on ``stack`` (override, shared, bf16)."""
    if dtype in spec.stack_gemm_peak_frac.get(stack, {}):
        return Constant(entry, STACK_FIELD, dtype, stack)
    return Constant(entry, GEMM_FIELD, dtype if dtype in spec.gemm_peak_frac else "bf16")


def row_constants(row: pd.Series) -> tuple[Constant, Constant | None]:
    """The GEMM fraction a reference row reads and its attention fraction (None: unfused, which runs at the
    16-bit GEMM fraction of its stack and so adds no constant of its own)."""
    entry = chip_entry(row["gpu"])
    spec = catalog.load_gpu(row["gpu"]).efficiency
    stack = engine_rules(row["engine"]).kernel_stack
    gemm = gemm_constant(entry, spec, stack, row["precision"])
    if row["attention"] == "unfused":
        return gemm_constant(entry, spec, stack, "bf16"), None
    return gemm, Constant(entry, ATTENTION_FIELD, row["attention"])


@cache
def fitted_constants() -> tuple[Constant, ...]:
    """Every fraction efficiency.yaml sets per GPU entry (not the defaults): what a fit may move."""
    out = []
    for entry, override in catalog._efficiency_file()["gpus"].items():
        if chip_entry(entry) != entry:
            continue  # a copy of another entry's constants (same silicon): fitted there
        out += [Constant(entry, GEMM_FIELD, key) for key in override.get(GEMM_FIELD, {})]
        out += [Constant(entry, STACK_FIELD, key, stack) for stack, table in override.get(STACK_FIELD, {}).items()
                for key in table]
        out += [Constant(entry, ATTENTION_FIELD, key) for key in override.get(ATTENTION_FIELD, {})]
    return tuple(out)


def shipped_value(constant: Constant) -> float:
    """The constant's value in efficiency.yaml."""
    spec = catalog.efficiency_of(constant.gpu)[0]
    if constant.field == STACK_FIELD:
        return spec.stack_gemm_peak_frac[constant.stack][constant.key]
    return getattr(spec, constant.field)[constant.key]


def default_value(constant: Constant) -> float:
    """What efficiency.yaml's defaults (isolated-GEMM measurements and kernel reports, no published run) give."""
    spec = catalog.default_efficiency()
    table = spec.attention_peak_frac if constant.field == ATTENTION_FIELD else spec.gemm_peak_frac
    return table.get(constant.key, table.get("bf16", np.nan))


# -- running the model with other constants -------------------------------------------------------------------
def with_constants(spec: EfficiencySpec, values: dict[Constant, float]) -> EfficiencySpec:
    """``spec`` with ``values`` (constants of one entry) in place of its own."""
    gemm, attention = dict(spec.gemm_peak_frac), dict(spec.attention_peak_frac)
    stacks = {stack: dict(table) for stack, table in spec.stack_gemm_peak_frac.items()}
    for constant, value in values.items():
        if constant.field == STACK_FIELD:
            stacks.setdefault(constant.stack, {})[constant.key] = float(value)
        else:
            (attention if constant.field == ATTENTION_FIELD else gemm)[constant.key] = float(value)
    return dataclasses.replace(spec, gemm_peak_frac=gemm, attention_peak_frac=attention,
                               stack_gemm_peak_frac=stacks)


def without_overrides(spec: EfficiencySpec, dropped: list[Constant]) -> EfficiencySpec:
    """``spec`` with the kernel-stack overrides ``dropped`` removed (the shared fraction applies)."""
    gone = {(c.stack, c.key) for c in dropped}
    stacks = {stack: {k: v for k, v in table.items() if (stack, k) not in gone}
              for stack, table in spec.stack_gemm_peak_frac.items()}
    return dataclasses.replace(spec, stack_gemm_peak_frac={s: t for s, t in stacks.items() if t})


@contextmanager
def catalog_efficiency(specs: dict[str, EfficiencySpec]) -> Iterator[None]:
    """Within the block, the built-in GPUs named by ``specs`` (efficiency.yaml entries) and every GPU sharing
    their constants use the given specs; the catalog is restored on exit. Single-threaded use only."""
    table = catalog._gpu_table()
    saved: dict[str, GPUSpec] = {}
    try:
        for entry, spec in specs.items():
            for name in entry_members(entry):
                saved[name] = table[name]
                table[name] = dataclasses.replace(table[name], efficiency=spec)
        yield
    finally:
        table.update(saved)


def predict_tokens_per_s(row: pd.Series) -> float:
    """The search's best tokens/s per GPU for one reference row under the catalog as it stands."""
    _, _, result, _ = search_row(row)
    if len(result.ranked) == 0:
        return float("nan")
    return float(result.estimates.tokens_per_s_per_gpu[int(result.ranked[0])])


# -- the surrogate: each row's prediction over a grid of its two constants -------------------------------------
@dataclass(frozen=True)
class RowGrid:
    """Every dense row's predicted tokens/s on the fine grid of its constants."""

    frame: pd.DataFrame
    """The dense rows, with ``measured`` (tokens/s per GPU) added."""
    gemm: list[Constant]
    attention: list[Constant | None]
    fine_gemm: np.ndarray
    fine_attention: np.ndarray
    tokens_per_s: np.ndarray
    """[row, gemm index, attention index] on the fine grids (attention axis constant for unfused rows)."""


def _fine(coarse: tuple[float, ...]) -> np.ndarray:
    return np.round(np.arange(coarse[0], coarse[-1] + FINE_STEP / 2, FINE_STEP), 2)


def _interpolate(coarse_x: tuple[float, ...], fine_x: np.ndarray, values: np.ndarray, axis: int) -> np.ndarray:
    """Linear interpolation of ``values`` along ``axis`` in 1/x (near linear there: time = work / rate)."""
    x_from, x_to = 1.0 / np.asarray(coarse_x)[::-1], 1.0 / fine_x
    flipped = np.flip(values, axis=axis)
    return np.apply_along_axis(lambda v: np.interp(x_to, x_from, v), axis, flipped)


def row_grid(frame: pd.DataFrame, progress: Callable[[int, int], None] | None = None) -> RowGrid:
    """Predict each row of ``frame`` on the coarse grid and interpolate to the fine one."""
    fine_g, fine_a = _fine(COARSE_GEMM), _fine(COARSE_ATTENTION)
    gemms, attentions, surfaces, measured = [], [], [], []
    base = {entry: catalog.efficiency_of(entry)[0] for entry in catalog._efficiency_file()["gpus"]}
    base["*"] = catalog.default_efficiency()  # GPUs on the defaults: predicted on the grid, never shipped as a fit
    for done, (_, row) in enumerate(frame.iterrows()):
        gemm, attention = row_constants(row)
        seconds = np.empty((len(COARSE_GEMM), len(COARSE_ATTENTION) if attention else 1))
        for i, g in enumerate(COARSE_GEMM):
            for j in range(seconds.shape[1]):
                values = {gemm: g} | ({attention: COARSE_ATTENTION[j]} if attention else {})
                with catalog_efficiency({gemm.gpu: with_constants(base[gemm.gpu], values)}):
                    seconds[i, j] = 1.0 / predict_tokens_per_s(row)
        seconds = _interpolate(COARSE_GEMM, fine_g, seconds, 0)
        seconds = _interpolate(COARSE_ATTENTION, fine_a, seconds, 1) if attention else \
            np.repeat(seconds, len(fine_a), axis=1)
        gemms.append(gemm)
        attentions.append(attention)
        surfaces.append(1.0 / seconds)
        measured.append(measured_tokens_per_s_per_gpu(row, load_model(row["model"])))
        if progress:
            progress(done + 1, len(frame))
    return RowGrid(frame.assign(measured=measured).reset_index(drop=True), gemms, attentions, fine_g, fine_a,
                   np.array(surfaces))


def criterion(errors: np.ndarray) -> np.ndarray:
    """What a fit minimises over the errors on the last axis: median |error| + a quarter of the max (the worst
    row counts, but less than the typical one). bench/calibrate.py ranks its grid by the same."""
    magnitude = np.abs(errors)
    return np.median(magnitude, axis=-1) + magnitude.max(axis=-1) / 4


def fit(grid: RowGrid, train: np.ndarray) -> dict[Constant, float]:
    """The constants the ``train`` rows (a boolean mask) read, fitted from the defaults: per group of constants
    linked by rows, descent on one criterion over the group's rows, moving one constant or the two one row reads
    together (a GEMM and an attention fraction trade off against each other: moving one alone stalls)."""
    train_rows = np.flatnonzero(train)
    values = {c: default_value(c) for i in train_rows for c in (grid.gemm[i], grid.attention[i]) if c}
    for constants, rows in _linked_groups(grid, train_rows):
        _descend(grid, rows, constants, values)
    return values


def _prior_penalty(constant: Constant, value: Column) -> np.ndarray:
    """PRIOR_WEIGHT x |ln(value / default)|: what moving a constant away from the defaults costs the fit."""
    return PRIOR_WEIGHT * np.abs(np.log(np.asarray(value, dtype=float) / default_value(constant)))


def _linked_groups(grid: RowGrid, rows: np.ndarray) -> list[tuple[list[Constant], np.ndarray]]:
    """The rows split into groups that share no constant, each with the constants its rows read."""
    groups: list[tuple[set[Constant], list[int]]] = []
    for i in rows:
        read = {c for c in (grid.gemm[i], grid.attention[i]) if c}
        linked = [g for g in groups if g[0] & read]
        merged = (read.union(*(g[0] for g in linked)), [i] + [r for g in linked for r in g[1]])
        groups = [g for g in groups if g not in linked] + [merged]
    return [(sorted(constants), np.array(sorted(members))) for constants, members in groups]


def _descend(grid: RowGrid, rows: np.ndarray, constants: list[Constant], values: dict[Constant, float]) -> None:
    """Move single constants and co-read pairs to their best grid values until the objective stops falling.

    The objective is the sum over the group's constants of the criterion over the rows that read each (so a
    constant seven rows read is judged on those seven, not drowned in a median over seventy) plus the prior."""
    axis = {c: grid.fine_attention if c.field == ATTENTION_FIELD else grid.fine_gemm for c in constants}
    measured = grid.frame.measured.to_numpy()[rows]
    gemm_of, attention_of = [grid.gemm[i] for i in rows], [grid.attention[i] for i in rows]
    readers = {c: np.array([c in (g, a) for g, a in zip(gemm_of, attention_of)]) for c in constants}
    pairs = sorted({(g, a) for g, a in zip(gemm_of, attention_of) if a is not None})
    moves = [(c,) for c in constants] + pairs

    def index(constant: Constant | None) -> int:
        return 0 if constant is None else int(np.abs(axis[constant] - values[constant]).argmin())

    def objective(errors: np.ndarray) -> np.ndarray:
        # asarray: sum() is typed to start from the int 0; every group has constants, so this is an array already.
        return np.asarray(sum(criterion(errors[..., readers[c]]) for c in constants))

    def scores(move: tuple[Constant, ...]) -> tuple[np.ndarray, list[np.ndarray]]:
        meshes = [m.ravel() for m in np.meshgrid(*(np.arange(len(axis[c])) for c in move), indexing="ij")]
        at = {c: mesh[:, None] for c, mesh in zip(move, meshes)}
        gemm_at = np.column_stack([at.get(c, np.full((len(meshes[0]), 1), index(c))) for c in gemm_of])
        attention_at = np.column_stack([at.get(c, np.full((len(meshes[0]), 1), index(c))) if c else
                                        np.zeros((len(meshes[0]), 1), int) for c in attention_of])
        errors = grid.tokens_per_s[rows[None, :], gemm_at, attention_at] / measured - 1.0
        moved = sum(_prior_penalty(c, axis[c][mesh]) for c, mesh in zip(move, meshes))
        kept = sum(_prior_penalty(c, values[c]) for c in constants if c not in move)
        return objective(errors) + moved + kept, meshes

    now = grid.tokens_per_s[rows, [index(c) for c in gemm_of], [index(c) for c in attention_of]]
    best = float(objective(now / measured - 1.0) + sum(_prior_penalty(c, values[c]) for c in constants))
    for _ in range(MAX_SWEEPS):
        improved = False
        for move in moves:
            candidate_scores, meshes = scores(move)
            k = int(np.argmin(candidate_scores))
            if candidate_scores[k] < best - 1e-12:
                best, improved = float(candidate_scores[k]), True
                for c, mesh in zip(move, meshes):
                    values[c] = float(axis[c][mesh[k]])
        if not improved:
            break


def fold_specs(fitted: dict[Constant, float]) -> dict[str, EfficiencySpec]:
    """The efficiency specs of a fold: its fitted constants; unfitted ones by step 4 of the module doc."""
    specs = {}
    for entry in dict.fromkeys(c.gpu for c in fitted_constants()):
        spec = catalog.efficiency_of(entry)[0]
        own = {c: v for c, v in fitted.items() if c.gpu == entry}
        unfitted = [c for c in fitted_constants() if c.gpu == entry and c not in own]
        transferred = {}
        for c in unfitted:
            if c.field == STACK_FIELD:
                continue
            peers = [v for f, v in fitted.items() if (f.field, f.key, f.stack) == (c.field, c.key, c.stack)]
            transferred[c] = float(np.median(peers)) if peers else default_value(c)
        spec = without_overrides(spec, [c for c in unfitted if c.field == STACK_FIELD])
        specs[entry] = with_constants(spec, transferred | own)
    return specs


# -- the report ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Fold:
    """One left-out group: how its rows fare with the shipped constants and with constants fitted without it."""

    level: str
    name: str
    rows: int
    in_sample_errors: tuple[float, ...]
    left_out_errors: tuple[float, ...]
    moved: tuple[tuple[str, float, float], ...]
    """Constants the left-out rows read whose fold value differs from the shipped one: (label, shipped, fold)."""


@dataclass(frozen=True)
class CrossSource:
    """Every fold of both levels, and the refit on all rows beside the shipped constants."""

    folds: list[Fold]
    all_rows_refit: dict[Constant, float]
    row_ids: list[str]
    in_sample_errors: np.ndarray
    """Each row's error with the shipped constants (what ``paraplan validate`` reports)."""
    refit_errors: np.ndarray
    """Each row's error with ``all_rows_refit``: this module's fit, in sample, beside the hand fit it checks."""
    left_out_errors: dict[str, np.ndarray]
    """Per level, each row's error when predicted by the fold that left it out."""


def _errors(frame: pd.DataFrame, specs: dict[str, EfficiencySpec] | None = None) -> np.ndarray:
    with catalog_efficiency(specs or {}):
        predicted = np.array([predict_tokens_per_s(row) for _, row in frame.iterrows()])
    return predicted / frame.measured.to_numpy() - 1.0


def dense_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``frame`` that train dense models (the rows the fractions are fitted to)."""
    return frame[[not load_model(m).is_moe for m in frame.model]]


def cross_source(frame: pd.DataFrame, progress: Callable[[int, int], None] | None = None) -> CrossSource:
    """Refit and predict every fold of every level over the dense rows of ``frame``."""
    return folds_of(row_grid(dense_rows(frame), progress))


def folds_of(grid: RowGrid,
             predict: Callable[[pd.DataFrame, dict[str, EfficiencySpec]], np.ndarray] | None = None) -> CrossSource:
    """Every fold of ``grid``'s rows; the left-out rows are predicted by ``predict(rows, specs)`` (default:
    through the search, exactly)."""
    predict = predict or _errors
    rows = grid.frame
    in_sample = predict(rows, {})
    folds, left_out = [], {}
    for level in LEVELS:
        errors = np.full(len(rows), np.nan)
        for name in dict.fromkeys(rows[level]):
            held = (rows[level] == name).to_numpy()
            fitted = fit(grid, ~held)
            specs = fold_specs(fitted)
            errors[held] = predict(rows[held], specs)
            read = sorted({c for i in np.flatnonzero(held) for c in (grid.gemm[i], grid.attention[i]) if c})
            moved = tuple((c.label, shipped_value(c), _value(specs[c.gpu], c)) for c in read
                          if c in fitted_constants() and abs(_value(specs[c.gpu], c) - shipped_value(c)) > 1e-9)
            folds.append(Fold(level, name, int(held.sum()), tuple(in_sample[held]), tuple(errors[held]), moved))
        left_out[level] = errors
    refit = fit(grid, np.ones(len(rows), bool))
    return CrossSource(folds, refit, list(rows.id), in_sample, predict(rows, fold_specs(refit)), left_out)


def _value(spec: EfficiencySpec, constant: Constant) -> float:
    """What ``analytical_rates`` would read for ``constant`` from ``spec`` (an absent override: the shared one)."""
    if constant.field == STACK_FIELD:
        return spec.stack_gemm_peak_frac.get(constant.stack, {}).get(constant.key, spec.gemm_peak_frac[constant.key])
    return getattr(spec, constant.field)[constant.key]


def short_label(level: str, name: str) -> str:
    """A fold's name as a table shows it: a publication up to its first comma; a table without the file it was
    read from or its 'pre-training' section, e.g. '26.06 NeMo container; DGX-GB300'."""
    if level == "source":  # up to the first comma outside parentheses
        depth = 0
        for i, char in enumerate(name):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if char == "," and depth == 0:
                return name[:i]
        return name
    parts = [p for p in name.split("; ") if not p.endswith(".md") and not p.startswith("pre-training")]
    return "; ".join(parts) or name


def summary(errors: ArrayLike) -> dict[str, float]:
    """Median and max |error| (fractions) and the median signed error."""
    values = np.asarray(errors, dtype=float)
    values = values[np.isfinite(values)]
    return {"rows": len(values), "median_abs_error_frac": float(np.median(np.abs(values))),
            "max_abs_error_frac": float(np.abs(values).max()), "bias_frac": float(np.median(values))}
