"""The search's shortcuts give exactly what the plain computation gives: per-distinct-combination terms, block
pricing and tie-only ranking (bench/search_equivalence.py checks whole searches against a saved baseline)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import paraplan.cost_models.estimate as estimate_module
from paraplan.cost_models.estimate import estimate
from paraplan.cost_models.table import ConfigTable, distinct_index, distinct_rows
from paraplan.hardware_profiles import quick_cluster
from paraplan.model_specs.hf_config import load_model
from paraplan.planner.engines import engine_rules
from paraplan.planner.job import TrainingJob
from paraplan.planner.search import TIE_BREAK, _rank
from paraplan.planner.space import AXES, enumerate_space


def _arrays(record, prefix=""):
    """Every per-row array of an estimate table, by dotted name."""
    found = {}
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        if isinstance(value, np.ndarray):
            found[prefix + field.name] = value
        elif dataclasses.is_dataclass(value):
            found |= _arrays(value, f"{prefix}{field.name}.")
    return found


@pytest.mark.parametrize("trial", range(40))
def test_distinct_index_numbers_rows_as_a_sort_would(trial):
    rng = np.random.default_rng(trial)
    size = int(rng.integers(1, 3000))
    makers = (lambda: rng.integers(0, 5, size), lambda: rng.choice([1, 2, 4, 2048, 16384], size),
              lambda: rng.integers(0, 10**12, size), lambda: rng.integers(-3, 3, size), lambda: np.full(size, 7))
    columns = [makers[int(rng.integers(0, len(makers)))]().astype(np.int64) for _ in range(int(rng.integers(1, 7)))]
    representative, index = distinct_index(columns)
    keys = np.stack(columns, axis=1)
    distinct = np.unique(keys, axis=0)
    assert np.array_equal(keys[representative], distinct)
    assert np.array_equal(keys[representative][index], keys)


@pytest.mark.parametrize("trial", range(40))
def test_ranking_equals_a_lexsort_over_every_column(trial):
    rng = np.random.default_rng(trial)
    size = int(rng.integers(0, 400))
    table = ConfigTable.from_columns(**{axis: rng.integers(0, 3, size) for axis in AXES})
    key = np.round(rng.integers(0, 5, size) * 0.1 + (rng.random(size) < 0.1) * 1e-13, 12)
    if trial % 5 == 0 and size:
        key[rng.integers(0, size)] = np.nan
    rows = np.arange(size)
    expected = np.lexsort(tuple(getattr(table, axis) for axis in reversed(TIE_BREAK)) + (key,))
    assert np.array_equal(_rank(key, table, rows), expected)


@pytest.fixture(scope="module")
def moe_space():
    job = TrainingJob(model=load_model("mixtral-8x7b"), seq_len=4096, global_batch=64, precision="fp8")
    cluster = quick_cluster("h100-sxm", 16)
    return job, cluster, enumerate_space(job, cluster, engine_rules("megatron")).table


def test_block_priced_estimate_equals_row_by_row(moe_space, monkeypatch):
    job, cluster, table = moe_space
    work = job.workload()
    whole = _arrays(estimate(job.model, cluster, work, table))
    monkeypatch.setattr(estimate_module, "ROWS_PER_BLOCK", 1000)  # many blocks
    blocked = _arrays(estimate(job.model, cluster, work, table))
    for name, values in whole.items():
        np.testing.assert_array_equal(blocked[name], values, err_msg=name)
    for row in np.random.default_rng(0).choice(len(table), 40, replace=False):  # alone: nothing shared
        alone = _arrays(estimate(job.model, cluster, work, table.take(np.array([row]))))
        for name, values in whole.items():
            np.testing.assert_array_equal(alone[name], values[row:row + 1], err_msg=name)


def test_distinct_rows_hold_their_combination(moe_space):
    _, _, table = moe_space
    axes = estimate_module.LAYER_AXES
    rows, index = distinct_rows(table, axes)
    for axis in axes:
        np.testing.assert_array_equal(getattr(rows, axis)[index], getattr(table, axis))
    assert len(rows) == len({tuple(int(getattr(table, a)[i]) for a in axes) for i in range(len(table))})
