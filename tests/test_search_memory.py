"""A search told to keep its best rows prices the table a block at a time and keeps only what can still rank:
the rows it returns, their numbers and the counts must be the full search's exactly, whatever the block size,
and the memory it holds must follow the block instead of the table (issue 33)."""

from __future__ import annotations

import dataclasses
import tracemalloc

import numpy as np
import pytest

from paraplan.cost_models.device_memory import usable_capacity_bytes
from paraplan.cost_models.estimate import ROWS_PER_BLOCK, estimate
from paraplan.cost_models.table import ConfigTable
from paraplan.hardware_profiles import quick_cluster
from paraplan.model_specs.hf_config import load_model
from paraplan.planner import search_blocks
from paraplan.planner.engines import engine_rules
from paraplan.planner.job import TrainingJob
from paraplan.planner.search import TIE_BREAK, _rank, explain_no_fit, search
from paraplan.planner.space import AXES, enumerate_space

P2P, GATHER = 0, 2


@pytest.fixture(scope="module")
def llama8b():
    return load_model("llama-3.1-8b")


def _arrays(record, prefix=""):
    """Every array of an estimate table by dotted name; other fields as they are."""
    out = {}
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        if dataclasses.is_dataclass(value):
            out.update(_arrays(value, f"{prefix}{field.name}."))
        else:
            out[prefix + field.name] = value
    return out


def _assert_same_numbers(got, want, rows):
    """``got`` (an estimate table) holds ``want``'s rows ``rows``, bit for bit."""
    want_arrays, got_arrays = _arrays(want), _arrays(got)
    assert want_arrays.keys() == got_arrays.keys()
    size = len(np.atleast_1d(want.step_time_s))
    for name, value in want_arrays.items():
        if isinstance(value, np.ndarray):
            expected = np.broadcast_to(value, (size,))[rows]
            actual = np.broadcast_to(got_arrays[name], (len(rows),))
            assert np.array_equal(actual, expected, equal_nan=expected.dtype.kind == "f"), name
        else:
            assert got_arrays[name] == value, name


def _assert_keeps_the_best(full, kept, keep):
    best = full.ranked[:keep]
    assert (kept.evaluated, kept.fitting) == (len(full.table), len(full.ranked)) == (full.evaluated, full.fitting)
    assert (kept.rejected, kept.considered) == (full.rejected, full.considered)
    assert kept.smallest_memory_bytes == full.smallest_memory_bytes
    assert np.array_equal(kept.ranked, np.arange(len(best)))
    for axis in AXES:
        column = getattr(kept.table, axis)
        assert column.dtype == np.int64 and np.array_equal(column, getattr(full.table, axis)[best]), axis
    _assert_same_numbers(kept.estimates, full.estimates, best)


def _squeezed(model, cluster):
    """Context parallel over 16 GPUs with the capacity between some layouts' p2p and all-gather needs: the
    all-gather rows that do not fit are priced again with p2p (test_context_parallel)."""
    fixed = {"tp": [1], "pp": [1], "zero": [1], "recompute": [1], "offload": [0], "cp": [16],
             "cp_comm": [P2P, GATHER]}
    job = TrainingJob(model=model, seq_len=16384, global_batch=64)
    space = enumerate_space(job, cluster, engine_rules("megatron"), fixed)
    required = estimate(model, cluster, job.workload(), space.table).memory.required_bytes
    mbs4 = space.table.mbs == 4
    capacity = 0.5 * (required[mbs4 & (space.table.cp_comm == P2P)][0]
                      + required[mbs4 & (space.table.cp_comm == GATHER)][0])
    headroom = float(1.0 - capacity / usable_capacity_bytes(cluster.gpu.hbm_bytes))
    return dataclasses.replace(job, memory_headroom_frac=headroom), fixed


def _case(name, llama8b, h100x16):
    """(job, cluster, fixed axes, objective) of a named case."""
    if name == "dense":
        return TrainingJob(model=llama8b, seq_len=4096, global_batch=64), h100x16, None, "throughput"
    if name == "moe":
        job = TrainingJob(model=load_model("mixtral-8x7b"), seq_len=4096, global_batch=128, precision="fp8")
        return job, quick_cluster("h100-sxm", 32), {"pp": [1, 2, 4], "zero": [1]}, "throughput"
    if name == "memory":
        return TrainingJob(model=llama8b, seq_len=16384, global_batch=64), quick_cluster("h100-sxm", 32), \
            {"pp": [1, 2]}, "memory"
    job, fixed = _squeezed(llama8b, quick_cluster("h100-sxm", 32))
    return job, quick_cluster("h100-sxm", 32), fixed, "throughput"


@pytest.mark.parametrize("name", ["dense", "moe", "memory", "all-gather fallback"])
def test_keep_returns_the_full_searchs_best_rows_bit_for_bit(name, llama8b, h100x16):
    job, cluster, fixed, objective = _case(name, llama8b, h100x16)
    full = search(job, cluster, fixed, objective)
    assert len(full.ranked) >= 3
    for keep in (1, 7, 10**9):
        for rows_per_block in (ROWS_PER_BLOCK, max(3, len(full.table) // 15)):  # one block; about fifteen
            kept = search(job, cluster, fixed, objective, keep=keep, rows_per_block=rows_per_block)
            _assert_keeps_the_best(full, kept, keep)


def test_the_all_gather_case_does_price_rows_again(llama8b):
    """The fallback case above exercises the second pricing: some kept rows left all-gather for p2p."""
    job, fixed = _squeezed(llama8b, quick_cluster("h100-sxm", 32))
    kept = search(job, quick_cluster("h100-sxm", 32), fixed, keep=100)
    mbs = kept.table.mbs
    assert np.all(kept.table.cp_comm[mbs == 4] == P2P) and np.any(kept.table.cp_comm[mbs == 2] == GATHER)


@pytest.mark.parametrize("fixed, rows_per_block", [({"tp": [2], "pp": [2], "recompute": [0, 2], "zero": [1]}, 1),
                                                   (None, 257)])
def test_the_block_size_leaves_every_number_of_the_full_search(fixed, rows_per_block, llama8b, h100x16):
    """One row per block and the whole table at once give the same ranks and estimates, bit for bit."""
    job = TrainingJob(model=llama8b, seq_len=4096, global_batch=64)
    whole = search(job, h100x16, fixed)
    blocked = search(job, h100x16, fixed, rows_per_block=rows_per_block)
    assert len(whole.table) > (1 if fixed else 3 * rows_per_block)
    assert np.array_equal(blocked.ranked, whole.ranked) and blocked.rejected == whole.rejected
    for axis in AXES:
        assert np.array_equal(getattr(blocked.table, axis), getattr(whole.table, axis)), axis
    _assert_same_numbers(blocked.estimates, whole.estimates, np.arange(len(whole.table)))


def _traced_peak_bytes(*args, **kwargs):
    tracemalloc.start()
    try:
        result = search(*args, **kwargs)
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_keep_holds_the_block_not_the_table(monkeypatch):
    """Llama 3.1 70B on 64 H100 (34,000 rows): the full search holds every row's estimates; one that keeps its 5
    best, priced 4,096 rows at a time on one thread, peaks at a fraction of that (4.6 against 28.6 MiB traced);
    on two threads it holds two blocks (7.1 MiB), never the table."""
    job = TrainingJob(model=load_model("llama-3.1-70b"), seq_len=8192, global_batch=256)
    cluster = quick_cluster("h100-sxm", 64)
    full, full_peak = _traced_peak_bytes(job, cluster)
    monkeypatch.setattr(search_blocks, "_pricing_threads", lambda: 1)
    kept, kept_peak = _traced_peak_bytes(job, cluster, keep=5, rows_per_block=4096)
    monkeypatch.setattr(search_blocks, "_pricing_threads", lambda: 2)
    _, two_threads_peak = _traced_peak_bytes(job, cluster, keep=5, rows_per_block=4096)
    assert len(full.table) > 8 * 4096 and len(kept.table) == 5
    assert kept_peak < full_peak / 4
    assert two_threads_peak < full_peak / 3


@pytest.mark.parametrize("keep", [None, 5])
def test_threads_price_the_same_numbers_in_the_same_order(monkeypatch, keep):
    """Blocks priced on four threads, small blocks so that many are in flight: the same rows, ranks and
    estimates, bit for bit, as on one thread."""
    job = TrainingJob(model=load_model("llama-3.1-70b"), seq_len=8192, global_batch=256)
    cluster = quick_cluster("h100-sxm", 64)
    results = []
    for threads in (1, 4):
        monkeypatch.setattr(search_blocks, "_pricing_threads", lambda threads=threads: threads)
        results.append(search(job, cluster, keep=keep, rows_per_block=1000))
    one, four = results
    assert one.fitting == four.fitting and one.smallest_memory_bytes == four.smallest_memory_bytes
    np.testing.assert_array_equal(one.ranked, four.ranked)
    for field in dataclasses.fields(one.table):
        np.testing.assert_array_equal(getattr(one.table, field.name), getattr(four.table, field.name))
    np.testing.assert_array_equal(one.estimates.step_time_s, four.estimates.step_time_s)
    np.testing.assert_array_equal(one.estimates.memory.required_bytes, four.estimates.memory.required_bytes)


@dataclasses.dataclass(frozen=True)
class _Keys:
    """The one field a throughput ranking reads."""

    step_time_s: np.ndarray


def test_the_kept_rows_rank_as_the_full_table_with_ties_and_nan():
    """Brute force: keys with many ties and some NaN, fed in blocks of random sizes and in any order, with some
    rows not fitting, keep exactly the first rows of the fitting rows' full ranking (ties broken by the axes,
    then by row)."""
    from paraplan.planner.search import _BestRows

    rng = np.random.default_rng(33)
    size = 3000
    table = ConfigTable.from_columns(**{axis: rng.integers(0, 3, size) for axis in AXES})
    keys = rng.integers(0, 40, size).astype(float)
    keys[rng.random(size) < 0.05] = np.nan
    fits = rng.random(size) < 0.8
    fitting = np.flatnonzero(fits)
    want = fitting[_rank(keys[fitting], table, fitting)]
    for keep in (1, 3, 50, 2300, 5000):
        best = _BestRows(keep, "throughput")
        for piece in np.array_split(rng.permutation(size), rng.integers(1, 40)):
            best.add(piece, _Keys(step_time_s=keys[piece]), fits[piece])
        rows = np.sort(best.rows)
        assert np.all(fits[rows])
        assert np.array_equal(rows[_rank(keys[rows], table.take(rows), np.arange(len(rows)))][:keep], want[:keep])
    assert len(TIE_BREAK) == len(AXES)  # every axis breaks ties: distinct rows never tie on all of them


def test_a_compact_space_is_the_same_table_in_narrower_integers(llama8b, h100x16):
    job = TrainingJob(model=load_model("mixtral-8x7b"), seq_len=4096, global_batch=128)
    wide = enumerate_space(job, h100x16, engine_rules("megatron"), collapse_cp_comm=True)
    narrow = enumerate_space(job, h100x16, engine_rules("megatron"), collapse_cp_comm=True, compact=True)
    assert (narrow.rejected, narrow.considered) == (wide.rejected, wide.considered)
    assert np.array_equal(narrow.cp_comm_allowed, wide.cp_comm_allowed)
    for axis in AXES:
        column = getattr(narrow.table, axis)
        assert column.itemsize < 8 and np.array_equal(column, getattr(wide.table, axis)), axis
    rows = np.arange(0, len(wide.table), 97)
    priced = estimate(job.model, h100x16, job.workload(), narrow.table.take(rows))
    _assert_same_numbers(priced, estimate(job.model, h100x16, job.workload(), wide.table.take(rows)),
                         np.arange(len(rows)))


def test_a_search_that_keeps_rows_still_explains_why_nothing_fits(h100x16):
    job = TrainingJob(model=load_model("llama-3.1-405b"), seq_len=8192, global_batch=64)
    kept = search(job, quick_cluster("h100-sxm", 8), keep=3)
    assert len(kept.ranked) == 0 and kept.evaluated > 0 and kept.fitting == 0
    # Rows whose weights and optimizer states alone pass the capacity are never priced, yet the least memory any
    # row needs is the full search's (what explain_no_fit reports).
    assert kept.smallest_memory_bytes == search(job, quick_cluster("h100-sxm", 8)).smallest_memory_bytes
    assert explain_no_fit(kept, quick_cluster("h100-sxm", 8)).startswith("no configuration fits")
    with pytest.raises(ValueError, match="keep"):
        search(job, quick_cluster("h100-sxm", 8), keep=0)
