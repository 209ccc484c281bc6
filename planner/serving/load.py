"""Latency and throughput of serving workers under a load: a closed loop (fixed concurrency) or an open one (an
arrival process), as a mean or at a percentile. Vectorized over candidate deployments.

Aggregated workers (continuous batching, prefill mixed into decode), per attention-DP rank running B sequences,
with P one prompt's prefill and D(B) the decode step (both with the engine's step overhead):

- Closed loop at C in flight: B = min(C/ranks, what fits, the batch cap); TPOT = D(B) + the prefill of the
  k = B/osl prompts a step admits, each of the B sequences being replaced once per osl steps: k·P for k <= 1, and
  for k > 1 the price of k prompts admitted together as one chunk (``admit_of``, :func:`admission_s`)
  (cost_models.serving.aggregated, the model validated against 5,221 measured deployments); TTFT = request
  overhead + P + TPOT/2 + (chunks − 1)·D + the wait for a slot.
- Open loop at λ requests/s per rank: prefill takes ρ = λ·P of the GPU's time (with ``admit_of``, P is a prompt's
  share of the chunk it is admitted in), so TPOT = D(B)/(1 − ρ), and B
  solves Little's law B = λ·osl·TPOT(B) (a fixed point, capped by the slots). TTFT = request overhead + the
  prompt's wait behind other prefills (an M/G/1-type queue, planner/serving/queueing.py) + P + D/2 + (chunks − 1)·D
  + the wait for a free slot (G/G/c over the slots, service one request's lifetime).
- Percentiles: a request's TPOT is D plus the prefills that land during its osl decode steps, spread over them;
  that count has mean λ·osl·TPOT (B in a closed loop) and variance dispersion × mean (arrival cv² for an open
  loop, the output-length cv² in a closed loop), taken at the percentile (queueing.count_quantile). TTFT
  at a percentile adds each part's percentile (its waits, its own prompt's length): an upper bound on the
  percentile of the sum, since the parts are positively correlated at worst.

Disaggregated: decode workers as above with nothing mixed in (TPOT = D(B)); prefill workers are servers of one
prompt at a time (prefill pool waits: G/G/c with c = workers × ranks), then the KV transfer to the decode worker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from paraplan.arrays import Column
from paraplan.planner.serving.queueing import count_quantile, gamma_quantile, mean_wait_s, wait_quantile_s

FIXED_POINT_ITERATIONS = 40
"""Iterations of B <- λ·osl·TPOT(B) at most; TPOT grows slowly with B, so the map contracts where the system is
stable. Measured on the four cases of bench/serve_speed.py: after 40 iterations every candidate's batch is within
3e-7 (relative) of its converged value; the slowest reach 1e-12 only after 73."""
CONVERGED_REL = 1e-9
"""The fixed point stops once no batch moves by more than this fraction."""
StepOf = Callable[[np.ndarray], np.ndarray]
"""The decode step, seconds, as a function of the running batch per attention-DP rank (one entry a candidate)."""
AdmitOf = Callable[[np.ndarray], np.ndarray]
"""Mean seconds a mixed step spends prefilling the k prompts a rank admits on average (any k >= 0): floor(k) or
ceil(k) prompts a step as chunks of at most the max batched tokens beside the decode batch
(``inference_step.admitted_prefill_s``) with the engine's step overhead per chunk step, the step waiting for the
busiest attention-DP rank (``serving.mixed_admission_s``); at k = 1 on one rank, one prompt's prefill."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    """What arrives at a deployment."""

    isl: float
    """Mean prompt tokens per request."""
    osl: float
    """Mean output tokens per request."""
    isl_cv: float
    """Coefficient of variation of prompt lengths."""
    osl_cv: float
    """Coefficient of variation of output lengths."""
    concurrency: float | None
    """Closed loop: requests in flight over the deployment."""
    rate_per_s: Column | None
    """Open loop: requests per second over the deployment (one per candidate where a search sizes the rate)."""
    arrival_cv2: float
    """Squared coefficient of variation of inter-arrival times (open loop)."""
    request_overhead_s: float
    """The engine's per-request latency outside the GPU steps."""
    first_token_steps: float = 0.0
    """Steady-state TPOTs (of the decode pool, disaggregated) a request waits before its first token beyond its
    prefill (``EngineTraits.first_token_steps``)."""

    @property
    def closed(self) -> bool:
        """A closed loop (fixed concurrency), else an open one (an arrival rate)."""
        return self.concurrency is not None

    @property
    def closed_concurrency(self) -> float:
        """Requests in flight of a closed loop; ValueError for an open loop, which has none."""
        if self.concurrency is None:
            raise ValueError("an open-loop load has no concurrency")
        return self.concurrency

    @property
    def open_rate_per_s(self) -> Column:
        """Requests per second of an open loop; ValueError for a closed loop, whose rate is a result."""
        if self.rate_per_s is None:
            raise ValueError("a closed-loop load has no arrival rate")
        return self.rate_per_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Latency:
    """Per candidate (arrays): latencies at one statistic (the mean or a percentile) and the throughput."""

    ttft_s: np.ndarray
    """Time to first token, seconds."""
    tpot_s: np.ndarray
    """Time per output token, seconds."""
    running_batch: np.ndarray
    """Sequences decoding together per attention-DP rank."""
    requests_per_s: np.ndarray
    """Completed requests per second over the deployment."""
    stable: np.ndarray
    """False where a queue grows without bound (its utilisation reaches 1)."""
    busy: np.ndarray
    """The highest utilisation of the workers' queues (prefill and batch slots; 0 in a closed loop)."""
    prefill_busy: np.ndarray
    """The share of the GPUs' time prefills take (admitted prompts batched where ``admit_of`` prices them; 0 in a
    closed loop and in a decode pool)."""


def _count(mean: Column, dispersion: float, q: float | None) -> Column:
    """A count at statistic q; with no dispersion (a closed loop of fixed lengths) every request sees the mean."""
    if q is None or np.all(np.asarray(dispersion) == 0):
        return mean
    return count_quantile(mean, dispersion, q)


def _length(cv: float, q: float | None) -> Column:
    """A request's length over the mean at statistic q (1 for the mean)."""
    return 1.0 if q is None else gamma_quantile(1.0, cv, q)


def _wait(rate: Column, ca2: float, service: Column, cs2: float, servers: Column, q: float | None) -> np.ndarray:
    """The wait for a server: its mean (q None) or its percentile q."""
    return mean_wait_s(rate, ca2, service, cs2, servers) if q is None \
        else wait_quantile_s(rate, ca2, service, cs2, servers, q)


def _chunks(isl: float, chunk: Column) -> np.ndarray:
    """Steps a prompt of ``isl`` tokens takes at ``chunk`` max batched tokens."""
    return np.ceil(isl / np.asarray(chunk, dtype=float))


def admission_s(prompts_per_step: Column, prefill_s: Column, admit_of: AdmitOf | None) -> np.ndarray:
    """Mean seconds a decode step spends on the k = ``prompts_per_step`` prompts a rank admits on average:
    ``admit_of(k)`` (cost_models.serving.aggregated prices ``mixed_prefill_s``, which ``pools.admit_s`` and
    ``pools.exact_admit_s`` give): floor(k) or ceil(k) prompts a step batched into chunks, the step waiting for the
    busiest attention-DP rank's admission (below one prompt a step on one rank: k·``prefill_s``). Without
    ``admit_of`` every prompt is its own prefill, k·``prefill_s``."""
    k = np.asarray(prompts_per_step, dtype=float)
    return k * np.asarray(prefill_s, dtype=float) if admit_of is None else admit_of(k)


def solve_batch(rate_per_rank: Column, osl: float, step_of: StepOf, slots: Column, interference: Column = 0.0
                ) -> np.ndarray:
    """B = λ·osl·step(B)/(1 − interference), at most ``slots``: the running batch of an open loop."""
    scale = np.asarray(rate_per_rank, dtype=float) * osl / np.maximum(1.0 - interference, 1e-12)
    batch = np.minimum(np.maximum(scale * step_of(np.ones_like(scale)), 1e-9), slots)
    for _ in range(FIXED_POINT_ITERATIONS):
        before = batch
        batch = np.minimum(scale * step_of(np.maximum(batch, 1.0)), slots)
        if np.all(np.abs(batch - before) <= CONVERGED_REL * batch):
            break
    return np.maximum(batch, 1e-9)


def aggregated(load: Load, *, q: float | None = None, **workers: Any) -> Latency:
    """Aggregated workers at one statistic ``q`` (None: the mean); ``workers`` as :func:`aggregated_stats`."""
    return aggregated_stats(load, qs=(q,), **workers)[0]


def aggregated_stats(load: Load, *, prefill_s: np.ndarray, step_of: StepOf, fits: np.ndarray, cap: Column,
                     chunk: Column, replicas: Column, ranks: Column, qs: Sequence[float | None],
                     admit_of: AdmitOf | None = None) -> list[Latency]:
    """Aggregated workers: ``replicas`` of them, each with ``ranks`` attention-DP ranks of ``fits`` KV slots, a
    batch cap ``cap``, ``chunk`` max batched tokens; ``step_of(B)`` the decode step at B per rank; ``admit_of(k)``
    the prefill of k prompts admitted in one step as one chunk (:func:`admission_s`; None: k separate prefills).
    The running batch (a fixed point in an open loop) is solved once for all the statistics ``qs`` (None: the
    mean)."""
    slots = np.maximum(np.minimum(fits, cap), 1.0)
    chunk_steps = _chunks(load.isl, chunk) - 1.0
    solve = _aggregated_closed if load.closed else _aggregated_open
    return solve(load, prefill_s, step_of, slots, chunk_steps, replicas * ranks, qs, admit_of)


def _aggregated_closed(load: Load, prefill_s: np.ndarray, step_of: StepOf, slots: np.ndarray, chunk_steps: np.ndarray,
                       num_ranks: Column, qs: Sequence[float | None], admit_of: AdmitOf | None) -> list[Latency]:
    """aggregated_stats of a closed loop over ``num_ranks`` attention-DP ranks in all."""
    osl, concurrency = load.osl, load.closed_concurrency
    per_rank = concurrency / num_ranks
    batch = np.maximum(np.minimum(per_rank, slots), 1.0)
    step = step_of(batch)
    tpot_mean = step + admission_s(batch / osl, prefill_s, admit_of)
    queued = np.maximum(per_rank - batch, 0.0) / batch * (osl * tpot_mean + prefill_s)
    hops = load.first_token_steps * tpot_mean  # the request's hops through the engine's processes
    ttft_mean = load.request_overhead_s + prefill_s + tpot_mean / 2.0 + chunk_steps * step + queued + hops
    rate = concurrency / (ttft_mean + osl * tpot_mean)
    stable = np.ones_like(tpot_mean, dtype=bool)

    def at(q: float | None) -> Latency:
        tpot = step + admission_s(_count(batch, load.osl_cv ** 2, q) / osl, prefill_s, admit_of)
        ttft = load.request_overhead_s + prefill_s * _length(load.isl_cv, q) + tpot_mean / 2.0 \
            + chunk_steps * step + queued + hops
        return Latency(ttft_s=ttft, tpot_s=tpot, running_batch=batch, requests_per_s=rate, stable=stable,
                       busy=np.zeros_like(tpot), prefill_busy=np.zeros_like(tpot))
    return [at(q) for q in qs]


def _aggregated_open(load: Load, prefill_s: np.ndarray, step_of: StepOf, slots: np.ndarray, chunk_steps: np.ndarray,
                     num_ranks: Column, qs: Sequence[float | None], admit_of: AdmitOf | None) -> list[Latency]:
    """aggregated_stats of an open loop over ``num_ranks`` attention-DP ranks in all. With ``admit_of`` a prompt's
    share of the GPU is its batched chunk's per prompt at the λ·TPOT prompts arriving per step of the single-
    prompt solution (at most ``prefill_s``: batching never slows a prompt), and the batch is solved again."""
    osl, rate_per_s = load.osl, load.open_rate_per_s
    lam = rate_per_s / num_ranks
    share_s = prefill_s  # GPU seconds one prompt's prefill takes from its rank
    busy = lam * share_s
    batch = solve_batch(lam, osl, step_of, slots, busy)
    per_step = 0.0 if admit_of is None else lam * step_of(np.maximum(batch, 1.0)) / np.maximum(1.0 - busy, 1e-12)
    if admit_of is not None and np.any(per_step > 1.0):  # else no step admits more than one prompt
        batched = admission_s(per_step, prefill_s, admit_of) / np.maximum(per_step, 1e-12)
        share_s = np.where(per_step > 1.0, np.minimum(batched, prefill_s), prefill_s)
        busy = lam * share_s
        batch = solve_batch(lam, osl, step_of, slots, busy)
    step = step_of(np.maximum(batch, 1.0))
    tpot_mean = step / np.maximum(1.0 - busy, 1e-12)
    lifetime = osl * tpot_mean + prefill_s
    slot_use = lam * lifetime / slots
    stable = (busy < 1.0) & (slot_use < 1.0)
    rate = np.broadcast_to(rate_per_s, tpot_mean.shape).astype(float)

    def at(q: float | None) -> Latency:
        tpot = step + admission_s(_count(lam * osl * tpot_mean, load.arrival_cv2, q) / osl, prefill_s, admit_of)
        prefill_wait = _wait(lam, load.arrival_cv2, share_s, load.isl_cv ** 2, 1.0, q)
        slot_wait = _wait(lam, load.arrival_cv2, lifetime, load.osl_cv ** 2, slots, q)
        ttft = load.request_overhead_s + prefill_wait + prefill_s * _length(load.isl_cv, q) + step / 2.0 \
            + chunk_steps * step + slot_wait + load.first_token_steps * tpot_mean
        return Latency(ttft_s=np.where(stable, ttft, np.inf), tpot_s=np.where(stable, tpot, np.inf),
                       running_batch=batch, requests_per_s=rate, stable=stable, busy=np.maximum(busy, slot_use),
                       prefill_busy=busy)
    return [at(q) for q in qs]


def decode_pool(load: Load, *, q: float | None = None, **workers: Any) -> tuple[Latency, np.ndarray]:
    """Disaggregated decode workers at one statistic ``q``; ``workers`` as :func:`decode_pool_stats`."""
    return decode_pool_stats(load, qs=(q,), **workers)[0]


def decode_pool_stats(load: Load, *, step_of: StepOf, fits: np.ndarray, cap: Column, workers: Column, ranks: Column,
                      qs: Sequence[float | None]) -> list[tuple[Latency, np.ndarray]]:
    """Disaggregated decode workers per statistic in ``qs``: (their latency with TTFT = the decode side's share only,
    that share): the wait for a decode slot plus the first-token steps at the pool's TPOT; the running batch is solved
    once."""
    osl = load.osl
    slots = np.maximum(np.minimum(fits, cap), 1.0)
    if load.closed:
        concurrency = load.closed_concurrency
        per_rank = concurrency / (workers * ranks)
        batch = np.maximum(np.minimum(per_rank, slots), 1.0)
        tpot = step_of(batch)
        queued = np.maximum(per_rank - batch, 0.0) / batch * osl * tpot
        rate = concurrency / (osl * tpot + queued)
        wait = queued + load.first_token_steps * tpot
        idle = np.zeros_like(tpot)
        latency = Latency(ttft_s=wait, tpot_s=tpot, running_batch=batch, requests_per_s=rate,
                          stable=np.ones_like(tpot, dtype=bool), busy=idle, prefill_busy=idle)
        return [(latency, wait) for _ in qs]
    rate_per_s = load.open_rate_per_s
    lam = rate_per_s / (workers * ranks)
    batch = solve_batch(lam, osl, step_of, slots)
    tpot = step_of(np.maximum(batch, 1.0))
    lifetime = osl * tpot
    slot_use = lam * lifetime / slots
    stable = slot_use < 1.0
    rates = np.broadcast_to(rate_per_s, tpot.shape).astype(float)

    def at(q: float | None) -> tuple[Latency, np.ndarray]:
        slot_wait = _wait(lam, load.arrival_cv2, lifetime, load.osl_cv ** 2, slots, q)
        wait = np.where(stable, slot_wait + load.first_token_steps * tpot, np.inf)
        return Latency(ttft_s=wait, tpot_s=np.where(stable, tpot, np.inf), running_batch=batch, requests_per_s=rates,
                       stable=stable, busy=slot_use, prefill_busy=np.zeros_like(slot_use)), wait
    return [at(q) for q in qs]


def prefill_pool_ttft_s(load: Load, *, rate_per_s: Column, prefill_s: np.ndarray, transfer_s: np.ndarray,
                        chunk: Column, step_overhead_s: Column, workers: Column, ranks: Column, arrival_cv2: float,
                        q: float | None = None) -> np.ndarray:
    """Disaggregated prefill workers: the wait for a free prefill rank, the prompt's prefill (one step per
    ``chunk`` tokens) and the KV transfer; inf where the pool cannot keep up."""
    service = prefill_s + (_chunks(load.isl, chunk) - 1.0) * step_overhead_s
    servers = workers * ranks
    stable = np.asarray(rate_per_s, dtype=float) * service / servers < 1.0
    wait = _wait(rate_per_s, arrival_cv2, service, load.isl_cv ** 2, servers, q)
    ttft = load.request_overhead_s + wait + service * _length(load.isl_cv, q) + transfer_s
    return np.where(stable, ttft, np.inf)
