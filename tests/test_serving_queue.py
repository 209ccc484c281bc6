"""The serving planner's queueing math (planner/serving/queueing.py) against closed forms, brute force and seeded
simulations. Tolerances are the errors measured with these same simulations, stated beside each test."""

from __future__ import annotations

import math

import numpy as np
import pytest

from paraplan.errors import InputError
from paraplan.planner.serving import queueing as sq
from paraplan.planner.serving.queueing import (
    EXACT_MAX_SERVERS,
    Arrivals,
    count_quantile,
    gamma,
    gamma_quantile,
    mean_wait_s,
    parse_arrival,
    poisson,
    utilisation,
    wait_probability,
    wait_quantile_s,
)

QUANTILES = (0.5, 0.9, 0.99)


def erlang_c_factorial(c: int, a: float) -> float:
    """Erlang C by its textbook factorial formula, summed in Python."""
    last = a**c / math.factorial(c) * c / (c - a)
    return last / (sum(a**k / math.factorial(k) for k in range(c)) + last)


def erlang_c_recursion(c: int, a: float) -> float:
    """Erlang C by the Erlang-B recursion in plain Python floats (stable at any c): the large-c reference."""
    inverse = 1.0
    for k in range(1, c + 1):
        inverse = min(1.0 + inverse * k / a, 1e300)  # past 1e300, B is 0 to float precision either way
    blocking = 1.0 / inverse
    return blocking / (1.0 - a / c * (1.0 - blocking))


def lindley_waits(gaps: np.ndarray, services: np.ndarray) -> np.ndarray:
    """Waits of a FCFS single-server queue, W_n = max(0, W_{n-1} + S_{n-1} - A_n), as the random walk of
    S_{n-1} - A_n minus its running minimum (Lindley's recursion, solved in closed form)."""
    walk = np.cumsum(np.concatenate(([0.0], services[:-1] - gaps[1:])))
    return walk - np.minimum.accumulate(np.minimum(walk, 0.0))


def simulate(gaps: np.ndarray, services: np.ndarray) -> tuple[np.ndarray, float]:
    """Waits after a 10% warm-up, and the standard error of their mean by 90 batch means."""
    waits = lindley_waits(gaps, services)[gaps.size // 10:]
    batches = waits[: waits.size // 90 * 90].reshape(90, -1).mean(axis=1)
    return waits, float(batches.std(ddof=1) / math.sqrt(90))


# -- exact cases -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rate", [0.1, 0.5, 0.8, 0.95])
def test_mm1_mean_and_quantiles_are_exact(rate):
    mu, rho = 1.0, rate
    assert mean_wait_s(rate, 1.0, 1 / mu, 1.0, 1) == pytest.approx(rho / (mu - rate), rel=1e-12)
    for q in QUANTILES:  # P(W > t) = ρ·exp(-(μ - λ)t)
        expected = math.log(rho / (1 - q)) / (mu - rate) if rho > 1 - q else 0.0
        assert wait_quantile_s(rate, 1.0, 1 / mu, 1.0, 1, q) == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("servers", [2, 5, 30])
@pytest.mark.parametrize("rho", [0.1, 0.5, 0.8, 0.95])
def test_mmc_erlang_c_matches_the_factorial_formula(servers, rho):
    service = 0.25
    rate = rho * servers / service
    expected = erlang_c_factorial(servers, rate * service)
    assert wait_probability(rate, service, servers) == pytest.approx(expected, rel=1e-12)
    # M/M/c: W = C/(cμ - λ), and P(W > t) = C·exp(-(cμ - λ)t)
    drain = servers / service - rate
    assert mean_wait_s(rate, 1.0, service, 1.0, servers) == pytest.approx(expected / drain, rel=1e-12)
    assert wait_quantile_s(rate, 1.0, service, 1.0, servers, 0.99) == pytest.approx(
        max(math.log(expected / 0.01), 0.0) / drain, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("rho", [0.3, 0.5, 0.8, 0.95])
def test_md1_mean_is_pollaczek_khinchine(rho):
    service = 2.0
    assert mean_wait_s(rho / service, 1.0, service, 0.0, 1) == pytest.approx(rho * service / (2 * (1 - rho)), rel=1e-12)


def test_unstable_is_infinite_and_no_load_is_zero():
    for rho in (1.0, 1.5):
        assert mean_wait_s(rho * 8, 1.0, 1.0, 1.0, 8) == math.inf
        assert wait_quantile_s(rho * 8, 1.0, 1.0, 1.0, 8, 0.9) == math.inf
        assert wait_probability(rho * 8, 1.0, 8) == 1.0
    assert mean_wait_s(5.0, 1.0, 1.0, 1.0, 0) == math.inf  # no server at all
    assert utilisation(5.0, 1.0, [0, 10]).tolist() == [math.inf, 0.5]
    for servers in (1, 64, 65, 4096):
        assert wait_probability(0.0, 1.0, servers) == 0.0
        assert mean_wait_s(0.0, 4.0, 1.0, 1.0, servers) == 0.0
        assert wait_quantile_s(0.0, 4.0, 1.0, 1.0, servers, 0.99) == 0.0


# -- approximations against simulation -------------------------------------------------------------------------
MD1_TOLERANCE = {  # (ρ, q) -> measured relative error of the exponential tail against 2 million simulated customers
    (0.5, 0.9): 0.06, (0.5, 0.99): 0.17, (0.8, 0.5): -0.08, (0.8, 0.9): 0.035, (0.8, 0.99): 0.065}


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_md1_percentiles_against_simulation(rho):
    """Measured: p90/p99 3-17% high, p50 at ρ = 0.8 8% low; allowed: the measured error plus 3 points."""
    rng = np.random.default_rng(7)
    n, service = 2_000_000, 1.0
    waits, _ = simulate(rng.exponential(service / rho, n), np.full(n, service))
    for q in QUANTILES:
        model = float(wait_quantile_s(rho / service, 1.0, service, 0.0, 1, q))
        simulated = float(np.quantile(waits, q))
        if (rho, q) == (0.5, 0.5):  # P(W > 0) = ρ = 0.5: the median sits on the atom at 0
            assert model == 0.0 and simulated < 0.01 * service
            continue
        error = model / simulated - 1
        assert abs(error - MD1_TOLERANCE[rho, q]) < 0.03, (q, error)


def gm1_exact_wait(rate: float, shape: float, mu: float) -> float:
    """Exact G/M/1 mean wait σ/(μ(1-σ)) for gamma gaps, σ the root in (0, 1) of σ = (1 + μ(1-σ)·θ)^-k."""
    scale, sigma = 1 / (rate * shape), 0.5
    for _ in range(200):
        sigma = (1 + mu * (1 - sigma) * scale) ** -shape
    return sigma / (mu * (1 - sigma))


@pytest.mark.parametrize(("rho", "measured"), [(0.5, -0.28), (0.8, -0.10)])
@pytest.mark.parametrize("service_cv2", [0.0, 1.0])
def test_bursty_gamma_arrivals_mean_wait_against_simulation(rho, measured, service_cv2):
    """Gamma gaps of CV 2 (G/D/1, G/M/1): Allen-Cunneen measured 28% low at ρ = 0.5, 10% at 0.8; allowed 4 points
    around it. The simulation's standard error is under 1.2%, and its G/M/1 agrees with the exact formula."""
    rng = np.random.default_rng(11)
    n, service, cv = 2_000_000, 1.0, 2.0
    rate, shape = rho / service, 1 / cv**2
    services = np.full(n, service) if service_cv2 == 0 else rng.exponential(service, n)
    waits, standard_error = simulate(rng.gamma(shape, 1 / (rate * shape), n), services)
    assert standard_error / waits.mean() < 0.012
    if service_cv2 == 1.0:
        assert waits.mean() == pytest.approx(gm1_exact_wait(rate, shape, 1 / service), rel=0.03)
    model = float(mean_wait_s(rate, cv**2, service, service_cv2, 1))
    assert abs(model / waits.mean() - 1 - measured) < 0.04


# -- Erlang C beyond the exact recursion -----------------------------------------------------------------------
RHOS = np.linspace(0.01, 0.9999, 300)


@pytest.mark.parametrize("servers", [EXACT_MAX_SERVERS + 1, 100, 256, 1024, 4096])
def test_large_c_erlang_c_within_measured_error(servers):
    """Poisson pmf/cdf with Stirling and Wilson-Hilferty: measured at most 4.45e-3/c relative (6.8e-5 at c = 65,
    1.1e-6 at 4096) over ρ from 0.01 to 0.9999."""
    expected = np.array([erlang_c_recursion(servers, rho * servers) for rho in RHOS])
    got = wait_probability(RHOS * servers, 1.0, servers)
    keep = expected > 1e-280  # below, the exact value underflows where the approximation is a tiny number or 0
    assert np.max(np.abs(got[keep] / expected[keep] - 1)) < 4.5e-3 / servers


def test_switch_over_is_continuous_within_the_measured_error():
    """At the threshold both methods agree to 7e-5 relative (Erlang C), so crossing it moves no answer by more."""
    c = float(EXACT_MAX_SERVERS)
    offered, servers = RHOS * c, np.full_like(RHOS, c)
    exact, approx = (blocking / (1 - RHOS * (1 - blocking)) for blocking in (
        sq._erlang_b_recursion(offered, servers), sq._erlang_b_normal(offered, servers)))
    keep = exact > 1e-280
    assert np.max(np.abs(approx[keep] / exact[keep] - 1)) < 7e-5
    below, above = wait_probability(0.9 * c, 1.0, c), wait_probability(0.9 * (c + 1), 1.0, c + 1)
    assert above < below and below / above - 1 < 0.02  # one server more at the same ρ: slightly less waiting


# -- vectorized = one at a time ---------------------------------------------------------------------------------
def test_vectorized_equals_one_at_a_time():
    rng = np.random.default_rng(3)
    n = 300
    servers = rng.choice([1, 2, 7, EXACT_MAX_SERVERS, EXACT_MAX_SERVERS + 1, 500, 4096], n).astype(float)
    rho = rng.uniform(0.0, 1.1, n)
    service = rng.uniform(0.01, 2.0, n)
    rate, ca2, cs2, q = rho * servers / service, rng.uniform(0, 4, n), rng.uniform(0, 2, n), rng.choice(QUANTILES, n)
    batch = wait_quantile_s(rate, ca2, service, cs2, servers, q)
    mean = mean_wait_s(rate, ca2, service, cs2, servers)
    single = [float(wait_quantile_s(*args)) for args in zip(rate, ca2, service, cs2, servers, q)]
    single_mean = [float(mean_wait_s(*args)) for args in zip(rate, ca2, service, cs2, servers)]
    np.testing.assert_array_equal(batch, single)
    np.testing.assert_array_equal(mean, single_mean)


def test_blocks_and_broadcasting_change_no_answer():
    rng = np.random.default_rng(5)
    n = 3 * sq.BLOCK + 17
    servers = rng.choice([1, 16, 64, 65, 4096], n).astype(float)
    rate = rng.uniform(0.0, 1.0, n) * servers
    whole = wait_quantile_s(rate, 2.0, 1.0, 0.5, servers, 0.9)
    parts = np.concatenate([wait_quantile_s(rate[i:i + 1000], 2.0, 1.0, 0.5, servers[i:i + 1000], 0.9)
                            for i in range(0, n, 1000)])
    np.testing.assert_array_equal(whole, parts)
    grid = mean_wait_s(np.array([[1.0], [3.0]]), 1.0, 1.0, 1.0, np.array([2, 4, 8]))
    assert grid.shape == (2, 3) and grid[0, 0] == mean_wait_s(1.0, 1.0, 1.0, 1.0, 2)


# -- counts and lengths ----------------------------------------------------------------------------------------
def poisson_quantile(mean: float, q: float) -> int:
    """The smallest n with P(N <= n) >= q, by summing the Poisson pmf (in logs: e^-100 is fine, e^-1000 is not)."""
    n, total = 0, 0.0
    while True:
        total += math.exp(n * math.log(mean) - mean - math.lgamma(n + 1))
        if total >= q:
            return n
        n += 1


@pytest.mark.parametrize("mean", [1.0, 10.0, 100.0])
def test_count_quantile_equals_the_exact_poisson_quantile(mean):
    """Measured: exact at q = 0.5, 0.9, 0.95, 0.99 for means 1, 10, 100; at q = 0.999 one too many for mean 1."""
    for q in (0.5, 0.9, 0.95, 0.99):
        assert count_quantile(mean, 1.0, q) == poisson_quantile(mean, q)
    assert 0 <= count_quantile(mean, 1.0, 0.999) - poisson_quantile(mean, 0.999) <= 1
    assert count_quantile(0.0, 1.0, 0.99) == 0.0
    np.testing.assert_array_equal(count_quantile([mean, mean], 1.0, [0.5, 0.99]),
                                  [poisson_quantile(mean, 0.5), poisson_quantile(mean, 0.99)])


@pytest.mark.parametrize("cv", [0.25, 0.5, 1.0, 2.0])
def test_gamma_quantile_against_samples(cv):
    """Wilson-Hilferty against 2 million seeded gamma samples: measured within 1.3% for CV <= 1, 7% at CV 2."""
    rng = np.random.default_rng(1)
    mean, shape = 300.0, 1 / cv**2
    samples = rng.gamma(shape, mean / shape, 2_000_000)
    tolerance = 0.015 if cv <= 1 else 0.075
    for q in QUANTILES:
        assert gamma_quantile(mean, cv, q) == pytest.approx(np.quantile(samples, q), rel=tolerance)


def test_gamma_quantile_of_no_spread_is_the_mean():
    assert gamma_quantile(512.0, 0.0, 0.99) == 512.0
    np.testing.assert_array_equal(gamma_quantile([1.0, 7.0], 0.0, [0.5, 1.0]), [1.0, 7.0])


# -- arrivals ----------------------------------------------------------------------------------------------------
def test_arrival_processes():
    assert poisson(3.0) == Arrivals(rate_per_s=3.0, cv2=1.0, source="poisson")
    assert gamma(3.0, 2.0).cv2 == 4.0 and gamma(3.0, 2.0).source == "gamma:CV=2"
    assert parse_arrival("poisson", 2.5) == poisson(2.5)
    assert parse_arrival("gamma:0.5", 2.5).cv2 == 0.25
    with pytest.raises(ValueError, match="positive"):
        Arrivals(rate_per_s=0.0, cv2=1.0, source="x")
    with pytest.raises(ValueError, match="cv2"):
        Arrivals(rate_per_s=1.0, cv2=math.inf, source="x")


@pytest.mark.parametrize(("text", "rate", "needle"), [
    ("poisson", None, "needs a request rate"),
    ("gamma:2", None, "needs a request rate"),
    ("gamma:x", 1.0, "the CV must be a number"),
    ("gamma:-1", 1.0, "the CV must be a number"),
    ("gamma:nan", 1.0, "the CV must be a number"),
    ("gamma:1e9", 1.0, "the CV must be a number"),
    ("uniform", 1.0, "expected poisson, gamma:CV"),
    ("trace:", 1.0, "expected poisson, gamma:CV"),
    ("poisson", -1.0, "--rate must be a positive"),
    ("poisson", math.inf, "--rate must be a positive"),
    ("trace:/no/such/file.csv", None, "cannot read request trace"),
])
def test_bad_arrival_text_is_one_line(text, rate, needle):
    with pytest.raises(InputError, match=needle) as caught:
        parse_arrival(text, rate)
    assert "\n" not in str(caught.value) and len(str(caught.value)) <= 300
