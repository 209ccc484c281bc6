"""Where the search's priced rows go: the memory limits a row must fit in, the fit decision and its tally over the
rows priced so far, and the two sinks of estimates: every row (a search without ``keep``) or only the rows that may
still rank among the best ``keep``. The underscored names are the search's internals, imported only by
planner/search*.py."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from paraplan.choices import Objective
from paraplan.cost_models.estimate import EstimateTable, allocated_like, fill_rows, widened
from paraplan.cost_models.table import ConfigTable, take_rows
from paraplan.planner.search_ranking import _objective_key, _rank, _within_best

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_Record = TypeVar("_Record", bound="DataclassInstance")
"""An estimate table or one of the dataclasses of per-row arrays it holds."""


@dataclass(frozen=True, slots=True)
class _Limits:
    """What a row's memory must fit in, per GPU (bytes)."""

    gpu_bytes: float | np.ndarray
    """Usable HBM less the job's headroom."""
    host_bytes: float
    """Host memory for offloaded activations."""


@dataclass(frozen=True, slots=True)
class _Fit:
    """The fit decision on some rows."""

    required_bytes: np.ndarray
    """Memory each row requires on its GPU."""
    gpu: np.ndarray
    """Whether it fits in the GPU's memory."""
    fits: np.ndarray
    """Whether it fits in the GPU's memory and its offloaded activations in host memory."""


def _fit(required_bytes: np.ndarray, host_bytes: np.ndarray, limits: _Limits) -> _Fit:
    """Which rows, requiring ``required_bytes`` on the GPU and ``host_bytes`` of host memory, fit within ``limits``."""
    gpu = required_bytes <= limits.gpu_bytes
    return _Fit(required_bytes=required_bytes, gpu=gpu, fits=gpu & np.broadcast_to(host_bytes <= limits.host_bytes,
                                                                                  gpu.shape))


@dataclass(slots=True)
class _Tally:
    """What the fit decision found over the rows priced so far, each row counted once (with its final CP variant)."""

    over_gpu: int = 0
    over_host: int = 0
    """Rows that fit the GPU but whose offloaded activations exceed host memory."""
    fitting: int = 0
    smallest_bytes: float = math.inf
    """Least memory a row requires (NaN if any row's is NaN, as numpy's min says)."""

    def add(self, fit: _Fit, final: np.ndarray | None = None) -> None:
        """Count the rows of ``fit`` (those where ``final`` is set)."""
        counted = slice(None) if final is None else final
        self.over_gpu += int(np.count_nonzero(~fit.gpu[counted]))
        self.over_host += int(np.count_nonzero((fit.gpu & ~fit.fits)[counted]))
        self.fitting += int(np.count_nonzero(fit.fits[counted]))
        if fit.required_bytes[counted].size:
            self.smallest_bytes = float(np.minimum(self.smallest_bytes, fit.required_bytes[counted].min()))


def _per_row(record: _Record, size: int) -> _Record:
    """``record`` with every array broadcast to ``size`` rows (a term the cost model left scalar)."""
    changes: dict[str, Any] = {}
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        if isinstance(value, np.ndarray):
            changes[field.name] = np.broadcast_to(value, (size,))
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            changes[field.name] = _per_row(value, size)
    return dataclasses.replace(record, **changes)


def _joined(first: _Record, second: _Record) -> _Record:
    """The rows of ``first``, then those of ``second`` (records of per-row arrays)."""
    changes: dict[str, Any] = {}
    for field in dataclasses.fields(first):
        value = getattr(first, field.name)
        if isinstance(value, np.ndarray):
            changes[field.name] = np.concatenate([value, getattr(second, field.name)])
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            changes[field.name] = _joined(value, getattr(second, field.name))
    return dataclasses.replace(first, **changes)


class _EveryRow:
    """Collects the estimates of every row: a search without ``keep``."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.fits = np.zeros(size, dtype=bool)
        self.estimates: EstimateTable | None = None
        self.owned = False  # whether ``estimates`` holds arrays of its own, to write rows into

    def add(self, rows: np.ndarray | slice, est: EstimateTable, fits: np.ndarray) -> None:
        """Take the estimates and the fit of ``rows`` (a row given again takes its later numbers)."""
        self.fits[rows] = fits
        if self.estimates is None and rows == slice(0, self.size):
            self.estimates = est  # one block covers the table: nothing to copy
            return
        if self.estimates is None or not self.owned:
            whole = allocated_like(est, self.size)
            if self.estimates is not None:
                fill_rows(whole, slice(0, self.size), self.estimates)
            self.estimates, self.owned = whole, True
        fill_rows(self.estimates, rows, est)

    def ranked(self, table: ConfigTable, objective: Objective) -> tuple[ConfigTable, EstimateTable, np.ndarray]:
        """The whole table (int64 columns), its estimates and the fitting rows, best first."""
        assert self.estimates is not None  # every search prices a block, if empty
        fitting = np.flatnonzero(self.fits)
        key = _objective_key(objective, self.estimates)
        return widened(table), self.estimates, fitting[_rank(np.round(key[fitting], 12), table, fitting)]


class _BestRows:
    """Keeps, of the rows priced so far, those that fit and may still rank among the best ``keep``: a search with
    ``keep``. Their estimates are the ones their blocks priced, so the kept numbers are the full search's."""

    def __init__(self, keep: int, objective: Objective) -> None:
        self.keep, self.objective = keep, objective
        self.rows = np.zeros(0, dtype=np.int64)
        self.keys = np.zeros(0)
        self.estimates: EstimateTable | None = None

    def add(self, rows: np.ndarray | slice, est: EstimateTable, fits: np.ndarray) -> None:
        """Join the fitting ones of ``rows`` (estimates ``est``) and drop every row that can no longer rank."""
        chosen = np.flatnonzero(fits)
        est = take_rows(_per_row(est, len(fits)), chosen)
        ids = (np.arange(rows.start, rows.stop) if isinstance(rows, slice) else rows)[chosen]
        keys = np.round(_objective_key(self.objective, est), 12)
        if self.estimates is not None:
            if len(self.keys) >= self.keep:  # already worse than the kept rows' keep-th: skip before joining
                near = _within_best(np.concatenate([self.keys, keys]), self.keep)[len(self.keys):]
                ids, keys, est = ids[near], keys[near], take_rows(est, np.flatnonzero(near))
            ids, keys = np.concatenate([self.rows, ids]), np.concatenate([self.keys, keys])
            est = _joined(self.estimates, est)
        stay = _within_best(keys, self.keep)
        self.rows, self.keys, self.estimates = ids[stay], keys[stay], take_rows(est, np.flatnonzero(stay))

    def keep_th(self) -> float:
        """The keep-th smallest key kept (inf while fewer rows are kept; NaN where fewer are numbers): a row whose
        key is larger can no longer rank."""
        return float(np.partition(self.keys, self.keep - 1)[self.keep - 1]) if len(self.keys) >= self.keep \
            else math.inf

    def ranked(self, table: ConfigTable, objective: Objective) -> tuple[ConfigTable, EstimateTable, np.ndarray]:
        """The kept rows best first (int64 columns), their estimates and ranks 0, 1, ...: ranked as the full
        search ranks them, since its tie-break by position follows the row order restored here."""
        assert self.estimates is not None  # every search prices a block, if empty
        by_row = np.argsort(self.rows)
        order = by_row[_rank(self.keys[by_row], table.take(self.rows[by_row]), np.arange(len(by_row)))][:self.keep]
        return widened(table.take(self.rows[order])), take_rows(self.estimates, order), np.arange(len(order))
