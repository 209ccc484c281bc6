"""Routing statistics: the CSV format round-trips, bad files name their line, skew is exact."""

from __future__ import annotations

import numpy as np
import pytest

from paraplan.errors import InputError
from paraplan.measurements.routing import (
    RoutingStats,
    parse_skew,
    read_routing_csv,
    write_routing_csv,
    zipf_routing,
)


def test_round_trip_keeps_loads_and_pairs(tmp_path):
    stats = zipf_routing(num_layers=3, num_experts=8, exponent=1.2, tokens_per_layer=4096, seed=7)
    path = tmp_path / "routing.csv"
    write_routing_csv(stats, path)
    back = read_routing_csv(path)
    np.testing.assert_allclose(back.tokens_per_expert, stats.tokens_per_expert, rtol=1e-5)
    np.testing.assert_allclose(back.coactivation, stats.coactivation, rtol=1e-5)


def test_rank_imbalance_by_hand():
    # 4 experts on 2 ranks: rank 0 holds experts 0,1 (10 + 30), rank 1 holds 2,3 (20 + 20); mean 40.
    stats = RoutingStats(tokens_per_expert=np.array([[10.0, 30.0, 20.0, 20.0]]))
    assert stats.rank_imbalance(2)[0] == pytest.approx(1.0)
    assert stats.rank_imbalance(4)[0] == pytest.approx(30.0 / 20.0)
    assert stats.rank_imbalance(1)[0] == pytest.approx(1.0)


def test_zipf_zero_is_uniform_and_skew_grows_imbalance():
    uniform = zipf_routing(num_layers=2, num_experts=16, exponent=0.0, tokens_per_layer=1600)
    np.testing.assert_allclose(uniform.tokens_per_expert, 100.0)
    skewed = zipf_routing(num_layers=2, num_experts=16, exponent=1.2, tokens_per_layer=1600)
    assert skewed.tokens_per_expert.max() / skewed.tokens_per_expert.min() == pytest.approx(16 ** 1.2)
    assert skewed.load_frac().sum(axis=1) == pytest.approx([1.0, 1.0])


@pytest.mark.parametrize("body, fragment", [
    ("layer,expert,tokens\n0,0,5\n", "line 1 must be the header"),
    ("layer,expert,next_expert,tokens\n0,0,,5\n0,x,,3\n", "line 3"),
    ("layer,expert,next_expert,tokens\n0,0,,5\n0,1,,-3\n", "line 3"),
    ("layer,expert,next_expert,tokens\n0,0,,5\n0,0,,5\n", "line 3 repeats"),
    ("layer,expert,next_expert,tokens\n0,0,,5\n1,1,,5\n", "a load row for each of 2 layers x 2 experts"),
    ("layer,expert,next_expert,tokens\n0,0,,5\n0,0,0,5\n", "outside 1 layers"),
])
def test_malformed_files_name_the_problem(tmp_path, body, fragment):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(InputError, match=fragment):
        read_routing_csv(path)


@pytest.mark.parametrize("spec", ["zipf", "zipf:-1", "pareto:1", "zipf:nan"])
def test_bad_skew_specs(spec):
    with pytest.raises(InputError, match="zipf:S"):
        parse_skew(spec)


def test_skew_spec():
    assert parse_skew("zipf:1.2") == 1.2
