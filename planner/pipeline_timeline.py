"""When each pipeline rank runs each forward and backward chunk of each micro-batch: a timeline to draw.

The cost model prices a schedule in closed form (cost_models/estimate.py and schedules.py); this module lays the
same chunks out in time so a person can see the fill, the steady state and the drain. Each rank runs its
operations one at a time; an operation starts when its rank is free and its input has arrived (the previous chunk
of the micro-batch, one p2p hop later when that chunk ran on another rank).

Orders: 1F1B and Megatron's interleaved 1F1B run a fixed order per rank (Narayanan et al. 2021, section 2.2:
``pp − r − 1`` warm-up forwards on rank r, ``(pp − r − 1)·2 + (vpp − 1)·pp`` chunk forwards with vpp chunks, then
one forward and one backward in turn). DualPipeV runs the steps of deepseek-ai/DualPipe's dualpipev.py with each
weight-gradient chunk inside its backward, as schedules.py prices a paired F&B (one after the other); DualPipe is
laid out greedily (a ready backward first, else the forward furthest along, at most pp + 1 micro-batches started
and not finished per rank). Without the weight-gradient split their drawn bubble lies above schedules.py's closed
form, which prices the plan; the figure states both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.planner.stage_times import ChunkTimes

PHASES = ("forward", "recompute", "backward", "comm")
"""What a drawn box is: forward compute, recomputed forward, backward compute, exposed collectives (half after the
forward, half after the backward)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    """Boxes of the drawn micro-batches, one row per box (arrays of equal length)."""

    rank: np.ndarray
    """Pipeline rank running the box."""
    start_s: np.ndarray
    """Seconds from the first forward."""
    duration_s: np.ndarray
    phase: np.ndarray
    """Index into PHASES."""
    microbatch: np.ndarray
    chunk: np.ndarray
    """Model chunk (model order) the box belongs to."""
    num_ranks: int
    num_drawn_microbatches: int
    """Micro-batches laid out (the step may have more; the steady state repeats)."""
    makespan_s: float
    """From the first forward to the last backward of the drawn micro-batches."""


@dataclass(frozen=True, slots=True)
class _Op:
    microbatch: int
    hop: int
    """Position along the micro-batch's path of chunks (forward order)."""
    backward: bool


def drawn_microbatches(times: ChunkTimes, cap_per_rank: int = 2) -> int:
    """Micro-batches worth drawing: all of them up to ``cap_per_rank``·pp (fill, steady state, drain all show), a
    multiple of pp for interleaving (Megatron's rule) and an even count for DualPipe (half from each end)."""
    pp = times.pp
    count = min(times.num_microbatches, max(cap_per_rank * pp, 4))
    if len(times.rank_of_chunk) > pp and times.schedule == "1f1b":
        count = max(pp, count - count % pp)
    if times.schedule == "dualpipe":
        count = max(2, count - count % 2)
    return min(count, times.num_microbatches)


def _paths(times: ChunkTimes, m: int) -> list[list[tuple[int, int]]]:
    """(chunk, rank) of each hop of each micro-batch, forward order. DualPipe's second half of micro-batches enters
    at the last rank and runs the mirror copy of the stages."""
    pp = times.pp
    straight = list(enumerate(times.rank_of_chunk))
    mirror = [(chunk, pp - 1 - rank) for chunk, rank in straight]
    return [mirror if times.schedule == "dualpipe" and mb >= m // 2 else straight for mb in range(m)]


def _megatron_order(rank: int, pp: int, vpp: int, m: int) -> list[_Op]:
    """Rank ``rank``'s operations under (interleaved) 1F1B, hop = local chunk·pp + rank."""
    total = m * vpp

    def item(k: int, backward: bool) -> _Op:
        local = (k // pp) % vpp if vpp > 1 else 0
        microbatch = (k // (pp * vpp)) * pp + k % pp if vpp > 1 else k
        return _Op(microbatch, ((vpp - 1 - local) if backward else local) * pp + rank, backward)

    warmup = min(total, (pp - rank - 1) * 2 + (vpp - 1) * pp if vpp > 1 else pp - rank - 1)
    order = [item(k, False) for k in range(warmup)]
    for k in range(total - warmup):
        order += [item(warmup + k, False), item(k, True)]
    return order + [item(k, True) for k in range(total - warmup, total)]


def _durations(times: ChunkTimes, chunk: int, backward: bool) -> list[tuple[int, float]]:
    """(phase, seconds) of the boxes of one operation, in drawing order."""
    half_comm = times.comm_s[chunk] / 2.0
    if backward:
        return [(1, times.recompute_s[chunk]), (2, times.backward_s[chunk]), (3, half_comm)]
    return [(0, times.forward_s[chunk]), (3, half_comm)]


def _in_flight_cap(pp: int) -> int:
    """Micro-batches a DualPipe rank may have started and not finished: pp + 1 (schedules.in_flight_microbatches
    holds pp + 1 micro-batches' activations on a DualPipe rank)."""
    return pp + 1


def _dualpipev_order(rank: int, pp: int, m: int) -> list[_Op]:
    """Rank ``rank``'s operations under DualPipeV, the steps of deepseek-ai/DualPipe's dualpipev.py with each
    weight-gradient chunk run inside its backward (as schedules.py prices F&B: one after the other). Local chunk 0
    is hop ``rank`` of the V, chunk 1 hop 2pp − 1 − rank; each chunk's forwards and backwards take the micro-batches
    in order."""
    counters = {(False, 0): 0, (False, 1): 0, (True, 0): 0, (True, 1): 0}
    order: list[_Op] = []

    def take(backward: bool, local: int) -> None:
        microbatch = counters[(backward, local)]
        counters[(backward, local)] += 1
        order.append(_Op(microbatch, rank if local == 0 else 2 * pp - 1 - rank, backward))

    steps = [((pp - rank - 1) * 2, [(False, 0)]), (rank + 1, [(False, 0), (False, 1)]),
             (pp - rank - 1, [(True, 1), (False, 1)]),
             (m - 2 * pp + rank + 1, [(False, 0), (True, 1), (False, 1), (True, 0)]),
             (pp - rank - 1, [(True, 1), (False, 1), (True, 0)]), (rank + 1, [(True, 1), (True, 0)]),
             (pp - rank - 1, [(True, 0)])]
    for repeats, pattern in steps:
        for _ in range(repeats):
            for backward, local in pattern:
                take(backward, local)
    return order


class _Run:
    """The state of one layout: what ran where and when."""

    def __init__(self, times: ChunkTimes, m: int) -> None:
        self.times, self.m, self.paths = times, m, _paths(times, m)
        self.pp = times.pp
        self.free_s = [0.0] * self.pp
        self.in_flight = [0] * self.pp
        self.end_s: dict[_Op, float] = {}
        self.ready: list[dict[_Op, float]] = [{} for _ in range(self.pp)]
        self.boxes: list[tuple[int, float, float, int, int, int]] = []
        for mb in range(m):
            self.ready[self.paths[mb][0][1]][_Op(mb, 0, False)] = 0.0

    def rank_of(self, op: _Op) -> int:
        return self.paths[op.microbatch][op.hop][1]

    def start_s(self, rank: int, op: _Op) -> float:
        return max(self.free_s[rank], self.ready[rank][op])

    def run(self, rank: int, op: _Op) -> None:
        """Run ``op`` on ``rank`` as early as it can; release the operation that waits for it."""
        start = self.start_s(rank, op)
        del self.ready[rank][op]
        chunk = self.paths[op.microbatch][op.hop][0]
        for phase, seconds in _durations(self.times, chunk, op.backward):
            if seconds > 0:
                self.boxes.append((rank, start, float(seconds), phase, op.microbatch, chunk))
                start += float(seconds)
        self.free_s[rank] = self.end_s[op] = start
        if op.hop == 0:  # a micro-batch enters (its first forward) or leaves (its last backward) the pipeline
            self.in_flight[rank] += -1 if op.backward else 1
        last = len(self.paths[op.microbatch]) - 1
        if not op.backward:
            following = _Op(op.microbatch, op.hop + 1, False) if op.hop < last else _Op(op.microbatch, last, True)
        elif op.hop > 0:
            following = _Op(op.microbatch, op.hop - 1, True)
        else:
            return
        target = self.rank_of(following)
        self.ready[target][following] = start + (self.times.hop_s if target != rank else 0.0)


def _next_in_order(run: _Run, orders: list[list[_Op]], done: list[int], rank: int) -> _Op | None:
    if done[rank] < len(orders[rank]) and orders[rank][done[rank]] in run.ready[rank]:
        return orders[rank][done[rank]]
    return None


def _greedy_choice(run: _Run, rank: int) -> _Op | None:
    """The ready operation that can start first; at a tie a backward, then the forward furthest along."""
    cap = _in_flight_cap(run.pp)
    allowed = [op for op in run.ready[rank] if op.backward or op.hop > 0 or run.in_flight[rank] < cap]
    if not allowed:
        return None
    return min(allowed, key=lambda op: (run.start_s(rank, op), not op.backward, -op.hop, op.microbatch))


def lay_out(times: ChunkTimes, num_microbatches: int | None = None) -> Timeline:
    """The timeline of the first ``num_microbatches`` micro-batches (default :func:`drawn_microbatches`)."""
    m = drawn_microbatches(times) if num_microbatches is None else num_microbatches
    run = _Run(times, m)
    vpp = len(times.rank_of_chunk) // run.pp
    orders = [_megatron_order(rank, run.pp, vpp, m) for rank in range(run.pp)] if times.schedule == "1f1b" else \
        [_dualpipev_order(rank, run.pp, m) for rank in range(run.pp)] if times.schedule == "dualpipev" else []
    strict = bool(orders)
    done = [0] * run.pp
    for _ in range(2 * m * len(times.rank_of_chunk)):
        choices = [(run.start_s(r, op), r, op) for r in range(run.pp)
                   if (op := _next_in_order(run, orders, done, r) if strict else _greedy_choice(run, r)) is not None]
        _, rank, op = min(choices, key=lambda choice: choice[:2])
        run.run(rank, op)
        done[rank] += 1
    columns = np.array(run.boxes, dtype=float).reshape(-1, 6)
    return Timeline(rank=columns[:, 0].astype(int), start_s=columns[:, 1], duration_s=columns[:, 2],
                    phase=columns[:, 3].astype(int), microbatch=columns[:, 4].astype(int),
                    chunk=columns[:, 5].astype(int), num_ranks=run.pp, num_drawn_microbatches=m,
                    makespan_s=float(max(run.free_s)))
