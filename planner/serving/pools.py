"""Per-worker costs of every sharding, priced once so the search can combine them with loads by arithmetic.

A worker's behaviour under load depends on its sharding only through a few numbers: one prompt's prefill, one
prefill chunk as a function of its tokens, the decode step as a function of the running batch, the KV transfer of
one prompt, and per max-batched-tokens size how many sequences its KV pool holds and the memory fraction the
engine needs to start. ``WorkerCosts`` holds them per sharding; the decode step is priced on a grid of batch sizes
(quarter powers of two) and interpolated linearly between grid points (``decode_s``), then priced exactly for the
plans shown (``exact_decode_s``); likewise the prompts a mixed step admits, cut into chunks priced on a grid of
token counts (``admit_s``, ``exact_admit_s``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from paraplan.arrays import Column
from paraplan.cost_models.inference_step import Sharding, WeightPrecision
from paraplan.cost_models.serving import (
    EngineTraits,
    admission_ranks,
    engine_decode_s,
    engine_memory,
    engine_step_overhead_s,
    kv_bytes_per_sequence,
    kv_transfer_s,
    mixed_admission_s,
    mixed_prefill_s,
    prefill_chunk_s,
    prefill_s,
)
from paraplan.hardware_profiles import ClusterSpec
from paraplan.model_specs.model_spec import ModelSpec

RAISED_MEMORY_FRAC = 0.95
"""A worker whose KV pool is empty at the engine's default memory fraction is launched with the fraction raised
to 0.95 (the engine's own knob, under its own budget rule); one that still holds no sequence is never planned."""
GRID_STEPS_PER_DOUBLING = 4
"""Decode-step grid: batch sizes 2^(k/4). Linear interpolation between neighbours differs from the exact step by
at most ~1% here (the step is piecewise linear in batch apart from GEMM saturation and the experts hit)."""
MAX_GRID_BATCH = 4096
CHUNK_STEPS_PER_DOUBLING = 8
"""Prefill-chunk grid: token counts 2^(k/8) up to the largest chunk size searched (and each size itself). Linear
interpolation between neighbours 9% apart smears the corners of the chunk's rooflines (weight read against
compute); measured over Llama-3.1-8B/70B, Mixtral-8x7B, Qwen3-30B-A3B and DeepSeek-V3 at tp 1, tp 8 and dp 8 x ep 8,
isl 64 to 12,000, every chunk size searched and every average admission up to 4,096/osl prompts a step, the
admission stays within 0.2% of its direct pricing (0.5% at 2^(k/4))."""
_AXES = ("tp", "dp", "moe_tp", "moe_ep", "pp")


def batch_grid() -> np.ndarray:
    """Decode batch sizes the step is priced at: 1 ... MAX_GRID_BATCH in quarter powers of two."""
    return 2.0 ** (np.arange(int(np.log2(MAX_GRID_BATCH)) * GRID_STEPS_PER_DOUBLING + 1) / GRID_STEPS_PER_DOUBLING)


def chunk_token_grid(chunks: tuple[int, ...]) -> np.ndarray:
    """Token counts a prefill chunk is priced at: 1 ... the largest of ``chunks`` in eighth powers of two, and each
    chunk size itself (full chunks are then priced exactly)."""
    doublings = int(np.ceil(np.log2(max(chunks))))
    powers = 2.0 ** (np.arange(doublings * CHUNK_STEPS_PER_DOUBLING + 1) / CHUNK_STEPS_PER_DOUBLING)
    return np.unique(np.concatenate([powers[powers < max(chunks)], np.asarray(chunks, dtype=float)]))


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingSetup:
    """One model on one GPU type under one engine, precision and KV dtype."""

    model: ModelSpec
    """The model, its linear-attention and indexer shapes (``model.mixers``) included."""
    cluster: ClusterSpec
    engine: EngineTraits
    precision: WeightPrecision
    quant_modes: tuple[str, str]
    """(dense GEMM mode, routed-expert mode) as cost_models.serving.weight_precision names them."""
    kv_dtype: str
    isl: float
    """Mean prompt tokens."""
    osl: float
    """Mean output tokens."""

    @property
    def context_tokens(self) -> float:
        """Mean context a decoding sequence attends to: the prompt and half the output."""
        return self.isl + self.osl / 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerCosts:
    """Per sharding (arrays [S] or [S, chunks]) the numbers loads combine with."""

    shard: Sharding
    chunks: tuple[int, ...]
    """Max batched tokens per step the capacity columns belong to."""
    prefill_s: np.ndarray
    """One prompt's prefill alone plus the engine's step overhead [S]."""
    decode_grid_s: np.ndarray
    """Decode step plus step overhead at each ``batch_grid()`` batch per attention-DP rank [S, G], per output token
    (a speculative step over the tokens it emits on average)."""
    chunk_tokens: np.ndarray
    """Token counts the prefill chunk is priced at (``chunk_token_grid``) [T]."""
    chunk_grid_s: np.ndarray
    """One prefill chunk of each ``chunk_tokens`` count cut from the prompts, without step overhead [S, T]
    (``serving.prefill_chunk_s``)."""
    isl: float
    """Mean prompt tokens the chunks are cut from."""
    step_overhead_s: np.ndarray
    """The engine's step overhead at each sharding (``serving.engine_step_overhead_s``), which each chunk step takes
    [S]."""
    admission_ranks: np.ndarray
    """Attention-DP ranks whose admissions a step waits for [S]: the worker's dp, or 1 where the engine balances them
    (``serving.admission_ranks``)."""
    kv_transfer_s: np.ndarray
    """One prompt's KV cache from this worker to a decode worker [S]."""
    fits: np.ndarray
    """Sequences (at the engine's held length) one attention-DP rank's KV pool holds [S, chunks]; 0: never planned."""
    memory_frac: np.ndarray
    """The engine's memory knob the worker is launched with (default or raised) [S, chunks]."""

    @property
    def gpus(self) -> np.ndarray:
        """GPUs of one worker [S]."""
        return self.shard.gpus


def _decode(setup: ServingSetup, shard: Sharding, batch: Column) -> np.ndarray:
    """Decode step at ``batch`` sequences per attention-DP rank: pipeline stages each run batch/pp of them at a
    time, and a token crosses every stage, so a sequence waits one full pass at micro-batch batch/pp."""
    micro = np.maximum(np.asarray(batch, dtype=float) / shard.pp, 1.0)
    return engine_decode_s(setup.model, setup.cluster, setup.engine, setup.precision, shard, micro,
                           setup.context_tokens)


def _capacity(setup: ServingSetup, shard: Sharding, chunk: int, held_tokens: float, max_model_len: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """(sequences per rank, memory knob) at the default fraction where the engine starts, else raised."""
    engine = replace(setup.engine, max_batched_tokens=chunk)
    raised = engine if engine.memory_frac_set else replace(engine, memory_frac=RAISED_MEMORY_FRAC)  # the user's stays
    longest_bytes = kv_bytes_per_sequence(setup.model, shard.tp, max_model_len, setup.precision.kv_bytes) / shard.pp
    out = []
    for traits in (engine, raised):
        mem = engine_memory(setup.model, setup.cluster, traits, setup.precision, shard, held_tokens)
        admits_longest = replace(mem, kv_bytes_per_sequence=longest_bytes).max_sequences >= 1.0
        out.append(np.where(admits_longest, mem.max_sequences, 0.0))
    default, high = out
    starts = default >= 1.0
    return np.where(starts, default, high), np.where(starts, engine.memory_frac, raised.memory_frac)


def _chunks_s(setup: ServingSetup, shard: Sharding, tokens: np.ndarray) -> np.ndarray:
    """``prefill_chunk_s`` of every sharding at each of ``tokens`` [S, T]."""
    s = shard.gpus.size
    column = Sharding(**{k: np.repeat(getattr(shard, k), tokens.size) for k in _AXES})
    return prefill_chunk_s(setup.model, setup.cluster, setup.precision, column, setup.isl,
                           np.tile(tokens, s)).reshape(s, tokens.size)


def worker_costs(setup: ServingSetup, shard: Sharding, *, max_model_len: int, chunks: tuple[int, ...]) -> WorkerCosts:
    """Everything per sharding the search combines with loads."""
    isl, osl = setup.isl, setup.osl
    grid = batch_grid()
    s = shard.gpus.size
    shard = Sharding(**{k: np.broadcast_to(getattr(shard, k), (s,)).astype(float) for k in _AXES})
    column = Sharding(**{k: np.repeat(getattr(shard, k), grid.size) for k in _AXES})
    decode = _decode(setup, column, np.tile(grid, s)).reshape(s, grid.size)
    held = isl + osl if setup.engine.reserves_full_length else isl + osl / 2.0
    caps = [_capacity(setup, shard, chunk, held, max_model_len) for chunk in chunks]
    overhead = np.broadcast_to(engine_step_overhead_s(setup.engine, shard), (s,)).astype(float)
    prefill = prefill_s(setup.model, setup.cluster, setup.precision, shard, isl) + overhead
    transfer = kv_transfer_s(setup.model, setup.cluster, setup.precision, shard, isl)
    tokens = chunk_token_grid(chunks)
    return WorkerCosts(shard=shard, chunks=chunks, prefill_s=np.broadcast_to(prefill, (s,)).astype(float),
                       decode_grid_s=decode, chunk_tokens=tokens, chunk_grid_s=_chunks_s(setup, shard, tokens),
                       isl=isl, step_overhead_s=overhead,
                       admission_ranks=np.broadcast_to(admission_ranks(setup.engine, shard), (s,)).astype(float),
                       kv_transfer_s=np.broadcast_to(transfer, (s,)).astype(float),
                       fits=np.stack([c[0] for c in caps], axis=1), memory_frac=np.stack([c[1] for c in caps], axis=1))


def decode_s(costs: WorkerCosts, index: np.ndarray, batch: np.ndarray) -> np.ndarray:
    """Decode step of sharding ``index`` at ``batch`` sequences per rank, interpolated on the grid."""
    grid = batch_grid()
    b = np.clip(np.asarray(batch, dtype=float), 1.0, grid[-1])
    j = np.clip(np.floor(np.log2(b) * GRID_STEPS_PER_DOUBLING).astype(int), 0, grid.size - 2)
    frac = (b - grid[j]) / (grid[j + 1] - grid[j])
    flat = costs.decode_grid_s.ravel()
    at = np.asarray(index) * grid.size + j
    return flat[at] * (1 - frac) + flat[at + 1] * frac


def exact_decode_s(setup: ServingSetup, shard: Sharding, batch: Column) -> np.ndarray:
    """The decode step priced directly (for the plans shown)."""
    return _decode(setup, shard, batch)


def _chunk_s(costs: WorkerCosts, index: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """One prefill chunk of ``tokens`` tokens on sharding ``index``, interpolated on the chunk grid."""
    grid = costs.chunk_tokens
    t = np.clip(np.asarray(tokens, dtype=float), grid[0], grid[-1])
    j = np.clip(np.searchsorted(grid, t, side="right") - 1, 0, grid.size - 2)
    frac = (t - grid[j]) / (grid[j + 1] - grid[j])
    flat = costs.chunk_grid_s.ravel()
    at = np.asarray(index) * grid.size + j
    return flat[at] * (1 - frac) + flat[at + 1] * frac


def admit_s(costs: WorkerCosts, index: np.ndarray, chunk: np.ndarray, prompts: Column) -> np.ndarray:
    """The mean admission of ``prompts`` prompts a step (``serving.mixed_admission_s``) on sharding ``index`` at
    chunk column ``chunk``, its chunks interpolated on the chunk grid."""
    budget = np.asarray(costs.chunks, dtype=float)[np.asarray(chunk)]
    return mixed_admission_s(prompts, costs.isl, budget, lambda tokens: _chunk_s(costs, index, tokens),
                             costs.prefill_s[np.asarray(index)], costs.step_overhead_s[np.asarray(index)],
                             costs.admission_ranks[np.asarray(index)])


def exact_admit_s(setup: ServingSetup, shard: Sharding, chunk: int, prompts: np.ndarray) -> np.ndarray:
    """The admission of ``prompts`` prompts a step priced directly at ``chunk`` max batched tokens (the plans shown)."""
    engine = replace(setup.engine, max_batched_tokens=chunk)
    return mixed_prefill_s(setup.model, setup.cluster, engine, setup.precision, shard, setup.isl, prompts,
                           admission_ranks(setup.engine, shard))
