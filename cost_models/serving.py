"""Serving a model at a fixed concurrency: engine memory, the largest batch that fits, TTFT and TPOT.

Built on ``inference_step.step_time``. The steady state a fixed-concurrency benchmark measures, per
attention-DP rank running B = min(concurrency, largest batch that fits) sequences:

- TPOT = decode step at batch B (mean context isl + osl/2) + the engine's per-step overhead + the
  prefills that continuous batching mixes into decode: each of the B sequences is replaced once per osl
  steps, so every step admits k = B/osl prompts (attention-DP ranks prefill their own prompts in the same
  steps). Below one (k <= 1) a fraction k of the steps prefills one prompt; from one up a step's prompts run
  together as prefill chunks of at most the engine's max batched tokens (``mixed_prefill_s``), reading every
  weight and hit expert once per chunk instead of once per prompt. Attention-DP ranks step together, so unless
  the engine balances their admissions (TRT-LLM) a step lasts as long as the busiest rank's prefill
  (``busiest_admission_frac``); SGLang's budget is the worker's, split over its DP ranks (``rank_batched_tokens``).
- TTFT = the request's own prefill + half a step (it arrives mid-step) + the wait for a free slot when the
  concurrency exceeds what fits (a closed loop: (C − B)/B request lifetimes).
- Disaggregated: TTFT from the prefill pool (its prefill, its queue at the pool's utilisation, the KV
  transfer to the decode worker); TPOT from a decode worker at its batch, with no prefill mixed in.

Engine memory (what each engine reserves, at its default): vLLM ``gpu_memory_utilization`` 0.9 of HBM;
SGLang ``mem_fraction_static`` (its heuristic gives about 0.85 on 80-280 GB parts); TensorRT-LLM
``free_gpu_memory_fraction`` 0.9 of what is free after weights and activations (KvCacheConfig default,
nvidia.github.io/TensorRT-LLM llm-api reference). The KV pool is what remains after weights, activations
at the engine's max batched tokens and the CUDA context.

Engine settings a user chooses (``EngineKnobs``, ``serve --memory-fraction/--no-cuda-graphs/--speculative``): the
memory fraction under each engine's rule above, eager decode (``EAGER_KERNEL_LAUNCH_S`` per kernel) and
speculative decoding (``Speculation``), priced per output token by ``engine_decode_s``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from paraplan.arrays import Column
from paraplan.choices import SERVING_ENGINES, Precision, ServingEngine
from paraplan.cost_models.device_memory import CUDA_CONTEXT_BYTES, NCCL_BYTES_PER_COMMUNICATOR, driver_visible_bytes
from paraplan.cost_models.inference_step import (
    ACTIVATION_BYTES,
    KERNELS_PER_LAYER,
    MOE_EXTRA_KERNELS,
    Sharding,
    WeightPrecision,
    admitted_prefill_s,
    attention_params_per_gpu,
    kv_bytes_per_token_per_layer,
    prefill_attention_flops,
    prefill_chunk_tokens,
    step_time,
)
from paraplan.errors import InputError
from paraplan.hardware_profiles import ClusterSpec
from paraplan.hardware_profiles.units import BYTES_PER_GIB
from paraplan.model_specs.model_spec import ModelSpec

ENGINES = SERVING_ENGINES  # kept under its old name for the modules that import it from here

MemoryBudget = Literal["profiled", "total", "free"]
"""What an engine's memory fraction covers (``EngineTraits.budget``)."""
SpeculativeMethod = Literal["mtp", "eagle", "draft"]
"""Where draft tokens come from: the model's own MTP layers, an EAGLE head, or a separate draft model."""

EAGER_KERNEL_LAUNCH_S = 22e-6
"""Host time per kernel of a decode step launched eagerly (no CUDA graph: vLLM --enforce-eager, SGLang
--disable-cuda-graph), per kernel as ``inference_step.KERNELS_PER_LAYER`` counts them: Llama 3.1 8B decodes a
token in 8.4 ms eagerly and 5.1 ms as a CUDA graph on an H100 SXM5 (cloudai.pt/tag/cuda-graphs); the eager step
is host-bound, 8.4 ms over 32 layers x 12 kernels = 22 us each (PyTorch's ~10 us of Python and dispatcher per
op, about two eager ops per fused kernel counted here). 80 layers of Llama 3.1 70B give a 21 ms floor, the
~25-30 ms per step (with the step overhead) issue 32 reports for an older engine at TP 2-8."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Speculation:
    """Speculative decoding: each step drafts ``num_tokens`` tokens and the target verifies them in one pass."""

    method: SpeculativeMethod
    """mtp (the model's own next-token layers), eagle (an EAGLE head) or draft (a separate draft model)."""
    num_tokens: int
    """Draft tokens per step, N >= 1; the target's verify pass runs N + 1 tokens per sequence."""
    acceptance_frac: float
    """Probability that each draft token is accepted, given the ones before it were, in [0, 1)."""
    draft_model: str | None = None
    """The draft's name or path as the engine loads it (eagle, draft); None for mtp."""
    draft: ModelSpec | None = None
    """The draft model's shape (method draft); priced with its own decode step per draft token."""

    def __post_init__(self) -> None:
        """One-line errors for values outside their ranges."""
        if isinstance(self.num_tokens, bool) or not isinstance(self.num_tokens, int) or self.num_tokens < 1:
            raise InputError(f"--spec-tokens must be an integer >= 1, got {self.num_tokens!r}")
        if not 0.0 <= self.acceptance_frac < 1.0:
            raise InputError(f"--acceptance must be in [0, 1), got {self.acceptance_frac!r}")
        if self.method == "draft" and self.draft is None:
            raise InputError("--speculative draft:MODEL needs the draft model's shape")

    @property
    def expected_tokens(self) -> float:
        """Tokens a sequence emits per step: (1 - A^(N+1)) / (1 - A), the expected accepted length plus the
        target's own token (Leviathan et al. 2023, eq. 1)."""
        a = self.acceptance_frac
        return (1.0 - a ** (self.num_tokens + 1)) / (1.0 - a)


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineTraits:
    """What an inference engine does by default that its costs depend on."""

    name: ServingEngine
    """vllm, sglang or trtllm."""
    memory_frac: float
    """Default fraction of memory the engine takes (see ``budget``)."""
    budget: MemoryBudget
    """``profiled``: weights, profiled activations, non-torch memory and the KV pool = memory_frac × HBM (vLLM);
    ``total``: weights + KV pool = memory_frac × HBM (SGLang); ``free``: KV pool = memory_frac × what is free
    after weights and activations (TensorRT-LLM)."""
    max_batched_tokens: int
    """Tokens one step may carry (vLLM max_num_batched_tokens, SGLang chunked_prefill_size, TRT-LLM max_num_tokens)."""
    reserves_full_length: bool
    """The scheduler admits a request only with KV blocks for its whole length reserved (TRT-LLM's default
    GUARANTEED_NO_EVICT policy); otherwise blocks are allocated as tokens arrive (vLLM, SGLang), so a running
    sequence holds isl + osl/2 tokens on average."""
    max_running: int
    """Largest running batch (vLLM max_num_seqs, SGLang max_running_requests cap, TRT-LLM max_batch_size)."""
    step_overhead_s: float
    """CPU scheduling and sampling per step not hidden behind the GPU (fitted, see validation/serving_runs.py)."""
    request_overhead_s: float
    """Per-request latency before the first token outside the GPU steps: HTTP, tokenization, scheduling
    admission, detokenizing and streaming the first token (fitted, see validation/serving_runs.py)."""
    first_token_steps: float = 0.0
    """Engine iterations, counted in steady-state TPOTs, that a request spends before its first token beyond its
    own prefill, the half step of arrival alignment and the receive interval: its hops through the engine's
    processes (front end, scheduler, model runner, output handler) each meet the engine's iteration cadence, so this
    part of the TTFT grows with the step time where ``request_overhead_s`` does not (fitted, see
    validation/serving_runs.py; ``aggregated``). Disaggregated, at the decode pool's TPOT: the first token streams
    from the decode worker, whose loop the request joins after its KV cache arrives (``disaggregated``)."""
    dp_sync_s: float = 0.0
    """Host seconds more per step where attention-DP ranks step together (dp > 1): before every forward the ranks
    agree on what each runs (vLLM's DP ranks all-reduce their token counts, SGLang's gather their batch shapes,
    TRT-LLM's gather their request counts), a CPU collective on the step's critical path (fitted, one value for
    every engine, see validation/serving_runs.py; ``engine_step_overhead_s``)."""
    source: str
    """Where the defaults come from."""
    memory_frac_set: bool = False
    """The user set ``memory_frac``: a worker that does not start at it is not planned (never raised)."""
    cuda_graphs: bool = True
    """Decode steps replay CUDA graphs; False: launched eagerly (``EAGER_KERNEL_LAUNCH_S`` per kernel)."""
    speculation: Speculation | None = None
    """Speculative decoding, or None."""
    batched_tokens_per_worker: bool = False
    """``max_batched_tokens`` is the worker's, split over its attention-DP ranks (SGLang divides chunked_prefill_size
    by dp_size under DP attention, server_args._handle_data_parallelism, "to avoid MoE kernel issues"); otherwise
    it is each rank's (vLLM's DP engine cores and TRT-LLM's ranks each schedule their own); ``rank_batched_tokens``."""
    scheduler_recv_interval: int = 1
    """Decode steps between the scheduler's reads of new requests (SGLang ``--scheduler-recv-interval``, default 1:
    ``SchedulerRecvSkipper`` counts a decode or verify step 1 and a prefill step 1000 against the interval, so after
    a prefill it reads at once, during decoding every N steps). A request arriving while the engine decodes waits for
    the next read, a mean (N − 1)/2 decode steps more than at N = 1 (``aggregated``)."""
    prefill_first: bool = False
    """Whenever a prefill batch can be formed the engine runs it before the next decode step, prefill and decode
    in separate steps (SGLang: ``Scheduler.get_next_batch_to_run`` takes ``get_new_batch_prefill()`` first, "Run
    prefill first if possible"; mixed steps only with --enable-mixed-chunk, off by default). Otherwise the engine
    schedules its running decodes first and fills the step's token budget with prefill chunks (vLLM V1's
    scheduler, TRT-LLM's in-flight batching). A burst of prompts is prefilled whole before any of them decodes
    (``burst_tpot_s``)."""
    balances_dp_admission: bool = False
    """Attention-DP ranks admit new prompts in the same steps (TensorRT-LLM's AttentionDpConfig.enable_balance, which
    NVIDIA's DeepSeek recipes turn on: context requests wait up to batching_wait_iters steps until every rank has
    one), so a step's prefill is the ranks' mean; otherwise each rank schedules its own prefills (vLLM's DP engine
    cores, SGLang's per-rank schedulers) and a step waits for the busiest rank (``mixed_admission_s``)."""


# step_overhead_s and request_overhead_s: the fit `paraplan validate --serving` makes on the 4,168 of its 5,221 rows
# that state their deployment (serving_runs.deployment_stated)
# (validation/serving_runs.py: per engine the step overhead with the lowest mean |log error| of TPOT, then the request
# overhead with the lowest median |log error| of TTFT). `paraplan serve` prices with exactly the constants validate
# reports in sample (tests/test_serving_validation.py checks they are equal); the held-out figures refit them.
DP_SYNC_S = 3.0e-3
"""``EngineTraits.dp_sync_s`` of every engine: the fit validate makes (below)."""
ENGINE_TRAITS: dict[str, EngineTraits] = {
    "vllm": EngineTraits(
        name="vllm", memory_frac=0.9, budget="profiled", max_batched_tokens=8192, reserves_full_length=False,
        max_running=1024, step_overhead_s=2.5e-3, request_overhead_s=0.0, first_token_steps=7.0, dp_sync_s=DP_SYNC_S,
        source="vLLM 0.11-0.19 CacheConfig.gpu_memory_utilization 0.9; V1 online serving on >=70 GiB GPUs: "
               "max_num_batched_tokens 8192, max_num_seqs 1024"),
    "sglang": EngineTraits(
        name="sglang", memory_frac=0.85, budget="total", max_batched_tokens=8192, reserves_full_length=False,
        max_running=4096, step_overhead_s=4.0e-3, request_overhead_s=300e-3, dp_sync_s=DP_SYNC_S,
        batched_tokens_per_worker=True, prefill_first=True,
        source="SGLang 0.5 server_args: mem_fraction_static from its reserved-memory heuristic (~0.85 on 80-280 GB "
               "GPUs), chunked_prefill_size 8192 (divided by dp_size under DP attention); prefill-first "
               "scheduler, enable_mixed_chunk off"),
    "trtllm": EngineTraits(
        name="trtllm", memory_frac=0.9, budget="free", max_batched_tokens=8192, reserves_full_length=True,
        max_running=2048, step_overhead_s=1.5e-3, request_overhead_s=60e-3, first_token_steps=8.0,
        dp_sync_s=DP_SYNC_S,
        balances_dp_admission=True,
        source="TensorRT-LLM 1.x KvCacheConfig.free_gpu_memory_fraction 0.9; max_num_tokens 8192, max_batch_size 2048; "
               "attention_dp_config.enable_balance as in NVIDIA's DeepSeek-R1 serving recipes"),
}
"""Engine defaults and the fitted overheads (validation/serving_runs.py refits them from zero on each fold)."""

@dataclass(frozen=True, slots=True, kw_only=True)
class EngineKnobs:
    """Engine settings the user chose (``serve --memory-fraction/--no-cuda-graphs/--speculative``)."""

    memory_frac: float | None = None
    """The engine's own memory fraction, under its own rule (``EngineTraits.budget``); None: its default."""
    cuda_graphs: bool = True
    """Whether decode steps replay CUDA graphs."""
    speculation: Speculation | None = None
    """Speculative decoding, or None."""

    def __post_init__(self) -> None:
        """A one-line error for a fraction outside (0, 1]."""
        if self.memory_frac is not None and not 0.0 < self.memory_frac <= 1.0:
            raise InputError(f"--memory-fraction must be in (0, 1], got {self.memory_frac!r}")

    def apply(self, traits: EngineTraits) -> EngineTraits:
        """``traits`` with these settings (unchanged at the defaults)."""
        if self == EngineKnobs():
            return traits
        frac = traits.memory_frac if self.memory_frac is None else self.memory_frac
        return replace(traits, memory_frac=frac, memory_frac_set=self.memory_frac is not None,
                       cuda_graphs=self.cuda_graphs, speculation=self.speculation)


def attention_dp_sync_s(engine: EngineTraits, dp: Column) -> np.ndarray:
    """The attention-DP ranks' per-step agreement (``dp_sync_s``) of a worker with ``dp`` ranks: 0 at dp 1."""
    return np.where(np.asarray(dp, dtype=float) > 1.0, engine.dp_sync_s, 0.0)


def engine_step_overhead_s(engine: EngineTraits, shard: Sharding) -> np.ndarray:
    """Host seconds each engine step takes beyond its GPU work, per deployment of ``shard``: the engine's scheduling
    and sampling (``step_overhead_s``), plus the attention-DP ranks' per-step agreement (``attention_dp_sync_s``)."""
    return engine.step_overhead_s + attention_dp_sync_s(engine, shard.dp)


def check_speculation(model: ModelSpec, spec: Speculation | None) -> None:
    """InputError where MTP is asked of a model without MTP layers."""
    if spec is not None and spec.method == "mtp" and not model.mtp_layers:
        raise InputError(f"--speculative mtp: {model.name} has no MTP layers (num_nextn_predict_layers is 0 or "
                         "absent in its config.json); use eagle:MODEL or draft:MODEL")


# gemm/moe quant mode -> (compute dtype, bytes per weight with scales)
_QUANT_MODES: dict[str, tuple[Precision, float]] = {
    "bf16": ("bf16", 2.0),
    "fp8": ("fp8", 1.0),  # per-tensor scale
    "fp8_block": ("fp8", 1.0 + 4.0 / (128 * 128)),  # one fp32 scale per 128x128 block
    "nvfp4": ("fp4", 0.5 + 1.0 / 16),  # one fp8 scale per 16 elements
    "mxfp4": ("fp4", 0.5 + 1.0 / 32),  # OCP microscaling: one e8m0 (1-byte) scale per 32 elements (gpt-oss experts)
    "int4_wo": ("bf16", 0.5 + 2.0 / 32),  # weight-only int4, a bf16 scale per group of 32; bf16 GEMMs
}


def weight_precision(model: ModelSpec, gemm_mode: str, moe_mode: str, kv_dtype: str) -> WeightPrecision:
    """Bytes and GEMM dtypes from an engine's quantization modes (bf16, fp8, fp8_block, nvfp4, mxfp4, int4_wo).

    A checkpoint that lists its attention among unquantized modules keeps it 16-bit; an MoE checkpoint
    quantized to nvfp4 keeps attention and dense layers in fp8 (NVIDIA's ModelOpt NVFP4 MoE recipes
    quantize the experts).
    """
    for mode in (gemm_mode, moe_mode):
        if mode not in _QUANT_MODES:
            raise InputError(f"quantization mode {mode!r} is not one of {', '.join(_QUANT_MODES)}")
    if kv_dtype not in ("bf16", "fp8"):
        raise InputError(f"KV cache dtype {kv_dtype!r} must be bf16 or fp8")
    dense_dtype, dense_bytes = _QUANT_MODES[gemm_mode]
    expert_dtype, expert_bytes = _QUANT_MODES[moe_mode]
    if model.is_moe and gemm_mode == "nvfp4":
        dense_dtype, dense_bytes = _QUANT_MODES["fp8"]
    unquantized = model.weights.unquantized_modules if model.weights else ()
    attention_16bit = any("self_attn" in pattern for pattern in unquantized)
    return WeightPrecision(dense_dtype=dense_dtype, dense_bytes=dense_bytes, expert_dtype=expert_dtype,
                           expert_bytes=expert_bytes, attention_bytes=2.0 if attention_16bit else dense_bytes,
                           kv_bytes=2.0 if kv_dtype == "bf16" else 1.0)


def weight_bytes_per_gpu(model: ModelSpec, prec: WeightPrecision, shard: Sharding) -> np.ndarray:
    """Weights one GPU holds: its layers' attention and dense/shared MLPs split over tp, its experts split over
    moe_ep·moe_tp, the embedding and output head split over tp (16-bit)."""
    layers = model.num_layers / shard.pp
    moe_frac = model.num_moe_layers / model.num_layers
    linear = model.linear_attention_layers / model.num_layers
    attention = ((1 - linear) * attention_params_per_gpu(model, shard.tp)
                 + linear * model.linear_attention_params / shard.tp) * prec.attention_bytes
    dense = ((1 - moe_frac) * model.mlp_params() + moe_frac * (model.shared_expert_params() + model.router_params())) \
        / shard.tp * prec.dense_bytes
    experts = moe_frac * model.num_experts * model.expert_params() / (shard.moe_ep * shard.moe_tp) * prec.expert_bytes
    # Norm weights, biases and QK norms are replicated (16-bit): a layer's parameters beyond its weight matrices.
    vectors = (model.layer_params() - model.attention_weight_params() - model.indexer_params
               - model.mlp_matrices * model.hidden_size * model.ffn_size) * ACTIVATION_BYTES
    edges = (model.embedding_params() + model.output_params()) / shard.tp * ACTIVATION_BYTES
    return layers * (attention + dense + experts + vectors) + edges


def kv_bytes_per_sequence(model: ModelSpec, tp: Column, context_tokens: Column, kv_bytes: float) -> np.ndarray:
    """KV-cache bytes one GPU holds for one sequence of ``context_tokens``: full-attention layers keep every
    token (and its indexer key under DSA), sliding-window layers at most the window (engines with per-window
    pools: vLLM's hybrid allocator, TRT-LLM's per-window pools), linear-attention layers a fixed state (the
    indexer and state shapes: ``model.mixers``)."""
    s = np.asarray(context_tokens, dtype=float)
    sliding = model.sliding_layers if model.sliding_window else 0
    linear = model.linear_attention_layers
    full = model.num_layers - sliding - linear
    window = np.minimum(s, model.sliding_window) if sliding else 0.0
    per_layer = kv_bytes_per_token_per_layer(model, tp, kv_bytes)
    return per_layer * (full * s + sliding * window) + full * s * model.mixers.index_key_bytes \
        + linear * model.mixers.linear_state_bytes(tp)


def activation_bytes(model: ModelSpec, tp: Column, batched_tokens: int) -> np.ndarray:
    """Transient activations of one step at the engine's max batched tokens (what vLLM's profiling run and
    TRT-LLM's warm-up measure): the widest MLP intermediate (gate+up of the dense or routed experts' copies),
    the QKV output and a few hidden-wide buffers, 16-bit, plus fp32 logits of up to 256 sampled rows."""
    tp = np.asarray(tp, dtype=float)
    widest = max(model.mlp_matrices * model.ffn_size / 1.0,
                 model.experts_per_token * model.mlp_matrices * model.expert_ffn_size)
    per_token = (widest / tp + (model.q_width + 2 * model.kv_width) / tp + 4 * model.hidden_size) * ACTIVATION_BYTES
    return batched_tokens * per_token + 256 * model.vocab_size / tp * 4.0


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineMemory:
    """One GPU's memory under an engine's defaults (bytes; arrays, one entry a deployment)."""

    weights_bytes: np.ndarray
    """Weights the GPU holds."""
    activation_bytes: np.ndarray
    """Activations reserved for the largest step."""
    fixed_bytes: np.ndarray
    """CUDA context and communicator buffers."""
    kv_pool_bytes: np.ndarray
    """KV cache pool (negative: the engine would not start)."""
    kv_bytes_per_sequence: np.ndarray
    """KV bytes of one sequence at the length the engine holds for it (``held_tokens``)."""

    @property
    def max_sequences(self) -> np.ndarray:
        """Sequences that fit the pool at once (0 when the engine would not start)."""
        return np.floor(np.maximum(self.kv_pool_bytes, 0.0) / self.kv_bytes_per_sequence)


def engine_memory(model: ModelSpec, cluster: ClusterSpec, engine: EngineTraits, prec: WeightPrecision,
                  shard: Sharding, sequence_tokens: Column) -> EngineMemory:
    """What the engine reserves on one GPU and the KV pool left for ``sequence_tokens``-long sequences."""
    hbm = driver_visible_bytes(cluster.gpu.hbm_bytes)  # an engine's memory fraction is of this, not the training margin
    weights = weight_bytes_per_gpu(model, prec, shard)
    act = activation_bytes(model, shard.tp, engine.max_batched_tokens)
    # CUDA context, one communicator per parallel group and the CUDA-graph pool (about 1 GiB in the engines' logs).
    fixed = np.full_like(weights, CUDA_CONTEXT_BYTES + 3 * NCCL_BYTES_PER_COMMUNICATOR + 1.0 * BYTES_PER_GIB)
    if engine.budget == "free":  # TRT-LLM: a fraction of what is free once weights and warm-up activations sit
        pool = engine.memory_frac * (hbm - weights - act - fixed)
    elif engine.budget == "profiled":  # vLLM: the fraction covers weights, profiled activations, non-torch memory
        pool = engine.memory_frac * hbm - weights - act - fixed
    else:  # SGLang: mem_fraction_static covers weights and the KV pool; activations live in the rest
        pool = engine.memory_frac * hbm - weights
    per_seq = kv_bytes_per_sequence(model, shard.tp, sequence_tokens, prec.kv_bytes) / shard.pp
    if engine.speculation is not None:  # the draft's weights and KV cache share the pool's budget
        draft_weights, draft_kv = _draft_bytes(model, engine.speculation, prec, shard, sequence_tokens)
        share = engine.memory_frac if engine.budget == "free" else 1.0  # TRT-LLM: the pool is a share of free
        weights, pool, per_seq = weights + draft_weights, pool - share * draft_weights, per_seq + draft_kv
    return EngineMemory(weights_bytes=weights, activation_bytes=act, fixed_bytes=fixed, kv_pool_bytes=pool,
                        kv_bytes_per_sequence=per_seq)


def _draft_precision(prec: WeightPrecision) -> WeightPrecision:
    """A draft model's precision: a bf16 checkpoint (published draft and EAGLE models are), the target's KV dtype."""
    return WeightPrecision(dense_dtype="bf16", dense_bytes=2.0, expert_dtype="bf16", expert_bytes=2.0,
                           attention_bytes=2.0, kv_bytes=prec.kv_bytes)


def _draft_shard(shard: Sharding) -> Sharding:
    """A draft model's sharding: the target's attention TP and DP (vLLM's and SGLang's default), one stage."""
    return Sharding.of(shard.tp, shard.dp, pp=1)


def _draft_bytes(model: ModelSpec, spec: Speculation, prec: WeightPrecision, shard: Sharding,
                 sequence_tokens: Column) -> tuple[np.ndarray, np.ndarray]:
    """(weight bytes, KV bytes per sequence) one GPU holds for the draft: a draft model's own, or for MTP/EAGLE
    one layer of the target's (its weights and KV per layer; the head is shared)."""
    if spec.method == "draft" and spec.draft is not None:
        draft_prec, draft_shard = _draft_precision(prec), _draft_shard(shard)
        return (weight_bytes_per_gpu(spec.draft, draft_prec, draft_shard),
                kv_bytes_per_sequence(spec.draft, draft_shard.tp, sequence_tokens, draft_prec.kv_bytes))
    one_layer = Sharding(tp=shard.tp, dp=shard.dp, moe_tp=shard.moe_tp, moe_ep=shard.moe_ep, pp=model.num_layers
                         + 0.0 * shard.pp)
    edges = (model.embedding_params() + model.output_params()) / shard.tp * ACTIVATION_BYTES
    weights = weight_bytes_per_gpu(model, prec, one_layer) - edges
    return weights, kv_bytes_per_sequence(model, shard.tp, sequence_tokens, prec.kv_bytes) / model.num_layers


def prefill_s(model: ModelSpec, cluster: ClusterSpec, prec: WeightPrecision, shard: Sharding, prompt_tokens: Column,
              prompts: Column = 1.0, all_ranks: bool = False) -> np.ndarray:
    """Seconds of one prefill step of ``prompts`` prompts together on an attention-DP rank (compute-bound GEMMs,
    causal attention per prompt). ``all_ranks``: every DP rank prefills as much at once (a burst), so the MoE
    layers see all their tokens; otherwise the other ranks send only decode tokens, which are not counted."""
    prompts = np.asarray(prompts, dtype=float)
    tokens = np.asarray(prompt_tokens, dtype=float) * prompts + 0.0 * shard.tp
    full, sliding = prefill_attention_flops(model, np.asarray(prompt_tokens, dtype=float))
    return step_time(model, cluster, prec, shard, tokens_per_rank=tokens, sequences_per_rank=prompts + 0.0 * tokens,
                     attended_keys=(0.0, 0.0), attention_flops=(prompts * full, prompts * sliding), decode=False,
                     moe_tokens=tokens * shard.dp if all_ranks else tokens).total_s


ChunkPrice = Callable[[np.ndarray], np.ndarray]
"""Seconds of one prefill chunk of t tokens cut from the admitted prompts, as a function of t (one entry a
deployment): ``prefill_chunk_s`` priced directly, or interpolated on a grid of token counts (the search)."""


def prefill_chunk_s(model: ModelSpec, cluster: ClusterSpec, prec: WeightPrecision, shard: Sharding, isl: Column,
                    tokens: Column) -> np.ndarray:
    """Seconds of one prefill chunk of ``tokens`` tokens on an attention-DP rank, cut from prompts of ``isl``
    tokens: tokens/isl prompts' worth of them in one chunk (``inference_step.admitted_prefill_s``), with that
    token share of their causal attention FLOPs and output-head rows; without the engine's step overhead."""
    t = np.asarray(tokens, dtype=float)
    # No budget: the chunk is all (t/isl)·isl tokens, where a budget of t could leave a rounding-sized remainder
    # that admitted_prefill_s would price as a second chunk.
    return admitted_prefill_s(model, cluster, prec, shard, prompts=t / np.asarray(isl, dtype=float),
                              prompt_tokens=isl, max_batched_tokens=np.inf)


def whole_admission_s(prompts: Column, isl: Column, max_batched_tokens: Column, chunk_s: ChunkPrice,
                      alone_s: Column, step_overhead_s: Column) -> np.ndarray:
    """Seconds the mixed steps of an attention-DP rank spend prefilling ``prompts`` whole prompts of ``isl`` tokens
    admitted in one step: their prompts·isl tokens as floor(prompts·isl/M) full chunks of M =
    ``max_batched_tokens`` tokens then the rest, as ``inference_step.admitted_prefill_s`` cuts them, each chunk
    (``chunk_s``) reading every weight and hit expert once and taking one step overhead. No prompt: 0; one: its
    prefill alone (``alone_s``, ``prefill_s`` with one step overhead). At most prompts × ``alone_s``: this serving
    model prices a lone prompt longer than M as one step, and batched prompts must not cost more than as many of
    those; within M one chunk is never the slower (tests/test_serving_admission.py)."""
    n = np.asarray(prompts, dtype=float)
    total = n * np.asarray(isl, dtype=float)
    chunk = np.maximum(prefill_chunk_tokens(n, isl, max_batched_tokens), 1e-9)
    full_chunks = np.floor(total / chunk + 1e-9)
    rest = total - full_chunks * chunk
    more = rest > 1e-9 * chunk  # a remainder beyond rounding (a mean isl need not be whole) is one chunk more
    full_s, rest_s = chunk_s(np.stack(np.broadcast_arrays(chunk, np.maximum(rest, 1e-9))))  # priced at once
    together = full_chunks * (full_s + step_overhead_s) + np.where(more, rest_s + step_overhead_s, 0.0)
    alone = n * np.asarray(alone_s, dtype=float)
    return np.where(n <= 1.0, alone, np.minimum(together, alone))


def mixed_admission_s(prompts_per_step: Column, isl: Column, max_batched_tokens: Column, chunk_s: ChunkPrice,
                      alone_s: Column, step_overhead_s: Column, ranks: Column = 1.0) -> np.ndarray:
    """Mean seconds a decode step of an attention-DP rank spends on the k = ``prompts_per_step`` prompts it admits
    on average (arguments as :func:`whole_admission_s`). Requests finishing staggered (a steady state), a step
    admits floor(k) or floor(k) + 1 prompts, the latter in a fraction k − floor(k) of the steps, each step's
    prompts together; below one prompt a step, a fraction k of the steps prefills one prompt alone: k ×
    ``alone_s``, as when every prompt was its own prefill.

    ``ranks`` attention-DP ranks step together (their MoE layers exchange tokens every layer), so a step lasts as
    long as its busiest rank's admission: the ranks' ranks × (k − floor(k)) extra prompts a step land on distinct
    ranks (requests are spread round-robin), and the busiest rank admits floor(k) + 1 in a fraction
    min(1, ranks × (k − floor(k))) of the steps (``busiest_admission_frac``). One rank: the mean above."""
    k = np.asarray(prompts_per_step, dtype=float)
    k = np.broadcast_to(k, np.broadcast_shapes(k.shape, np.shape(isl), np.shape(max_batched_tokens),
                                               np.shape(alone_s), np.shape(ranks)))
    fewer = np.floor(k)
    counts = np.stack([fewer, fewer + 1.0])  # both whole counts priced at once: [2, ...]
    whole = whole_admission_s(counts, isl, max_batched_tokens, chunk_s, alone_s, step_overhead_s)
    more_frac = busiest_admission_frac(k - fewer, ranks)
    return (1.0 - more_frac) * whole[0] + more_frac * whole[1]


def busiest_admission_frac(more_frac: Column, ranks: Column) -> np.ndarray:
    """Fraction of steps in which the busiest of ``ranks`` attention-DP ranks admits one prompt more than
    floor(k), when each rank does so in a fraction ``more_frac`` of the steps: min(1, ranks × more_frac), the
    ranks' extra prompts spread over distinct ranks and evenly over the steps (round-robin routing, staggered
    finishes). 72 ranks each admitting a 1,024-token prompt every 18th step (k = 0.056) prefill in every step."""
    return np.minimum(np.asarray(more_frac, dtype=float) * np.asarray(ranks, dtype=float), 1.0)


def admitted_s(model: ModelSpec, cluster: ClusterSpec, engine: EngineTraits, prec: WeightPrecision,
               shard: Sharding, isl: Column, prompts: Column, max_batched_tokens: Column) -> np.ndarray:
    """:func:`whole_admission_s` priced directly: ``prompts`` whole prompts admitted in one step, chunks of at most
    ``max_batched_tokens`` (the engine's, or a size the search tries), the engine's step overhead per chunk."""
    overhead = engine_step_overhead_s(engine, shard)
    alone = prefill_s(model, cluster, prec, shard, isl) + overhead
    return whole_admission_s(prompts, isl, max_batched_tokens,
                             lambda tokens: prefill_chunk_s(model, cluster, prec, shard, isl, tokens), alone,
                             overhead)


def mixed_prefill_s(model: ModelSpec, cluster: ClusterSpec, engine: EngineTraits, prec: WeightPrecision,
                    shard: Sharding, isl: Column, prompts_per_step: Column, ranks: Column = 1.0,
                    max_batched_tokens: Column | None = None) -> np.ndarray:
    """:func:`mixed_admission_s` priced directly: the mean seconds a decode step spends on the
    ``prompts_per_step`` prompts it admits on average, at the engine's max batched tokens and step overhead, the
    step waiting for the busiest of ``ranks`` attention-DP ranks. ``max_batched_tokens``: a rank's budget where it
    is not the engine's (``rank_batched_tokens``); prompts longer than it are prefilled in ceil(isl/M) chunk steps
    of isl/chunks tokens, k·chunks of them a decode step, the busiest rank's count as for whole prompts."""
    budget = engine.max_batched_tokens if max_batched_tokens is None else max_batched_tokens
    overhead = engine_step_overhead_s(engine, shard)
    alone = prefill_s(model, cluster, prec, shard, isl) + overhead
    whole = mixed_admission_s(prompts_per_step, isl, budget,
                              lambda tokens: prefill_chunk_s(model, cluster, prec, shard, isl, tokens), alone,
                              overhead, ranks)
    if max_batched_tokens is None:
        return whole
    # Prompts longer than the budget arrive as ceil(isl/M) chunk steps each: k·chunks of them a decode step.
    isl = np.asarray(isl, dtype=float)
    chunks = np.ceil(isl / np.asarray(budget, dtype=float))
    chunk = prefill_chunk_s(model, cluster, prec, shard, isl, isl / chunks) + overhead
    per_step = np.asarray(prompts_per_step, dtype=float) * chunks
    busiest = np.floor(per_step) + busiest_admission_frac(per_step - np.floor(per_step), ranks)
    return np.where(chunks > 1.0, busiest * chunk, whole)


def admission_ranks(engine: EngineTraits, shard: Sharding) -> np.ndarray:
    """Attention-DP ranks whose admissions one step waits for: every rank (``mixed_admission_s``), or one where the
    engine balances them (``EngineTraits.balances_dp_admission``: TRT-LLM's attention_dp_config.enable_balance)."""
    return np.asarray(1.0 + 0.0 * shard.dp if engine.balances_dp_admission else shard.dp, dtype=float)


def rank_batched_tokens(engine: EngineTraits, shard: Sharding) -> np.ndarray:
    """Tokens one attention-DP rank's step may carry at the engine's ``max_batched_tokens``: the worker's budget over
    its dp ranks where the engine splits it (``EngineTraits.batched_tokens_per_worker``: SGLang's 8192 gives 113
    tokens a rank at dp 72), else the budget itself."""
    budget = float(engine.max_batched_tokens) + 0.0 * shard.dp
    return np.maximum(np.floor(budget / shard.dp), 1.0) if engine.batched_tokens_per_worker else budget


def chunked_prefill_s(model: ModelSpec, cluster: ClusterSpec, prec: WeightPrecision, shard: Sharding, isl: Column,
                      max_batched_tokens: Column, step_overhead_s: Column) -> np.ndarray:
    """Seconds of one prompt's prefill alone in steps of at most ``max_batched_tokens`` tokens: ceil(isl/M) chunks,
    each reading the weights and paying the step overhead once (``prefill_chunk_s``); within one chunk,
    ``prefill_s`` plus one overhead."""
    isl, budget = np.broadcast_arrays(np.asarray(isl, dtype=float), np.asarray(max_batched_tokens, dtype=float))
    chunks = np.ceil(isl / budget)
    rest = isl - (chunks - 1.0) * budget
    full_s, rest_s = prefill_chunk_s(model, cluster, prec, shard, isl, np.stack([budget, rest]))
    whole = prefill_s(model, cluster, prec, shard, isl) + step_overhead_s
    return np.where(chunks <= 1.0, whole, (chunks - 1.0) * (full_s + step_overhead_s) + rest_s + step_overhead_s)


def burst_prefill_s(model: ModelSpec, cluster: ClusterSpec, engine: EngineTraits, prec: WeightPrecision,
                    shard: Sharding, isl: Column, arrivals: Column,
                    max_batched_tokens: Column | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(mean time to first token, seconds until the last prefill ends) of ``arrivals`` prompts that reach an
    attention-DP rank at once: the engine prefills as many as fit its max batched tokens per step, step after
    step; the k-th step's prompts wait k steps. ``max_batched_tokens``: a rank's budget where it is not the
    engine's (``rank_batched_tokens``); below one prompt a step, each step carries that many tokens, and the j-th
    prompt's first token comes with the step that ends it, (j + 1)·isl/M steps in: a mean of (steps + isl/M)/2
    steps."""
    isl = np.asarray(isl, dtype=float)
    budget = np.asarray(engine.max_batched_tokens if max_batched_tokens is None else max_batched_tokens, dtype=float)
    per_step = np.where(budget >= isl, np.maximum(np.floor(budget / isl), 1.0), budget / isl)
    per_step = np.minimum(per_step, np.maximum(arrivals, 1.0))
    step = prefill_s(model, cluster, prec, shard, isl, per_step, all_ranks=True) \
        + engine_step_overhead_s(engine, shard)
    steps = np.ceil(np.maximum(arrivals, 1.0) / per_step - 1e-9)
    return step * (steps + np.maximum(1.0 / per_step, 1.0)) / 2.0, step * steps


def burst_ttft_s(model: ModelSpec, cluster: ClusterSpec, engine: EngineTraits, prec: WeightPrecision, shard: Sharding,
                 isl: Column, arrivals: Column, max_batched_tokens: Column | None = None) -> np.ndarray:
    """Mean time to first token of ``arrivals`` prompts that reach an attention-DP rank at once
    (``burst_prefill_s``)."""
    return burst_prefill_s(model, cluster, engine, prec, shard, isl, arrivals, max_batched_tokens)[0]


def burst_tpot_s(decode_step_s: Column, ttft_s: Column, wave_prefill_s: Column, osl: Column) -> np.ndarray:
    """Mean time per output token of a burst of prompts (``burst_prefill_s``: mean TTFT ``ttft_s``, the last prefill
    ending ``wave_prefill_s`` in). A prompt whose first token came at t still shares the GPU with the wave's
    prefills that follow, wave_prefill_s − t of them, spread over its osl − 1 later tokens: on average
    (wave_prefill_s − ttft_s) / (osl − 1) on top of the decode step, whether the engine runs them before its next
    decode step (``EngineTraits.prefill_first``) or mixes them into its decode steps."""
    later_tokens = np.maximum(np.asarray(osl, dtype=float) - 1.0, 1.0)
    wait = np.maximum(np.asarray(wave_prefill_s, dtype=float) - np.asarray(ttft_s, dtype=float), 0.0)
    return np.asarray(decode_step_s, dtype=float) + wait / later_tokens


def benchmark_waves(engine: EngineTraits, waves: Column, fixed_lengths: Column = False) -> np.ndarray:
    """Wave weight of a fixed-concurrency benchmark of ``waves`` waves for ``ServingLatency``: each mean is the
    steady state's plus 1/weight of the first wave's (a burst) excess; 1 where every wave runs as the first. That
    happens where every request has exactly the stated lengths (``fixed_lengths``: no length spread,
    end-of-sequence ignored) and the engine is prefill-first (``EngineTraits.prefill_first``): it decodes a wave
    only once all of it is prefilled, so the wave's requests finish in the same step and the closed loop sends them
    back together, a burst again. An engine that mixes prefill chunks into decode steps starts each prompt's decode
    as soon as it is prefilled, and aiconfigurator's fixed-length sweeps of vLLM and TensorRT-LLM match the steady
    state (a burst every wave puts their TTFT 222% and 118% too slow: docs/serving.md)."""
    synchronized = np.asarray(fixed_lengths, dtype=bool) & engine.prefill_first
    return np.where(synchronized, 1.0, np.asarray(waves, dtype=float))


def decode_step_s(model: ModelSpec, cluster: ClusterSpec, prec: WeightPrecision, shard: Sharding, batch: Column,
                  context_tokens: Column, tokens_per_sequence: float = 1.0) -> np.ndarray:
    """Seconds of one decode step of ``batch`` sequences per attention-DP rank at ``context_tokens`` each, each
    sequence running ``tokens_per_sequence`` tokens (a speculative verify pass: N + 1). A verify pass reads each
    sequence's KV cache once (the N + 1 queries share it; their extra attention FLOPs are not counted)."""
    b = np.asarray(batch, dtype=float)
    ctx = np.asarray(context_tokens, dtype=float)
    window = np.minimum(ctx, model.sliding_window) if model.sliding_window else ctx
    tokens = b if tokens_per_sequence == 1.0 else b * tokens_per_sequence
    return step_time(model, cluster, prec, shard, tokens_per_rank=tokens, sequences_per_rank=b,
                     attended_keys=(b * ctx, b * window), attention_flops=(0.0, 0.0), decode=True).total_s


def decode_kernels(model: ModelSpec) -> int:
    """Kernels of one decode pass over the model (``inference_step``'s count: 12 a layer, 6 more per MoE layer)."""
    return model.num_layers * KERNELS_PER_LAYER + model.num_moe_layers * MOE_EXTRA_KERNELS


def _draft_s(model: ModelSpec, cluster: ClusterSpec, spec: Speculation, prec: WeightPrecision, shard: Sharding,
             batch: Column, context_tokens: Column) -> tuple[np.ndarray, int]:
    """(seconds, kernels) of drafting one token for ``batch`` sequences: MTP or EAGLE run about one layer of the
    target (its one-token decode step over its layers); a draft model runs its own decode step."""
    if spec.method == "draft" and spec.draft is not None:
        return (decode_step_s(spec.draft, cluster, _draft_precision(prec), _draft_shard(shard), batch,
                              context_tokens), decode_kernels(spec.draft))
    return (decode_step_s(model, cluster, prec, shard, batch, context_tokens) / model.num_layers,
            KERNELS_PER_LAYER + (MOE_EXTRA_KERNELS if model.is_moe else 0))


def engine_decode_s(model: ModelSpec, cluster: ClusterSpec, engine: EngineTraits, prec: WeightPrecision,
                    shard: Sharding, batch: Column, context_tokens: Column) -> np.ndarray:
    """Seconds per output token of a sequence decoding among ``batch`` per attention-DP rank, the engine's step
    overhead included. With speculation a step is the target's verify pass of N + 1 tokens per sequence plus N
    draft tokens, and emits ``expected_tokens`` per sequence; without CUDA graphs the step takes at least its
    kernels' host launches (``EAGER_KERNEL_LAUNCH_S`` each; the GPU runs behind the host, so the larger wins)."""
    spec = engine.speculation
    drafted = 0 if spec is None else spec.num_tokens
    step = decode_step_s(model, cluster, prec, shard, batch, context_tokens, tokens_per_sequence=drafted + 1.0)
    kernels = decode_kernels(model)
    if spec is not None:
        draft_s, draft_kernels = _draft_s(model, cluster, spec, prec, shard, batch, context_tokens)
        step, kernels = step + drafted * draft_s, kernels + drafted * draft_kernels
    if not engine.cuda_graphs:
        step = np.maximum(step, kernels * EAGER_KERNEL_LAUNCH_S)
    step = step + engine_step_overhead_s(engine, shard)
    return step if spec is None else step / spec.expected_tokens


RAISED_MEMORY_FRAC = 0.95
"""Where an engine's default memory fraction leaves no KV pool, a deployment that runs anyway was started with
the fraction raised; priced as 0.95 of the memory free after weights, activations and the CUDA context."""


def running_capacity(model: ModelSpec, cluster: ClusterSpec, engine: EngineTraits, prec: WeightPrecision,
                     shard: Sharding, sequence_tokens: Column) -> tuple[np.ndarray, np.ndarray]:
    """(sequences of full length that fit per attention-DP rank, whether the engine starts at its defaults).
    Where it does not, the capacity with the memory fraction raised (``RAISED_MEMORY_FRAC``)."""
    default = engine_memory(model, cluster, engine, prec, shard, sequence_tokens).max_sequences
    raised = engine if engine.memory_frac_set else replace(engine, budget="free", memory_frac=RAISED_MEMORY_FRAC)
    fits_raised = engine_memory(model, cluster, raised, prec, shard, sequence_tokens).max_sequences
    starts = default >= 1.0
    return np.where(starts, default, fits_raised), starts


def held_tokens(engine: EngineTraits, isl: Column, osl: Column) -> np.ndarray:
    """KV tokens one running sequence holds for admission: its whole length where the engine reserves it,
    else its mean over its life (isl + osl/2)."""
    isl, osl = np.asarray(isl, dtype=float), np.asarray(osl, dtype=float)
    return isl + osl if engine.reserves_full_length else isl + osl / 2.0


BENCHMARK_WAVES = 20.0
"""Default number of request waves a fixed-concurrency benchmark runs (requests sent / concurrency); the
first wave arrives at once and is prefilled before it decodes. A benchmark-protocol input of
``aggregated``/``disaggregated``: inf gives the pure steady state. validation/serving_runs.py fits it (one global
constant) to the measured TTFTs and TPOTs of the rows whose benchmark does not state it (InferenceX's state 10): 20
since the first-token steps were priced (8 from 2026-11-28, 5 before SGLang's scheduler receive interval was priced)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingLatency:
    """Steady state of a fixed-concurrency benchmark (seconds; arrays, one entry a deployment)."""

    ttft_steady_s: np.ndarray
    """Time to first token once requests arrive spread out: own prefill, half a step, the wait for a slot."""
    ttft_burst_s: np.ndarray
    """Mean time to first token of the first wave, whose requests all arrive at once and prefill in turn."""
    tpot_steady_s: np.ndarray
    """Time per output token once requests arrive spread out: every token carries its share of the prefills
    mixed into the decode steps."""
    tpot_burst_s: np.ndarray
    """Time per output token of the first wave, prefilled together before decoding: the decode step alone."""
    running_batch: np.ndarray
    """Sequences decoding together on one attention-DP rank."""
    decode_step_s: np.ndarray
    """One decode step at that batch, without mixed-in prefills."""
    prefill_s: np.ndarray
    """One prompt's prefill alone."""
    max_sequences: np.ndarray
    """Largest batch the KV pool holds at full length (per attention-DP rank)."""
    starts_at_defaults: np.ndarray
    """Whether the engine starts with its default memory fraction (else priced with it raised)."""
    request_overhead_s: float
    """The engine's per-request latency outside the GPU (added to every TTFT)."""
    waves: np.ndarray
    """Wave weight of the benchmark per deployment (``benchmark_waves``): the first wave's burst weighs 1/waves."""

    @property
    def tpot_s(self) -> np.ndarray:
        """Mean time per output token over all waves (``wave_mean``)."""
        return wave_mean(self.tpot_steady_s, self.tpot_burst_s, self.waves)

    @property
    def ttft_s(self) -> np.ndarray:
        """Mean time to first token over all waves (``wave_mean``), the engine's request overhead included."""
        return self.request_overhead_s + wave_mean(self.ttft_steady_s, self.ttft_burst_s, self.waves)


def wave_mean(steady: Column, burst: Column, waves: Column) -> np.ndarray:
    """The mean over a benchmark's ``waves`` waves when the first runs as a burst and the rest steady (waves 1:
    every wave a burst; inf: the steady state)."""
    steady = np.asarray(steady, dtype=float)
    return steady + (np.asarray(burst, dtype=float) - steady) / np.asarray(waves, dtype=float)


def aggregated(model: ModelSpec, cluster: ClusterSpec, engine: EngineTraits, prec: WeightPrecision, shard: Sharding,
               *, concurrency: Column, isl: Column, osl: Column, waves: float = BENCHMARK_WAVES,
               max_batched_tokens: Column | None = None, fixed_lengths: Column = False) -> ServingLatency:
    """Prefill and decode on the same GPUs (continuous batching), ``concurrency`` requests in flight per replica.
    ``max_batched_tokens``: each rank's step budget where it is not the engine's (``rank_batched_tokens``); a
    prompt longer than it takes one mixed step per chunk before its first token. ``fixed_lengths``: every request
    has exactly ``isl`` and ``osl`` tokens (``benchmark_waves``: a prefill-first engine then runs every wave as a
    burst)."""
    isl, osl = np.asarray(isl, dtype=float), np.asarray(osl, dtype=float)
    per_rank = np.asarray(concurrency, dtype=float) / shard.dp
    fits, starts = running_capacity(model, cluster, engine, prec, shard, held_tokens(engine, isl, osl))
    fits, starts, _ = np.broadcast_arrays(fits, starts, per_rank)  # one entry per deployment
    batch = np.maximum(np.minimum(np.minimum(per_rank, fits), engine.max_running), 1.0)
    step = engine_decode_s(model, cluster, engine, prec, shard, batch, isl + osl / 2.0)
    overhead = engine_step_overhead_s(engine, shard)
    if max_batched_tokens is None:
        prefill, chunk_steps = prefill_s(model, cluster, prec, shard, isl) + overhead, 0.0
    else:
        prefill = chunked_prefill_s(model, cluster, prec, shard, isl, max_batched_tokens, overhead)
        chunk_steps = np.maximum(np.ceil(isl / np.asarray(max_batched_tokens, dtype=float)) - 1.0, 0.0)
    ranks = admission_ranks(engine, shard)  # whose admissions a step waits for
    tpot = step + mixed_prefill_s(model, cluster, engine, prec, shard, isl, batch / osl, ranks=ranks,
                                  max_batched_tokens=max_batched_tokens)
    lifetime = osl * tpot + prefill
    queued = np.maximum(per_rank - batch, 0.0) / batch * lifetime
    # The scheduler reads new requests every N decode steps: an arrival waits (N − 1)/2 of them on average beyond the
    # half step every arrival waits (scheduler_recv_interval).
    unread = (engine.scheduler_recv_interval - 1) / 2.0 * step
    # The request's hops through the engine's processes each wait on its iteration cadence (first_token_steps).
    hops = engine.first_token_steps * tpot
    steady = prefill + chunk_steps * step + tpot / 2.0 + unread + queued + hops
    burst, wave = burst_prefill_s(model, cluster, engine, prec, shard, isl, batch, max_batched_tokens)
    return ServingLatency(ttft_steady_s=steady, ttft_burst_s=burst + queued + hops, tpot_steady_s=tpot,
                          tpot_burst_s=burst_tpot_s(step, burst, wave, osl), running_batch=batch,
                          decode_step_s=step, prefill_s=prefill, max_sequences=fits, starts_at_defaults=starts,
                          request_overhead_s=engine.request_overhead_s,
                          waves=benchmark_waves(engine, waves, fixed_lengths))


def kv_transfer_s(model: ModelSpec, cluster: ClusterSpec, prec: WeightPrecision, prefill: Sharding,
                  isl: Column) -> np.ndarray:
    """Seconds to move one prompt's KV cache from a prefill worker to a decode worker: the prefill GPUs send
    their shards in parallel over the scale-out NICs (NVLink inside one NVLink domain is faster; the NIC
    bounds the general case)."""
    per_gpu = kv_bytes_per_sequence(model, prefill.tp, isl, prec.kv_bytes) / prefill.pp
    bandwidth = cluster.nic_bytes_per_s_per_gpu * cluster.gpu.efficiency.nic_frac
    return per_gpu / bandwidth + cluster.inter_node_latency_s


def disaggregated(model: ModelSpec, cluster: ClusterSpec, engine: EngineTraits, prec: WeightPrecision,
                  prefill: Sharding, decode: Sharding, *, concurrency: Column, prefill_workers: Column,
                  decode_workers: Column, isl: Column, osl: Column,
                  waves: float = BENCHMARK_WAVES) -> ServingLatency:
    """Prefill workers hand each prompt's KV cache to decode workers; ``concurrency`` requests in flight in all."""
    isl, osl = np.asarray(isl, dtype=float), np.asarray(osl, dtype=float)
    concurrency = np.asarray(concurrency, dtype=float)
    per_rank = concurrency / (np.asarray(decode_workers, dtype=float) * decode.dp)
    fits, starts = running_capacity(model, cluster, engine, prec, decode, held_tokens(engine, isl, osl))
    fits, starts, _ = np.broadcast_arrays(fits, starts, per_rank)  # one entry per deployment
    batch = np.maximum(np.minimum(np.minimum(per_rank, fits), engine.max_running), 1.0)
    step = engine_decode_s(model, cluster, engine, prec, decode, batch, isl + osl / 2.0)
    one = prefill_s(model, cluster, prec, prefill, isl) + engine_step_overhead_s(engine, prefill)
    lifetime = osl * step
    # Prefill pool: requests arrive at concurrency / lifetime; each prefill rank serves one at a time (M/D/1).
    servers = np.asarray(prefill_workers, dtype=float) * prefill.dp
    utilisation = np.minimum(concurrency / np.maximum(lifetime, 1e-9) * one / servers, 0.95)
    wait = utilisation * one / (2.0 * (1.0 - utilisation))
    queued = np.maximum(per_rank - batch, 0.0) / batch * lifetime
    transfer = kv_transfer_s(model, cluster, prec, prefill, isl)
    # Closed loop: a prefill pool slower than the decode pool's demand holds the rest of the concurrency in its
    # queue; by Little's law (concurrency = served rate x (TTFT + lifetime)) the TTFT is concurrency / capacity
    # minus a request's decode lifetime, wherever that exceeds the open-queue estimate.
    saturated = concurrency * one / servers - lifetime
    hops = engine.first_token_steps * step  # the decode worker's loop, which streams the first token
    steady = np.maximum(one + wait, saturated) + transfer + queued + hops
    burst = burst_ttft_s(model, cluster, engine, prec, prefill, isl, concurrency / servers) + transfer + queued + hops
    return ServingLatency(ttft_steady_s=steady, ttft_burst_s=burst, tpot_steady_s=step, tpot_burst_s=step,
                          running_batch=batch,
                          decode_step_s=step, prefill_s=one, max_sequences=fits, starts_at_defaults=starts,
                          request_overhead_s=engine.request_overhead_s, waves=np.asarray(waves, dtype=float))
