"""Queueing math for the serving planner: how long a request waits for a free server (a prefill slot, a batch
slot), at the mean and at a percentile, vectorized over arrays of deployments (one entry per candidate; every
function takes scalars or arrays that broadcast, returns float arrays and never raises: inf and 0 are results).

Model: a G/G/c queue, first come first served, arrivals of rate λ with inter-arrival cv² ``ca2``, service of mean
S with cv² ``cs2``, c servers; ρ = λS/c.

- Wait probability: Erlang C of M/M/c. For c <= EXACT_MAX_SERVERS it is exact (the Erlang-B recursion
  1/B(k) = 1 + k/(a·B(k-1)), a = λS, then C = B/(1 - ρ(1 - B))); above, B = Poisson pmf(c; a) / Poisson cdf(c; a),
  ln c! by Stirling's series and the cdf by Wilson-Hilferty's normal approximation to the gamma distribution.
  Measured against the exact recursion (tests/test_serving_queue.py, ρ from 0.01 to 0.9999): relative error
  about 4.4e-3/c (6.8e-5 at c = 65, 1.7e-5 at 256, 1.1e-6 at 4096); at the switch-over (c = 64) the two differ
  by at most 6.9e-5. Halfin-Whitt's square-root-staffing formula, the other candidate, errs by up to 0.006
  absolute (84% relative where C > 1e-3) at c = 256.
- Mean wait: Allen-Cunneen, W = C·S/(c(1-ρ))·(ca2 + cs2)/2; inf where ρ >= 1. Exact for M/M/c and, at c = 1,
  for M/G/1 (Pollaczek-Khinchine). Measured against a 2-million-customer simulation (Lindley recursion): with
  gamma arrivals of CV 2 it is 28% low at ρ = 0.5 and 10% low at ρ = 0.8 (G/D/1 and G/M/1 alike; the
  simulation's standard error is under 1.2%): bunched arrivals wait longer than two moments say.
- Wait percentiles: P(W > t) ~= C·exp(-t/θ), θ = W/C, exact for M/M/c. Against simulated M/D/1, the p90 and
  p99 are 3.5-17% high (p99 at ρ = 0.5: 3.91·S against 3.34·S) and the p50 at ρ = 0.8 is 8% low.
- count_quantile: a count of mean μ and variance Dμ (Poisson D = 1), normal with continuity and the Cornish-
  Fisher skewness term (2D - 1)/sqrt(Dμ) (exact for binomial, Poisson and negative binomial skewness); equals the
  exact Poisson quantile for means 1, 10 and 100 at q = 0.5, 0.9, 0.95 and 0.99.
  Negative binomial (D = 2, 4): within 1 and 2 of the exact quantile at means 1-100.
- gamma_quantile: Wilson-Hilferty; within 1.3% of sampled quantiles for CV <= 1, 7% at CV 2.

Speed (bench/serving_queue_speed.py): a p99 wait for 200,000 deployments with server counts mixed from 1 to 4096
took 23-46 ms (best of 7, over several runs on a 2-core machine shared with other jobs); Erlang C is computed
BLOCK entries at a time.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np

from paraplan.arrays import Column
from paraplan.errors import InputError
from paraplan.files import shown
from paraplan.planner.serving.arrivals import Arrivals, gamma, poisson

EXACT_MAX_SERVERS = 64
"""Largest server count whose Erlang C comes from the exact recursion. The recursion costs three array passes per
server (200,000 entries all at c = 256 took 48 ms, at c = 64 11-17 ms, bench/serving_queue_speed.py); the
normal approximation above 64 errs by at most 6.9e-5 relative (measured, module docstring)."""
BLOCK = 32_768
"""Entries computed at a time: numpy's temporaries of this size are reused from the allocator's free lists and
stay in cache; whole 200,000-entry temporaries cost a fresh mapping (page faults) each, 5x slower here."""
MAX_ARRIVAL_CV = 100.0
"""Largest CV accepted for gamma:CV arrivals: cv² = 10^4, far beyond any burstiness Allen-Cunneen answers for."""


def parse_arrival(text: str, rate_per_s: float | None) -> Arrivals:
    """The --arrival option: "poisson", "gamma:CV" or "trace:PATH". A trace without a rate keeps its own; a
    given rate rescales the trace's time axis (its cv² is kept). InputError, one line, on anything else."""
    kind, _, value = text.strip().partition(":")
    if rate_per_s is not None and not (math.isfinite(rate_per_s) and rate_per_s > 0):
        raise InputError(f"--rate must be a positive number of requests per second, got {shown(rate_per_s)}")
    if kind.lower() == "trace" and value.strip():
        from paraplan.planner.serving.arrival_trace import read_trace

        arrivals = read_trace(Path(value.strip())).arrivals
        if rate_per_s is None:
            return arrivals
        return Arrivals(rate_per_s=float(rate_per_s), cv2=arrivals.cv2,
                        source=f"{arrivals.source}, time axis scaled from {arrivals.rate_per_s:.4g}/s")
    if kind.lower() == "poisson" and not value:
        return poisson(_needed_rate(text, rate_per_s))
    if kind.lower() == "gamma" and value:
        return gamma(_needed_rate(text, rate_per_s), _arrival_cv(value))
    raise InputError(f"--arrival {shown(text)}: expected poisson, gamma:CV (e.g. gamma:2, bursty) or trace:PATH "
                     "(a CSV, JSONL or plain file of request arrival times)")


def _needed_rate(text: str, rate_per_s: float | None) -> float:
    if rate_per_s is None:
        raise InputError(f"--arrival {shown(text)} needs a request rate: give --rate (requests per second)")
    return float(rate_per_s)


def _arrival_cv(value: str) -> float:
    try:
        cv = float(value)
    except ValueError:
        cv = math.nan
    if not 0 <= cv <= MAX_ARRIVAL_CV:  # also refuses nan and inf
        raise InputError(f"--arrival gamma:{shown(value, 30)}: the CV must be a number from 0 (regular) through "
                         f"{MAX_ARRIVAL_CV:g} (1 is Poisson, 2-4 bursty), e.g. gamma:2")
    return cv


# Every function here returns inf, 0 or nan as results (module docstring): numpy's floating-point warnings are
# silenced where they compute (np.errstate(all="ignore"): divide, invalid, overflow and underflow).


# -- Erlang C ---------------------------------------------------------------------------------------------------
def _erfc(x: np.ndarray) -> np.ndarray:
    """Complementary error function, fractional error < 1.2e-7 everywhere (Numerical Recipes in C, 2nd ed.,
    section 6.2, erfcc: a Chebyshev fit); numpy has none and scipy is not loaded at start-up."""
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    value = t * _exp_or_zero(poly)
    return np.where(x >= 0, value, 2.0 - value)


def _exp_or_zero(power: np.ndarray) -> np.ndarray:
    """exp(power), 0 below e^-700: numpy's exp takes about 10x longer on arguments whose result underflows to a
    subnormal number, which Erlang C meets at every light load."""
    return np.exp(np.maximum(power, -700.0)) * (power > -700.0)


def _erlang_b_recursion(offered: np.ndarray, servers: np.ndarray) -> np.ndarray:
    """Exact Erlang B by 1/B(k) = 1 + (k/a)/B(k-1): sorted by server count, step k updates the entries with
    c >= k, so the work is the sum of c (not entries x the largest c)."""
    order = np.argsort(servers, kind="stable")
    counts, inv_offered = servers[order], 1.0 / offered[order]
    inverse = np.ones_like(inv_offered)
    starts = np.searchsorted(counts, np.arange(1, int(counts[-1]) + 1)) if counts.size else ()
    for k, start in enumerate(starts, start=1):
        active = inverse[start:]
        active *= inv_offered[start:]
        active *= k
        active += 1.0
    blocking = np.empty_like(inverse)
    blocking[order] = 1.0 / inverse
    return blocking


def _erlang_b_normal(offered: np.ndarray, servers: np.ndarray) -> np.ndarray:
    """Erlang B for large c: Poisson pmf(c; a) / cdf(c; a), ln c! by Stirling (error < 1/(1680 c^7)) and
    cdf(c; a) = P(Gamma(c + 1) > a) by Wilson-Hilferty (the cube root of a gamma variable is nearly normal)."""
    c, inv = servers, 1.0 / servers
    log_c = np.log(c)
    log_factorial = (c + 0.5) * log_c - c + 0.5 * math.log(2 * math.pi) \
        + inv * (1 / 12 - inv * inv * (1 / 360 - inv * inv / 1260))
    log_pmf = c * np.log(offered) - offered - log_factorial
    shape = c + 1.0
    z = (np.cbrt(offered / shape) - 1.0 + 1.0 / (9.0 * shape)) * 3.0 * np.sqrt(shape)
    return _exp_or_zero(log_pmf) / (0.5 * _erfc(z / math.sqrt(2.0)))


def _erlang_c(offered: np.ndarray, servers: np.ndarray) -> np.ndarray:
    """Erlang C of 1-d arrays with 0 <= a < c (servers integers >= 1)."""
    small = servers <= EXACT_MAX_SERVERS
    blocking = np.empty_like(offered)
    blocking[small] = _erlang_b_recursion(offered[small], servers[small])
    blocking[~small] = _erlang_b_normal(offered[~small], servers[~small])
    return blocking / (1.0 - offered / servers * (1.0 - blocking))


def _queue_block(rate: Column, arrival_cv2: Column, service: Column, service_cv2: Column, servers: Column,
                 quantile: Column) -> tuple[np.ndarray, ...]:
    """(ρ, Erlang C, mean wait, wait at ``quantile``) of 1-d arrays (or scalars) of at most BLOCK entries."""
    rate, arrival_cv2, service, service_cv2, servers, quantile = np.broadcast_arrays(
        rate, arrival_cv2, service, service_cv2, servers, quantile)
    count = np.floor(servers)  # a fraction of a server serves no one
    offered = rate * service
    rho = np.where(count >= 1, offered / np.maximum(count, 1.0), np.inf)
    stable = rho < 1
    waits = np.where(rho >= 1, 1.0, np.nan)  # nan stays where an input is nan
    waits[stable] = _erlang_c(offered[stable], count[stable])
    mean = waits * service / (count * (1.0 - rho)) * (arrival_cv2 + service_cv2) / 2.0
    mean = np.where(rho >= 1, np.inf, np.where(rho == 0, 0.0, mean))
    tail = 1.0 - quantile
    at_quantile = np.where(waits > tail, mean / waits * np.log(waits / tail), 0.0)
    return rho, waits, mean, np.where(np.isinf(mean), np.inf, at_quantile)


def _blockwise(*arguments: Column) -> tuple[np.ndarray, ...]:
    """_queue_block over the broadcast arguments, BLOCK entries at a time, reshaped to their broadcast shape."""
    shape = np.broadcast_shapes(*(np.shape(v) for v in arguments))
    # a scalar stays one number: no copy made, broadcast per block
    flat = [float(np.asarray(v, dtype=float).item()) if np.size(v) == 1
            else np.broadcast_to(np.asarray(v, dtype=float), shape).ravel() for v in arguments]
    size = math.prod(shape)
    outputs = tuple(np.empty(size) for _ in range(4))
    with np.errstate(all="ignore"):
        for start in range(0, size, BLOCK):
            block = [v if isinstance(v, float) else v[start:start + BLOCK] for v in flat]
            for out, part in zip(outputs, _queue_block(*block)):
                out[start:start + BLOCK] = part
    return tuple(out.reshape(shape) for out in outputs)


def utilisation(rate_per_s: Column, service_mean_s: Column, servers: Column) -> np.ndarray:
    """ρ = λ·S/c: the busy fraction of each server (>= 1: the queue grows without bound; inf below one server)."""
    rate, service, count = (np.asarray(v, dtype=float) for v in (rate_per_s, service_mean_s, servers))
    count = np.floor(count)
    with np.errstate(all="ignore"):
        return np.where(count >= 1, rate * service / np.maximum(count, 1.0), np.inf)


def wait_probability(rate_per_s: Column, service_mean_s: Column, servers: Column) -> np.ndarray:
    """Erlang C: the probability that an arrival waits in M/M/c (1 where ρ >= 1)."""
    return _blockwise(rate_per_s, 1.0, service_mean_s, 1.0, servers, 0.5)[1]


def mean_wait_s(rate_per_s: Column, arrival_cv2: Column, service_mean_s: Column, service_cv2: Column,
                servers: Column) -> np.ndarray:
    """Mean wait in queue of G/G/c (Allen-Cunneen), seconds: C·S/(c(1-ρ))·(ca2+cs2)/2; inf where ρ >= 1."""
    return _blockwise(rate_per_s, arrival_cv2, service_mean_s, service_cv2, servers, 0.5)[2]


def wait_quantile_s(rate_per_s: Column, arrival_cv2: Column, service_mean_s: Column, service_cv2: Column,
                    servers: Column, quantile: Column) -> np.ndarray:
    """The ``quantile`` of the wait in queue, seconds, from P(W > t) ~= Pw·exp(-t/θ), θ = mean wait / Pw (exact
    for M/M/c): θ·ln(Pw/(1 - q)) where Pw > 1 - q, else 0; inf where ρ >= 1."""
    return _blockwise(rate_per_s, arrival_cv2, service_mean_s, service_cv2, servers, quantile)[3]


# -- distributions of counts and lengths ------------------------------------------------------------------------
def _normal_quantile(quantile: Column) -> np.ndarray:
    """Φ⁻¹(q) per entry (-inf at 0, inf at 1, nan outside [0, 1]): the standard library's exact inverse
    (Wichura's AS241) once per distinct q; a planner asks for a handful of percentiles."""
    q = np.asarray(quantile, dtype=float)
    distinct, where = np.unique(q, return_inverse=True)
    values = [statistics.NormalDist().inv_cdf(v) if 0 < v < 1 else
              (-math.inf if v == 0 else math.inf if v == 1 else math.nan) for v in distinct.tolist()]
    return np.asarray(values, dtype=float)[where].reshape(q.shape)


def count_quantile(mean: Column, dispersion: Column, quantile: Column) -> np.ndarray:
    """The ``quantile`` of a count with mean μ and variance D·μ (Poisson: D = 1; renewal arrivals of cv² D, over
    a long window: D): the smallest n with P(N <= n) >= q, by the normal approximation with continuity correction
    and the Cornish-Fisher skewness term (skewness (2D - 1)/sqrt(Dμ)); an integer >= 0, 0 where μ = 0."""
    mu, spread = np.asarray(mean, dtype=float), np.asarray(dispersion, dtype=float)
    z = _normal_quantile(quantile)
    with np.errstate(all="ignore"):
        at = mu + z * np.sqrt(spread * mu) + (z * z - 1.0) * (2.0 * spread - 1.0) / 6.0
        return np.where(mu == 0, 0.0, np.maximum(np.ceil(at - 0.5), 0.0))


def gamma_quantile(mean: Column, cv: Column, quantile: Column) -> np.ndarray:
    """The ``quantile`` of a gamma-distributed length of given mean and coefficient of variation, by Wilson-
    Hilferty: mean·(1 - cv²/9 + z·cv/3)³, at least 0; exactly the mean where cv = 0."""
    m, spread = np.asarray(mean, dtype=float), np.asarray(cv, dtype=float)
    z = _normal_quantile(quantile)
    with np.errstate(all="ignore"):
        cube = np.maximum(1.0 - spread * spread / 9.0 + z * spread / 3.0, 0.0) ** 3
        return np.where(spread == 0, m, m * cube)
