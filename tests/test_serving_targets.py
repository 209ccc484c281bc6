"""ServingWorkload.meets: the one rule for "does a deployment meet the TTFT/TPOT targets", with hand-made numbers."""

from __future__ import annotations

import numpy as np

from paraplan.planner.serving.space import TARGET_REL_TOLERANCE, ServingWorkload

TARGETS = ServingWorkload(isl=1024, osl=256, concurrency=8, ttft_target_s=0.5, tpot_target_s=0.02)


def test_exactly_at_target_meets():
    assert TARGETS.meets(0.5, 0.02) is True


def test_within_the_rounding_tolerance_meets_and_just_above_it_does_not():
    assert TARGETS.meets(0.5 * (1 + 0.5 * TARGET_REL_TOLERANCE), 0.02) is True
    assert TARGETS.meets(0.5 * (1 + 1e-6), 0.02) is False
    assert TARGETS.meets(0.5, 0.02 * (1 + 1e-6)) is False
    assert TARGETS.meets(0.501, 0.0201) is False


def test_infinite_or_nan_latency_never_meets():
    assert TARGETS.meets(np.inf, 0.01) is False
    assert TARGETS.meets(0.1, np.nan) is False
    assert ServingWorkload(isl=1, osl=1, concurrency=1).meets(np.inf, 0.01) is False


def test_arrays_give_a_bool_per_entry_and_broadcast():
    ttft = np.array([0.1, 0.5, 0.6, 0.2, np.inf])
    tpot = np.array([0.01, 0.02, 0.01, 0.03, 0.01])
    ok = TARGETS.meets(ttft, tpot)
    assert ok.dtype == bool
    assert ok.tolist() == [True, True, False, False, False]
    assert TARGETS.meets(0.0, tpot).tolist() == [True, True, True, False, True]
    assert TARGETS.meets(ttft, 0.0).tolist() == [True, True, False, True, False]


def test_one_target_binds_only_its_latency():
    ttft_only = ServingWorkload(isl=1024, osl=256, concurrency=8, ttft_target_s=0.5)
    assert ttft_only.meets(0.5, 10.0) is True
    assert ttft_only.meets(0.6, 0.001) is False
    tpot_only = ServingWorkload(isl=1024, osl=256, concurrency=8, tpot_target_s=0.02)
    assert tpot_only.meets(100.0, 0.02) is True
    assert tpot_only.meets(0.001, 0.03) is False


def test_without_targets_every_finite_latency_meets():
    free = ServingWorkload(isl=1024, osl=256, concurrency=8)
    assert not free.has_targets and TARGETS.has_targets
    assert free.meets(1e6, 1e3) is True
    assert free.meets(np.array([1.0, 2.0]), np.array([0.5, np.inf])).tolist() == [True, False]
