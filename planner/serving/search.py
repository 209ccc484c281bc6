"""The serving search: every engine, KV dtype, worker sharding, batch cap, chunk size and worker count, aggregated
and disaggregated, priced under the workload and ranked by the objective among those that meet the targets.

Each sharding is priced once (planner/serving/pools.py); loads are then combined with those numbers by arithmetic
(planner/serving/load.py), so the search prices hundreds of thousands of deployments in numpy. Disaggregated
deployments pair a decode pool with a prefill pool: per GPU count only each pool's best options are paired
(the decode option with the lowest TPOT and the one with the shortest wait for a slot; the prefill option with
the lowest TTFT), which cannot drop the best pair of a given total, as the pools share only their GPU budget
and, in a closed loop, the decode pool's request rate (computed per decode option before pairing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from paraplan.arrays import Column
from paraplan.planner.serving.load import (
    AdmitOf,
    Load,
    StepOf,
    aggregated_stats,
    decode_pool_stats,
    prefill_pool_ttft_s,
)
from paraplan.planner.serving.pools import ServingSetup, WorkerCosts, admit_s, decode_s, worker_costs
from paraplan.planner.serving.space import ServingChoices, ServingWorkload, batch_caps, chunk_sizes, worker_shardings

MAX_UTILISATION_WITHOUT_TARGETS = 0.85
"""Without latency targets an open-loop deployment must keep every queue at most 85% busy: above it waits grow
as 1/(1 − ρ) and the p99 of any real arrival process with it (Kingman)."""
MAX_DENSE_REPLICAS = 64
"""Worker counts are searched one by one up to 64, then in steps of ~5% (a 5% finer count changes cost by less)."""


def qualifies(workload: ServingWorkload, ttft_s: np.ndarray, tpot_s: np.ndarray, busy: Column) -> np.ndarray:
    """Deployments that meet the targets (ServingWorkload.meets), or, without targets, keep every queue at most
    MAX_UTILISATION_WITHOUT_TARGETS busy (``busy``: the highest utilisation, 0-1)."""
    ok = workload.meets(ttft_s, tpot_s)
    return ok if workload.has_targets else ok & (busy <= MAX_UTILISATION_WITHOUT_TARGETS)


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidates:
    """Priced deployments of one setup (arrays, one entry a deployment); ``kind`` 0 aggregated, 1 disaggregated."""

    setup: int
    """Index of the setup (of the decode pool, when disaggregated)."""
    kind: np.ndarray
    """0 aggregated, 1 disaggregated [n]."""
    index: np.ndarray
    """[n, 6]: agg (shard, chunk, cap, replicas, -1, -1); disagg (prefill shard, prefill chunk, prefill workers,
    decode shard, decode cap, decode workers)."""
    gpus: np.ndarray
    """GPUs of the deployment."""
    ttft_s: np.ndarray
    """At the target percentile (the mean when no --percentile is bound)."""
    tpot_s: np.ndarray
    """At the target percentile, as ``ttft_s``."""
    tpot_mean_s: np.ndarray
    """Mean time per output token."""
    tokens_per_s: np.ndarray
    """Output tokens per second over the deployment (mean)."""
    busy: np.ndarray
    """Highest queue utilisation (open loop; 0 in a closed loop)."""
    usd_per_hour: np.ndarray
    """The deployment's GPUs at their price per GPU-hour (NaN where a price is unknown)."""
    prefill_setup: int = -1
    """Disaggregated: the setup of the prefill pool (its GPU type may differ); -1: ``setup``."""

    @property
    def prefill_owner(self) -> int:
        """The setup of the prefill pool (``setup`` unless it runs on another GPU type)."""
        return self.setup if self.prefill_setup < 0 else self.prefill_setup


def _price(price: float | None) -> float:
    """A price per GPU-hour, NaN where unknown (so sums with it are unknown too)."""
    return np.nan if price is None else float(price)


def worker_counts(max_workers: int) -> np.ndarray:
    """Worker counts searched: every count to MAX_DENSE_REPLICAS, then ~5% steps."""
    counts = list(range(1, min(max_workers, MAX_DENSE_REPLICAS) + 1))
    while counts[-1] < max_workers:
        counts.append(min(max_workers, int(np.ceil(counts[-1] * 1.05))))
    return np.array(counts, dtype=float)


def counts_within(costs: WorkerCosts, budget: int) -> np.ndarray:
    """Worker counts to search for ``costs``' shardings: up to what the smallest worker allows in ``budget`` GPUs."""
    return worker_counts(max(int(budget // max(costs.gpus.min(), 1)), 1))


def load_for(workload: ServingWorkload, setup: ServingSetup) -> Load:
    """What arrives at the setup's workers, with its engine's per-request overhead."""
    arrivals = workload.arrivals
    return Load(isl=workload.isl, osl=workload.osl, isl_cv=workload.isl_cv, osl_cv=workload.osl_cv,
                concurrency=None if workload.concurrency is None else float(workload.concurrency),
                rate_per_s=None if arrivals is None else arrivals.rate_per_s,
                arrival_cv2=1.0 if arrivals is None else arrivals.cv2,
                request_overhead_s=setup.engine.request_overhead_s,
                first_token_steps=setup.engine.first_token_steps)


def target_quantile(workload: ServingWorkload) -> float | None:
    """The statistic the targets bind: None (the mean) for a closed loop at p50, else the percentile as 0-1."""
    return None if workload.percentile == 50 and workload.arrivals is None else workload.percentile / 100.0


def _most_sequences(load: Load, fits: np.ndarray, sequences_per_rank: np.ndarray) -> np.ndarray:
    """The most sequences a rank can run at once: what fits, and in a closed loop no more than its share."""
    return np.minimum(fits, sequences_per_rank) if load.closed else fits


def _agg_grid(costs: WorkerCosts, caps: np.ndarray, budget: int, load: Load) -> tuple[np.ndarray, ...]:
    """(shard, chunk, cap, replicas) of every aggregated candidate within the budget whose cap fits its chunk."""
    s, k, c = (a.ravel() for a in np.meshgrid(np.arange(costs.gpus.size), np.arange(len(costs.chunks)),
                                              np.arange(caps.size), indexing="ij"))
    chunk = np.asarray(costs.chunks, dtype=float)[k]
    keep = (caps[c] <= chunk) & (costs.fits[s, k] >= 1.0)
    s, k, c = s[keep], k[keep], c[keep]
    counts = counts_within(costs, budget)
    s, k, c, r = _with_counts(s, k, c, counts)
    keep = (r * costs.gpus[s] <= budget) & _cap_matters(
        caps, c, _most_sequences(load, costs.fits[s, k], (load.concurrency or 0.0) / (r * costs.shard.dp[s])))
    return s[keep], k[keep], caps[c[keep]], r[keep]


def _cap_matters(caps: np.ndarray, c: np.ndarray, most: np.ndarray) -> np.ndarray:
    """Caps below the most sequences a rank can hold, and the smallest cap at or above it (the larger ones run
    the same deployment)."""
    below = np.concatenate([[0.0], caps[:-1]])[c]
    return (caps[c] < most) | (below < most)


def _with_counts(s: np.ndarray, k: np.ndarray, c: np.ndarray, counts: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each (shard, chunk, cap) row repeated once per worker count, with the count as a fourth column."""
    n = s.size
    return np.repeat(s, counts.size), np.repeat(k, counts.size), np.repeat(c, counts.size), np.tile(counts, n)


def interpolated_step(costs: WorkerCosts, shard_index: np.ndarray) -> StepOf:
    """The decode step of each candidate's sharding as a function of its batch, interpolated on the grid."""
    return lambda batch: decode_s(costs, shard_index, batch)


def interpolated_admit(costs: WorkerCosts, shard_index: np.ndarray, chunk_index: np.ndarray) -> AdmitOf:
    """The prefill of the k prompts a mixed step admits together, per candidate's sharding and chunk size, as a
    function of k (interpolated on the admission grid)."""
    return lambda prompts: admit_s(costs, shard_index, chunk_index, prompts)


def _aggregated(setup_id: int, load: Load, costs: WorkerCosts, caps: np.ndarray, budget: int, q: float | None,
                price: float | None) -> Candidates:
    """Every aggregated deployment of one setup within ``budget`` GPUs, priced at the mean and at ``q``."""
    s, k, cap, r = _agg_grid(costs, caps, budget, load)
    kw: dict[str, Any] = {"prefill_s": costs.prefill_s[s], "step_of": interpolated_step(costs, s),
                          "fits": costs.fits[s, k], "cap": cap, "chunk": np.asarray(costs.chunks, dtype=float)[k],
                          "replicas": r, "ranks": costs.shard.dp[s], "admit_of": interpolated_admit(costs, s, k)}
    mean, at_q = aggregated_stats(load, qs=(None, q), **kw)
    gpus = r * costs.gpus[s]
    index = np.stack([s, k, cap, r, -np.ones_like(r), -np.ones_like(r)], axis=1)
    return Candidates(setup=setup_id, kind=np.zeros(s.size, dtype=int), index=index, gpus=gpus, ttft_s=at_q.ttft_s,
                      tpot_s=at_q.tpot_s, tpot_mean_s=mean.tpot_s, tokens_per_s=mean.requests_per_s * load.osl,
                      busy=mean.busy, usd_per_hour=gpus * _price(price))


def _decode_options(load: Load, costs: WorkerCosts, caps: np.ndarray, budget: int, q: float | None, shared: bool
                    ) -> dict[str, np.ndarray]:
    """Decode pool options (shard, cap, workers) and their latency, the slot wait, the chunk they launch with."""
    chunks = np.asarray(costs.chunks, dtype=float)
    fit_chunk = np.searchsorted(chunks, caps)  # the smallest chunk that carries a full decode batch
    s, c = (a.ravel() for a in np.meshgrid(np.arange(costs.gpus.size), np.arange(caps.size), indexing="ij"))
    ok = fit_chunk[c] < chunks.size
    s, c = s[ok], c[ok]
    k = fit_chunk[c]
    ok = costs.fits[s, k] >= 1.0
    s, c, k = s[ok], c[ok], k[ok]
    counts = counts_within(costs, budget)
    s, k, c, w = _with_counts(s, k, c, counts)
    most = _most_sequences(load, costs.fits[s, k], (load.concurrency or 0.0) / (w * costs.shard.dp[s]))
    room = w * costs.gpus[s] < budget if shared else w * costs.gpus[s] <= budget  # a shared budget keeps room
    keep = room & _cap_matters(caps, c, most)  # for a prefill worker
    s, k, c, w = s[keep], k[keep], c[keep], w[keep]
    kw: dict[str, Any] = {"step_of": interpolated_step(costs, s), "fits": costs.fits[s, k], "cap": caps[c],
                          "workers": w, "ranks": costs.shard.dp[s]}
    (mean, mean_wait), (at_q, wait_q) = decode_pool_stats(load, qs=(None, q), **kw)
    return {"s": s, "k": k, "cap": caps[c], "w": w, "gpus": w * costs.gpus[s], "tpot": at_q.tpot_s,
            "tpot_mean": mean.tpot_s, "wait": wait_q, "wait_mean": mean_wait, "rate": mean.requests_per_s,
            "batch": mean.running_batch, "busy": np.where(mean.stable, 0.0, 1.0)}


def _front(gpus: np.ndarray, *scores: np.ndarray) -> np.ndarray:
    """Indices of the best entry per GPU count under each score (lowest first)."""
    keep = []
    for score in scores:
        order = np.lexsort((score, gpus))
        first = np.ones(order.size, dtype=bool)
        first[1:] = gpus[order][1:] != gpus[order][:-1]
        keep.append(order[first & np.isfinite(score[order])])
    return np.unique(np.concatenate(keep)) if keep else np.array([], dtype=int)


def _prefill_options(costs: WorkerCosts, isl: float, budget: int, shared: bool) -> dict[str, np.ndarray]:
    """Prefill pool options (shard, chunk, workers) that no other option of the same GPUs and servers beats at
    every arrival rate: per (GPUs, servers) the shortest service and the shortest service plus KV transfer."""
    chunks = np.asarray(costs.chunks, dtype=float)
    s, k = (a.ravel() for a in np.meshgrid(np.arange(costs.gpus.size), np.arange(chunks.size), indexing="ij"))
    ok = costs.fits[s, k] >= 1.0
    s, k = s[ok], k[ok]
    counts = counts_within(costs, budget)
    s, k, _, w = _with_counts(s, k, np.zeros_like(s), counts)
    keep = w * costs.gpus[s] < budget if shared else w * costs.gpus[s] <= budget
    s, k, w = s[keep], k[keep], w[keep]
    service = costs.prefill_s[s] + (np.ceil(isl / chunks[k]) - 1.0) * costs.step_overhead_s[s]
    gpus, servers = w * costs.gpus[s], w * costs.shard.dp[s]
    best = []
    for score in (service, service + costs.kv_transfer_s[s]):
        order = np.lexsort((score, servers, gpus))
        first = np.ones(order.size, dtype=bool)
        first[1:] = (gpus[order][1:] != gpus[order][:-1]) | (servers[order][1:] != servers[order][:-1])
        best.append(order[first])
    pick = np.unique(np.concatenate(best)) if best else np.array([], dtype=int)
    return {"s": s[pick], "k": k[pick], "w": w[pick], "gpus": gpus[pick], "servers": servers[pick]}


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSide:
    """One side of a disaggregated deployment: its setup (GPU type, engine, KV dtype), costs, budget and price."""

    setup_id: int
    """Index of the setup."""
    setup: ServingSetup
    """GPU type, engine, precision and KV dtype."""
    costs: WorkerCosts
    """The setup's per-sharding costs."""
    budget: int
    """GPUs of its type the side may use."""
    price: float | None
    """USD per GPU-hour of its type; None where unknown."""


def _disaggregated(prefill: PoolSide, decode: PoolSide, workload: ServingWorkload, load: Load, caps: np.ndarray,
                   q: float | None) -> Candidates:
    """Decode pool options paired with prefill pool options; on one GPU type they share its budget, across two
    types each stays within its own."""
    shared = prefill.setup_id == decode.setup_id
    dec = _decode_options(load, decode.costs, caps, decode.budget, q, shared)
    # The TTFT is known only once paired with a prefill pool: 0 s passes its target here.
    usable = np.isfinite(dec["wait"]) & workload.meets(0.0, dec["tpot"])
    front = np.flatnonzero(usable)[_front(dec["gpus"][usable], dec["tpot"][usable], dec["wait"][usable])]
    costs = prefill.costs
    pre = _prefill_options(costs, load.isl, prefill.budget, shared)
    j, p = (a.ravel() for a in np.meshgrid(front, np.arange(pre["s"].size), indexing="ij"))
    gpus = dec["gpus"][j] + pre["gpus"][p]
    if shared:
        within = gpus <= decode.budget
        j, p, gpus = j[within], p[within], gpus[within]
    rate = dec["rate"][j] if load.closed else load.rate_per_s
    sp = pre["s"][p]
    kw: dict[str, Any] = {"rate_per_s": rate, "prefill_s": costs.prefill_s[sp], "transfer_s": costs.kv_transfer_s[sp],
                          "chunk": np.asarray(costs.chunks, dtype=float)[pre["k"][p]],
                          "step_overhead_s": costs.step_overhead_s[sp], "workers": pre["w"][p],
                          "ranks": costs.shard.dp[sp], "arrival_cv2": 1.0 if load.closed else load.arrival_cv2}
    ttft_mean = prefill_pool_ttft_s(load, **kw) + dec["wait_mean"][j]
    ttft = prefill_pool_ttft_s(load, q=q, **kw) + dec["wait"][j] if q is not None else ttft_mean
    if load.closed:
        tokens = load.closed_concurrency * load.osl / (ttft_mean + load.osl * dec["tpot_mean"][j])
        busy = np.zeros_like(ttft)
    else:
        tokens = np.full(ttft.shape, load.open_rate_per_s * load.osl)
        busy = load.open_rate_per_s * costs.prefill_s[sp] / pre["servers"][p]
    index = np.stack([sp, pre["k"][p], pre["w"][p], dec["s"][j], dec["cap"][j], dec["w"][j]], axis=1).astype(float)
    usd = dec["gpus"][j] * _price(decode.price) + pre["gpus"][p] * _price(prefill.price)
    return Candidates(setup=decode.setup_id, kind=np.ones(j.size, dtype=int), index=index, gpus=gpus, ttft_s=ttft,
                      tpot_s=dec["tpot"][j], tpot_mean_s=dec["tpot_mean"][j],
                      tokens_per_s=np.where(np.isfinite(ttft), tokens, 0.0), busy=busy, usd_per_hour=usd,
                      prefill_setup=-1 if shared else prefill.setup_id)


def price_setup(setup_id: int, setup: ServingSetup, workload: ServingWorkload, choices: ServingChoices,
                budget: int, price: float | None) -> tuple[WorkerCosts | None, list[Candidates]]:
    """Every deployment of one setup (engine, precision, KV dtype, GPU type) within ``budget`` GPUs, priced."""
    shard = worker_shardings(setup.model, setup.cluster, setup.engine.name, choices.fixed, budget)
    if shard.tp.size == 0:
        return None, []
    costs = worker_costs(setup, shard, max_model_len=workload.max_model_len, chunks=chunk_sizes(choices.fixed))
    caps = batch_caps(setup.engine.max_running, choices.fixed)
    load, q = load_for(workload, setup), target_quantile(workload)
    out = []
    if "agg" in choices.modes:
        out.append(_aggregated(setup_id, load, costs, caps, budget, q, price))
    if "disagg" in choices.modes and budget >= 2:
        side = PoolSide(setup_id=setup_id, setup=setup, costs=costs, budget=budget, price=price)
        out.append(_disaggregated(side, side, workload, load, caps, q))
    return costs, out


def price_across(prefill: PoolSide, decode: PoolSide, workload: ServingWorkload, choices: ServingChoices
                 ) -> Candidates:
    """Prefill on one GPU type, decode on another (same engine and KV dtype): each pool within its type's GPUs."""
    caps = batch_caps(decode.setup.engine.max_running, choices.fixed)
    return _disaggregated(prefill, decode, workload, load_for(workload, decode.setup), caps, target_quantile(workload))
