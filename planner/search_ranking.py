"""How the search ranks rows: what an objective ranks by, the tie-break between equal predictions, the full ranking,
and which keys may still rank among the best few. The search's sinks (search_sinks.py) rank with these; the
underscored names are the search's internals, imported only by planner/search*.py."""

from __future__ import annotations

import numpy as np

from paraplan.choices import Objective
from paraplan.cost_models.estimate import EstimateTable
from paraplan.cost_models.table import ConfigTable

# Equal predictions rank the simpler layout first: fewer kinds of parallelism and memory tricks
# to debug (context, pipeline, interleaving, tensor; offload, recompute, sharding), then the rest.
TIE_BREAK = ("cp", "cp_comm", "pp", "pp_schedule", "vpp", "tp", "offload", "recompute", "zero", "sp", "tp_overlap",
             "ep_overlap", "etp", "ep", "dp", "mbs")


def _objective_key(objective: Objective, est: EstimateTable) -> np.ndarray:
    """What ``objective`` ranks by, per row (smaller first). Cost ranks as throughput: dollars for a fixed budget
    on one cluster = price x GPUs x steps x step time, the step time times a constant (planner/run/cost.py prices
    the run; a cheaper, slower GPU type can win only between clusters, as in planner/run/sweep.py's best_per_size)."""
    return est.memory.peak_bytes if objective == "memory" else est.step_time_s


def _rank(key: np.ndarray, table: ConfigTable, rows: np.ndarray) -> np.ndarray:
    """Order of ``rows`` of ``table`` by ``key`` (one value per row), ties by TIE_BREAK (smaller values first),
    then by position: what np.lexsort over all of them gives, without sorting every row by every column.
    Ties are few, so the rows are sorted by ``key`` alone and only the tied runs by the rest."""
    by_key = np.argsort(key)
    sorted_key = key[by_key]
    tied = sorted_key[1:] == sorted_key[:-1]  # position i ties with i + 1
    if np.isnan(sorted_key[-1:]).any():  # NaN never equals itself: leave such keys to the full sort
        return np.lexsort(tuple(getattr(table, axis)[rows] for axis in reversed(TIE_BREAK)) + (key,))
    if not tied.any():
        return by_key
    in_run = np.zeros(len(key), dtype=bool)
    in_run[:-1] |= tied
    in_run[1:] |= tied
    positions = np.flatnonzero(in_run)
    run = np.cumsum(np.r_[True, sorted_key[positions[1:]] != sorted_key[positions[:-1]]])
    tied_rows = by_key[positions]
    within = np.lexsort((tied_rows,) + tuple(getattr(table, axis)[rows[tied_rows]] for axis in reversed(TIE_BREAK))
                        + (run,))
    by_key[positions] = tied_rows[within]
    return by_key


def _within_best(keys: np.ndarray, keep: int) -> np.ndarray:
    """Per key, whether it may rank among the ``keep`` best: it is no worse than the keep-th smallest. NaN sorts
    last, as in numpy's sorts (where fewer than ``keep`` keys are numbers, every key stays); keys tied with the
    keep-th stay, for the tie-break to decide."""
    if len(keys) <= keep:
        return np.ones(len(keys), dtype=bool)
    bound = np.partition(keys, keep - 1)[keep - 1]
    return np.ones(len(keys), dtype=bool) if np.isnan(bound) else keys <= bound
