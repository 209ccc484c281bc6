"""Time of one inference step (a prefill chunk or a decode step) on one GPU, vectorized over deployments.

A step runs every layer once over the step's tokens. Each weight GEMM costs the larger of its FLOPs at
the GPU's rate (``compute.analytical_rates``: the datasheet peak of the GEMM dtype times the calibrated
fraction, times the shape saturation m/(m + d½) in the token dimension) and its weight bytes at the
achieved HBM bandwidth: the roofline of docs/cost-model.md. Decode (few tokens) is weight- and KV-bound;
prefill (thousands of tokens) is compute-bound. Mixture-of-Experts layers read only the experts the
step's routed tokens hit: with c routed copies spread uniformly over E experts, a GPU holding E/ep of
them reads E/ep · (1 − (1 − 1/E)^c) experts. Attention reads every sequence's KV cache (decode) or
computes causal attention over the prompt (prefill). Tensor parallelism adds two all-reduces per layer
(``collectives.collective_time_s``: latency-bound at decode sizes); attention data parallelism gathers
the tokens of all DP ranks before the MoE layer and scatters them back after it, or with expert parallelism
dispatches and combines each token's top-k copies in an all-to-all. A step waits for its busiest rank: the
attention-DP rank with ceil(B) of a mean B sequences, the expert-parallel rank with the most routed copies.
Prompts admitted together prefill as one chunk (``admitted_prefill_s``).

Sharding (the names the serving engines use): ``tp`` shards attention (and dense MLPs) over tp GPUs;
``dp`` attention-data-parallel ranks each run their own sequences; the MoE layers spread over the
tp·dp GPUs as ``moe_tp`` (each expert's width split) × ``moe_ep`` (experts split).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from paraplan.arrays import Column
from paraplan.choices import Precision
from paraplan.cost_models import serving_kernels as tables
from paraplan.cost_models.collectives import all_to_all_time_s, collective_time_s
from paraplan.cost_models.compute import ComputeRates, analytical_rates
from paraplan.errors import InputError
from paraplan.hardware_profiles import ClusterSpec
from paraplan.hardware_profiles.run_factor import gpu_at_scale
from paraplan.model_specs.mixers import unpriced_for_serving
from paraplan.model_specs.model_spec import ModelSpec

ACTIVATION_BYTES = 2.0
"""Activations, all-reduced partial sums and the 16-bit parts of a checkpoint: bf16."""
ELEMENTWISE_BYTES_PER_HIDDEN = 24.0
"""HBM bytes per token per hidden element per layer outside the GEMMs: two fused norm+residual kernels
(read 2 B x + 2 B residual, write 2 B each), rotary and the MLP activation (about 12 reads/writes of
16-bit values)."""
KERNELS_PER_LAYER = 12
"""Kernels of one decoder layer in an inference engine with fused norms: norm, QKV, rotary/cache write,
attention, output projection, all-reduce, norm, gate+up, activation, down, all-reduce, residual."""
MOE_EXTRA_KERNELS = 6
"""An MoE layer adds router GEMM, top-k, permute, the grouped up and down GEMMs' second launches, unpermute."""
INDEXER_DECODE_FLOOR_S = 30e-6
"""Seconds a DSA indexer (GLM-5, DeepSeek-V3.2) adds to each layer of a decode step before its scan of the cached
keys counts: its few small kernels (index-query and key projections, key norm, rotary, fp8 quantization, the paged
MQA logits, top-k) run at their launch floors at decode sizes. Measured as the difference between SGLang 0.5.14's DSA
generation module with and without the indexer (aiconfigurator 0.12.0's sparse_attention tables, GLM-5.2 against
GLM-5 and DeepSeek-V3.2 at batch 4, 1,024 cached tokens, attention tp 8): 30-34 us on B200, B300, GB200 and GB300,
25-34 us on H100 and H200. Beyond it the scan is priced by its bytes and FLOPs (``_decode_attention_parts_s``)."""
GRAPH_KERNEL_OVERHEAD_S = 1.5e-6
"""Per-kernel gap inside a CUDA graph (no CPU launch, only the GPU's kernel drain and start): 1-2 us on
Hopper/Blackwell (NVIDIA's CUDA Graphs posts measure ~2 us per node for short kernels); used for decode
steps, which every engine here replays as CUDA graphs. Prefill steps are launched eagerly at the GPU's
``kernel_overhead_s`` (efficiency.yaml)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightPrecision:
    """How the deployed weights and KV cache are stored and which GEMM kernels they run."""

    dense_dtype: Precision
    """Compute dtype of the attention and dense-MLP GEMMs: bf16, fp8 or fp4 (weight-only int4 runs bf16)."""
    dense_bytes: float
    """Bytes per attention/dense-MLP weight, block scales included (fp8 1.0, nvfp4 0.5625, bf16 2.0)."""
    expert_dtype: Precision
    """Compute dtype of the routed-expert GEMMs."""
    expert_bytes: float
    """Bytes per routed-expert weight, scales included."""
    attention_bytes: float
    """Bytes per attention weight (checkpoints often keep attention in 16-bit while quantizing the MLPs)."""
    kv_bytes: float
    """Bytes per cached K/V (or MLA latent) element: 2 for bf16, 1 for fp8."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Sharding:
    """How one model replica is split over GPUs; arrays broadcast against each other (one entry a deployment)."""

    tp: np.ndarray
    """Attention tensor-parallel degree (also shards dense MLPs, the shared expert and the output head)."""
    dp: np.ndarray
    """Attention data-parallel ranks per replica; the replica spans tp·dp GPUs (times pp)."""
    moe_tp: np.ndarray
    """Tensor parallel degree inside each routed expert (moe_tp·moe_ep = tp·dp for MoE models)."""
    moe_ep: np.ndarray
    """Expert-parallel degree: the routed experts split over moe_ep groups."""
    pp: np.ndarray
    """Pipeline stages (each holds num_layers/pp layers)."""

    @staticmethod
    def of(tp: Column, dp: Column = 1, moe_tp: Column | None = None, moe_ep: Column = 1, pp: Column = 1) -> Sharding:
        """A sharding from scalars or arrays; ``moe_tp`` defaults to tp·dp/moe_ep."""
        tp, dp, moe_ep, pp = (np.asarray(v, dtype=float) for v in (tp, dp, moe_ep, pp))
        moe_tp = tp * dp / moe_ep if moe_tp is None else np.asarray(moe_tp, dtype=float)
        return Sharding(tp=tp, dp=dp, moe_tp=moe_tp, moe_ep=moe_ep, pp=pp)

    @property
    def gpus(self) -> np.ndarray:
        """GPUs of one replica."""
        return self.tp * self.dp * self.pp


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTime:
    """Seconds of one step on the busiest GPU, itemised (arrays, one entry a deployment)."""

    gemm_s: np.ndarray
    """Attention projections, dense MLPs, shared experts, router and output head."""
    experts_s: np.ndarray
    """Routed-expert GEMMs (weights of the experts hit, or their FLOPs)."""
    attention_s: np.ndarray
    """Attention core: KV-cache reads (decode) or causal attention FLOPs (prefill)."""
    elementwise_s: np.ndarray
    """Norms, residuals, rotary, activations: memory-bound."""
    comm_s: np.ndarray
    """TP all-reduces and attention-DP gathers, exposed."""
    overhead_s: np.ndarray
    """Kernel launch gaps."""
    table_s: np.ndarray | float = 0.0
    """Of the seconds above, those measured kernel tables priced (``ClusterSpec.serving_kernels``); 0 without them."""

    @property
    def total_s(self) -> np.ndarray:
        """The step."""
        return self.gemm_s + self.experts_s + self.attention_s + self.elementwise_s + self.comm_s + self.overhead_s


def rates_for(cluster: ClusterSpec, dtype: Precision) -> ComputeRates:
    """The GPU's GEMM rates for ``dtype``. A 4-bit format on a GPU without fp4 tensor cores (Hopper) runs as
    weight-only quantization: 4-bit weights dequantized in the kernel, bf16 math (vLLM's Marlin and MXFP4
    kernels, TRT-LLM's W4A16 path)."""
    try:
        cluster.gpu.peak(dtype)
    except (KeyError, ValueError):
        if dtype != "fp4":
            raise InputError(f"{cluster.gpu.name} has no {dtype} tensor cores; pick another precision") from None
        dtype = "bf16"
    return analytical_rates(gpu_at_scale(cluster.gpu, 1), dtype, "fused")


def _saturation(m: Column, half_dim: float) -> np.ndarray:
    """The GEMM efficiency factor of the token dimension: m / (m + d_half), m floored just above 0."""
    floored = np.maximum(np.asarray(m, dtype=float), 1e-9)
    return floored / (floored + half_dim)


def _roofline_s(flops: Column, weight_bytes: Column, tokens: Column, rates: ComputeRates,
                bytes_per_weight: float) -> np.ndarray:
    """max(FLOPs at the shape-saturated GEMM rate, weight bytes at achieved HBM bandwidth); the saturation's half
    dimension as ``weight_only_half_dim`` gives it for ``bytes_per_weight``."""
    half = weight_only_half_dim(rates, bytes_per_weight)
    compute = np.asarray(flops, dtype=float) / (rates.gemm_flops_per_s * _saturation(tokens, half))
    return np.maximum(compute, np.asarray(weight_bytes, dtype=float) / rates.memory_bytes_per_s)


def weight_only_half_dim(rates: ComputeRates, bytes_per_weight: float) -> float:
    """The GEMM's half-saturation token count for weights stored in ``bytes_per_weight`` bytes. The calibrated half
    dimension (efficiency.yaml) was fitted to GEMMs whose weights have the math dtype's width, where small-m
    GEMMs are bound by their weight reads: a token count m reaches the ridge where 2·m FLOPs per weight equal
    peak/bandwidth times the bytes per weight. fp8 and fp4 tensor-core GEMMs keep that ridge (half the bytes, twice
    the peak). Weight-only quantization (4-bit weights dequantized into bf16 math: int4_wo anywhere, mxfp4 and
    nvfp4 on Hopper) reads bytes_per_weight/2 of bf16's bytes at bf16's peak, so its ridge, and the half
    dimension with it, sits at that fraction: 0.53/2 of bf16's for mxfp4 (gpt-oss's experts on H100/H200).
    Never above the calibrated value."""
    return rates.gemm_half_dim * min(1.0, bytes_per_weight / rates.gemm_element_bytes)


def attention_params_per_gpu(model: ModelSpec, tp: Column) -> np.ndarray:
    """Attention weights one GPU holds: projections split over tp, except MLA's down projections and a sparse-
    attention indexer (replicated) and K/V heads, replicated once tp exceeds the KV heads."""
    tp = np.asarray(tp, dtype=float)
    h = model.hidden_size
    if model.is_mla:
        down = h * (model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim)
        return down + model.indexer_params + (model.attention_weight_params() - down) / tp
    q_and_out = h * model.q_width * (2 + model.attention_output_gate)
    kv = 2 * h * model.head_dim * np.maximum(model.num_kv_heads / tp, 1.0)
    return q_and_out / tp + kv + model.indexer_params


def _dense_layer_params(model: ModelSpec, moe_layer: bool, tp: Column) -> tuple[np.ndarray, np.ndarray]:
    """(attention, MLP) weights of one layer outside the routed experts that one GPU reads: the attention, and
    the dense MLP or the shared expert and router."""
    mlp = model.shared_expert_params() + model.router_params() if moe_layer else model.mlp_params()
    return attention_params_per_gpu(model, tp), mlp / np.asarray(tp, dtype=float)


def kv_bytes_per_token_per_layer(model: ModelSpec, tp: Column, kv_bytes: float) -> np.ndarray:
    """KV-cache bytes one GPU stores per token per softmax-attention layer: K and V of its KV heads (replicated
    once tp exceeds them), or MLA's latent plus rotary key, which every attention-TP rank holds whole."""
    tp = np.asarray(tp, dtype=float)
    if model.is_mla:
        return np.broadcast_to(float((model.kv_lora_rank + model.qk_rope_head_dim) * kv_bytes), tp.shape).copy()
    return 2.0 * model.head_dim * np.maximum(model.num_kv_heads / tp, 1.0) * kv_bytes


def decode_attention_flops_per_key(model: ModelSpec, tp: Column) -> np.ndarray:
    """Attention-core FLOPs one GPU spends per cached key per layer for one decoding query: QKᵀ and AV over
    its heads (4·heads·d_head), or under MLA with the up projections absorbed, against the latent and rotary
    key (2·heads·(2·kv_lora + d_rope))."""
    heads = model.num_heads / np.asarray(tp, dtype=float)
    if model.is_mla:
        return 2.0 * heads * (2 * model.kv_lora_rank + model.qk_rope_head_dim)
    return 2.0 * heads * (model.qk_head_dim + model.value_head_dim)


def prefill_attention_flops(model: ModelSpec, prompt_tokens: Column) -> tuple[np.ndarray, np.ndarray]:
    """Causal attention-core FLOPs of one prompt per layer over all heads, (full layers, sliding layers):
    2·keys·heads·(d_qk + d_v) with keys = s²/2 causal, or s·w − w²/2 inside a window w; with a sparse-attention
    indexer (``model.mixers``), s·k − k²/2 keys (each query attends to at most top-k) plus the indexer's s²/2
    scored pairs."""
    mixers = model.mixers
    s = np.asarray(prompt_tokens, dtype=float)
    per_key = 2.0 * model.num_heads * (model.qk_head_dim + model.value_head_dim)
    w = np.minimum(s, model.sliding_window) if model.sliding_window else s
    full = per_key * s * s / 2.0
    if mixers.index_topk:
        k = np.minimum(s, mixers.index_topk)
        full = per_key * (s * k - k * k / 2.0) + mixers.index_flops_per_key * s * s / 2.0
    return full, per_key * (s * w - w * w / 2.0)


def _layer_counts(model: ModelSpec) -> tuple[int, int, int, int, int]:
    """(dense, MoE, full-attention, sliding-window, linear-attention) layer counts of the main stack."""
    reason = unpriced_for_serving(model)
    if reason:
        raise InputError(reason)
    sliding = model.sliding_layers if model.sliding_window else 0
    linear = model.linear_attention_layers
    return model.num_dense_layers, model.num_moe_layers, model.num_layers - sliding - linear, sliding, linear


def tp_all_reduce_s(model: ModelSpec, tokens_per_rank: Column, shard: Sharding, cluster: ClusterSpec) -> np.ndarray:
    """One all-reduce of the 16-bit hidden states of ``tokens_per_rank`` tokens over the tp GPUs (analytical)."""
    size = np.asarray(tokens_per_rank, dtype=float) * model.hidden_size * ACTIVATION_BYTES
    return collective_time_s("all_reduce", size, shard.tp, 1, cluster)


def _comm_per_layer_s(model: ModelSpec, all_reduce_s: np.ndarray, moe_tokens: Column, shard: Sharding,
                      cluster: ClusterSpec, moe_layer: bool) -> np.ndarray:
    """Exposed collective seconds of one layer: the attention output all-reduce over tp (``all_reduce_s``), then
    the MLP's: an all-reduce over tp; with attention DP an all-gather and reduce-scatter of the ``moe_tokens`` all
    DP ranks send to the MoE group, or with expert parallelism too the dispatch and combine all-to-all
    (:func:`expert_dispatch_s`)."""
    attention = all_reduce_s
    if not moe_layer:
        return 2.0 * attention
    world = shard.tp * shard.dp
    gathered = np.asarray(moe_tokens, dtype=float) * model.hidden_size * ACTIVATION_BYTES
    dp_path = collective_time_s("all_gather", gathered, world, 1, cluster) \
        + collective_time_s("reduce_scatter", gathered, world, 1, cluster)
    dp_path = np.where(shard.moe_ep > 1, expert_dispatch_s(model, moe_tokens, shard, cluster), dp_path)
    return attention + np.where(shard.dp > 1, dp_path, attention)


def expert_dispatch_s(model: ModelSpec, moe_tokens: Column, shard: Sharding, cluster: ClusterSpec) -> np.ndarray:
    """Seconds of one MoE layer's dispatch and combine all-to-all under attention DP with expert parallelism:
    each of the tp·dp GPUs sends its share of the ``moe_tokens`` (moe_tokens/(tp·dp) tokens), each token as
    top-k copies of hidden 16-bit values, every copy to the moe_tp GPUs that hold its expert's width, and gets
    as many back (``collectives.all_to_all_time_s``: of each GPU's bytes (k − 1)/n go over NVLink to the peers
    of its domain and (n − k)/n over its own NIC, concurrently; ``collective_time_s`` would price the NIC part
    as a hierarchical reduction's size/k, which an all-to-all cannot aggregate). Engines run these
    all-to-alls only with attention DP (vLLM's FusedMoEParallelConfig enables all2all kernels for dp > 1 with
    EP; SGLang's DeepEP and TRT-LLM's alltoall likewise serve attention-DP ranks); with dp = 1 the tp ranks hold
    every token and an all-reduce combines the experts' partial outputs (``_comm_per_layer_s``)."""
    world = shard.tp * shard.dp
    per_gpu = np.asarray(moe_tokens, dtype=float) / world * model.experts_per_token * shard.moe_tp \
        * model.hidden_size * ACTIVATION_BYTES
    return 2.0 * all_to_all_time_s(per_gpu, world, 1, cluster)


def busiest_expert_rank_copies(copies: Column, ep: Column) -> np.ndarray:
    """Expected routed copies on the busiest of ``ep`` expert-parallel ranks when ``copies`` token copies are
    routed uniformly over experts split evenly among them: a rank's load is Binomial(c, 1/ep), mean μ = c/ep,
    variance μ(1 − 1/ep), and the maximum of ep such loads is μ + sqrt(2·ln(ep)·μ·(1 − 1/ep)) (the balls-into-
    bins maximum for c ≫ ep·ln ep, Raab & Steger 1998, "Balls into bins — a simple and tight analysis", Thm 1;
    the Gaussian extreme-value sqrt(2 ln n) law), at most all c copies. Exactly μ at ep = 1. Real routers are
    skewed beyond uniform (hot experts), which this leaves out: a lower bound on the imbalance."""
    c = np.asarray(copies, dtype=float)
    ep = np.asarray(ep, dtype=float)
    mean = c / ep
    spread = np.sqrt(2.0 * np.log(np.maximum(ep, 1.0)) * mean * (1.0 - 1.0 / ep))
    return np.minimum(mean + spread, c)


def _experts_s(model: ModelSpec, moe_tokens: Column, shard: Sharding, prec: WeightPrecision,
               rates: ComputeRates) -> np.ndarray:
    """Routed-expert seconds of one MoE layer on the busiest expert-parallel GPU: the experts its share of the
    routed copies of the MoE group's ``moe_tokens`` hits (``busiest_expert_rank_copies``), at the grouped GEMM's
    saturation in tokens per expert."""
    copies = np.asarray(moe_tokens, dtype=float) * model.experts_per_token
    local = model.num_experts / shard.moe_ep
    copies_here = busiest_expert_rank_copies(copies, shard.moe_ep)
    # Each of its copies lands on one of its local experts; (1 − 1/E)^(ep·copies_here) is today's miss chance
    # (1 − 1/E)^c when the rank gets its mean share.
    hit = local * (1.0 - (1.0 - 1.0 / model.num_experts) ** (copies_here * shard.moe_ep))
    width = model.expert_ffn_size / shard.moe_tp
    expert_weights = model.mlp_matrices * model.hidden_size * width
    per_expert = copies_here / np.maximum(hit, 1e-9)
    half = weight_only_half_dim(rates, prec.expert_bytes)
    compute = 2.0 * copies_here * expert_weights / (rates.gemm_flops_per_s * _saturation(per_expert, half))
    return np.maximum(compute, hit * expert_weights * prec.expert_bytes / rates.memory_bytes_per_s)


def _decode_attention_s(model: ModelSpec, prec: WeightPrecision, shard: Sharding, seqs: np.ndarray,
                        attended_keys: tuple[Column, Column], rates: ComputeRates) -> np.ndarray:
    """Seconds of one decode step's attention on one GPU, all layers: the attended keys' KV-cache reads or their
    FLOPs, whichever is slower (``attended_keys``: full-attention and sliding-window keys per layer, summed over
    the ``seqs`` sequences); a sparse-attention indexer scanning every cached key; linear-attention layers
    reading and writing their state (the shapes of both: ``model.mixers``)."""
    full, rest = _decode_attention_parts_s(model, prec, shard, seqs, attended_keys, rates)
    return full + rest


def _decode_attention_parts_s(model: ModelSpec, prec: WeightPrecision, shard: Sharding, seqs: np.ndarray,
                              attended_keys: tuple[Column, Column],
                              rates: ComputeRates) -> tuple[np.ndarray, np.ndarray]:
    """(the full-attention layers' attended keys, everything else) of ``_decode_attention_s``: each key's time is the
    larger of its KV bytes and its FLOPs, the same for every layer, so the sum splits exactly."""
    mixers = model.mixers
    _, _, full_layers, sliding_layers, linear_layers = _layer_counts(model)
    full_keys, sliding_keys = attended_keys
    kv_token = kv_bytes_per_token_per_layer(model, shard.tp, prec.kv_bytes)
    scanned = np.asarray(full_keys, dtype=float)
    attended = np.minimum(scanned, seqs * mixers.index_topk) if mixers.index_topk else scanned
    per_key = np.maximum(kv_token / rates.memory_bytes_per_s,
                         decode_attention_flops_per_key(model, shard.tp) / rates.attention_flops_per_s)
    sliding = sliding_layers * np.asarray(sliding_keys, dtype=float) * per_key
    floor = INDEXER_DECODE_FLOOR_S if mixers.index_topk else 0.0
    indexer = full_layers * (floor + scanned * np.maximum(mixers.index_key_bytes / rates.memory_bytes_per_s,
                                                          mixers.index_flops_per_key / rates.attention_flops_per_s))
    states = linear_layers * seqs * 2.0 * mixers.linear_state_bytes(shard.tp) / rates.memory_bytes_per_s
    return full_layers * attended * per_key, sliding + indexer + states


def _prefill_attention_s(model: ModelSpec, shard: Sharding, tokens: np.ndarray,
                         attention_flops: tuple[Column, Column], rates: ComputeRates) -> np.ndarray:
    """Seconds of one prefill step's attention on one GPU, all layers: the (full, sliding) attention-core FLOPs
    per layer split over tp, and the linear-attention layers' prefill FLOPs of ``tokens``."""
    full, rest = _prefill_attention_parts_s(model, shard, tokens, attention_flops, rates)
    return full + rest


def _prefill_attention_parts_s(model: ModelSpec, shard: Sharding, tokens: np.ndarray,
                               attention_flops: tuple[Column, Column],
                               rates: ComputeRates) -> tuple[np.ndarray, np.ndarray]:
    """(the full-attention layers, everything else) of ``_prefill_attention_s``."""
    _, _, full_layers, sliding_layers, linear_layers = _layer_counts(model)
    full_flops, sliding_flops = attention_flops
    full = full_layers * np.asarray(full_flops, dtype=float) / shard.tp / rates.attention_flops_per_s
    rest = sliding_layers * np.asarray(sliding_flops, dtype=float) / shard.tp / rates.attention_flops_per_s \
        + linear_layers * tokens * model.mixers.linear_prefill_flops_per_token(shard.tp) / rates.attention_flops_per_s
    return full, rest


def _busiest_rank(shard: Sharding, tokens_per_rank: Column, sequences_per_rank: Column,
                  attended_keys: tuple[Column, Column], attention_flops: tuple[Column, Column], decode: bool
                  ) -> tuple[np.ndarray, np.ndarray, tuple[Column, Column], tuple[Column, Column]]:
    """(tokens, sequences, attended keys, attention FLOPs) of the busiest attention-DP rank, whose attention the
    step waits for (the MoE layers synchronise every rank). The engines balance requests over the dp ranks
    (SGLang's dp-attention load_balance_method defaults to round_robin; vLLM's DP front end and TRT-LLM's
    attention-DP scheduler send to the least loaded rank), so taken as a balanced round-robin B·dp sequences put
    ceil(B) on the fullest rank: its work is the mean rank's scaled by ceil(B)/B. Without attention DP (dp = 1)
    the mean is the rank; a prefill step is priced for the rank that runs it."""
    seqs = np.asarray(sequences_per_rank, dtype=float)
    # 1e-9: a B that is whole up to rounding (64/8) stays whole.
    busiest = np.where((shard.dp > 1) & decode, np.maximum(np.ceil(seqs - 1e-9), seqs), seqs)
    scale = busiest / np.maximum(seqs, 1e-12)
    keys = (np.asarray(attended_keys[0]) * scale, np.asarray(attended_keys[1]) * scale)
    flops = (np.asarray(attention_flops[0]) * scale, np.asarray(attention_flops[1]) * scale)
    return np.asarray(tokens_per_rank, dtype=float) * scale, busiest, keys, flops


@dataclass(frozen=True, slots=True, kw_only=True)
class _Terms:
    """Seconds of one step's terms on the busiest GPU, per layer where a layer kind repeats (one entry a deployment)."""

    attention_proj_s: np.ndarray
    """One softmax-attention layer's projections."""
    linear_proj_s: np.ndarray
    """One linear-attention layer's projections."""
    dense_mlp_s: np.ndarray
    """One dense layer's MLP."""
    shared_s: np.ndarray
    """One MoE layer's shared expert and router."""
    head_s: np.ndarray
    """The output head."""
    experts_s: np.ndarray
    """One MoE layer's routed experts."""
    full_attention_s: np.ndarray
    """The attention core of every full-attention layer."""
    other_attention_s: np.ndarray
    """Sliding-window and linear-attention layers' cores and a sparse-attention indexer, all layers."""
    all_reduce_s: np.ndarray
    """One tp all-reduce of the step's hidden states."""


def _analytical_terms(model: ModelSpec, cluster: ClusterSpec, prec: WeightPrecision, shard: Sharding,
                      tokens: np.ndarray, seqs: np.ndarray, moe_tokens: Column, attended_keys: tuple[Column, Column],
                      attention_flops: tuple[Column, Column], decode: bool) -> _Terms:
    """The roofline's terms (module docstring)."""
    dense_rates = rates_for(cluster, prec.dense_dtype)
    attn_params, dense_mlp = _dense_layer_params(model, False, shard.tp)
    _, moe_shared = _dense_layer_params(model, True, shard.tp)
    head = model.vocab_size * model.hidden_size / shard.tp
    linear_params = model.linear_attention_params / shard.tp
    experts = _experts_s(model, moe_tokens, shard, prec, rates_for(cluster, prec.expert_dtype)) \
        if model.num_moe_layers else 0.0 * tokens
    full, rest = _decode_attention_parts_s(model, prec, shard, seqs, attended_keys, dense_rates) if decode \
        else _prefill_attention_parts_s(model, shard, tokens, attention_flops, dense_rates)
    return _Terms(
        attention_proj_s=_roofline_s(2.0 * tokens * attn_params, attn_params * prec.attention_bytes, tokens,
                                     dense_rates, prec.attention_bytes),
        linear_proj_s=_roofline_s(2.0 * tokens * linear_params, linear_params * prec.attention_bytes, tokens,
                                  dense_rates, prec.attention_bytes),
        dense_mlp_s=_roofline_s(2.0 * tokens * dense_mlp, dense_mlp * prec.dense_bytes, tokens, dense_rates,
                                prec.dense_bytes),
        shared_s=_roofline_s(2.0 * tokens * moe_shared, moe_shared * prec.dense_bytes, tokens, dense_rates,
                             prec.dense_bytes),
        head_s=_roofline_s(2.0 * seqs * head, head * ACTIVATION_BYTES, seqs, dense_rates, ACTIVATION_BYTES),
        experts_s=experts, full_attention_s=full, other_attention_s=rest,
        all_reduce_s=tp_all_reduce_s(model, tokens, shard, cluster))


TABLE_KERNELS = {"attention_proj_s": 2, "dense_mlp_s": 2, "shared_s": 3, "head_s": 1, "experts_s": 5,
                 "full_attention_s": 1, "all_reduce_s": 1}
"""Kernels of ``KERNELS_PER_LAYER`` and ``MOE_EXTRA_KERNELS`` one run of each table-priced term stands for: QKV and
output projections; gate+up and down; a shared expert's two and the router GEMM; the head; the fused MoE layer's
grouped up, activation and down GEMMs with its permute and unpermute; one attention kernel per full layer (its
count is in the term); one all-reduce. aiconfigurator times each op as the mean over a CUDA graph of repeated
launches, so a table's seconds hold the kernel's gap inside a graph: a decode step (a CUDA graph) does not add
``GRAPH_KERNEL_OVERHEAD_S`` again for them."""


def _table_terms(terms: _Terms, kernels: tables.ServingKernels, model: ModelSpec, shard: Sharding,
                 tokens: np.ndarray, seqs: np.ndarray, moe_tokens: Column, full_keys: Column,
                 decode: bool) -> tuple[_Terms, np.ndarray, np.ndarray]:
    """``terms`` with each one the serving ``kernels`` tables cover priced from them, the seconds they priced (each
    term times how often the step runs it) and the kernels they stand for (``TABLE_KERNELS``)."""
    dense_layers, moe_layers, full_layers, _, linear_layers = _layer_counts(model)
    attention, attention_ok = tables.decode_attention_s(kernels, model, shard.tp, seqs, full_keys) if decode \
        else tables.prefill_attention_s(kernels, model, shard.tp, seqs, tokens)
    size = tokens * model.hidden_size * ACTIVATION_BYTES
    priced: dict[str, tuple[tuple[np.ndarray, np.ndarray], np.ndarray | float]] = {  # term: ((s, covered), runs)
        "attention_proj_s": (tables.attention_projection_s(kernels, model, tokens, shard.tp),
                             model.num_layers - linear_layers),
        "dense_mlp_s": (tables.mlp_s(kernels.dense_gemm, model, tokens, model.ffn_size, shard.tp), dense_layers),
        "shared_s": (tables.shared_expert_s(kernels, model, tokens, shard.tp), moe_layers),
        "head_s": (tables.gemm_s(kernels.head_gemm, seqs, model.vocab_size / shard.tp, model.hidden_size), 1),
        "experts_s": (tables.experts_s(kernels, moe_tokens, shard.moe_tp, shard.moe_ep), moe_layers),
        "full_attention_s": ((full_layers * attention, attention_ok), 1),
        # Dense layers all-reduce twice; an MoE layer once more where no attention-DP path replaces the second.
        "all_reduce_s": (tables.all_reduce_s(kernels, size, shard.tp),
                         2 * dense_layers + moe_layers * (1.0 + (shard.dp <= 1))),
    }
    changes, table_s, table_kernels = {}, 0.0 * tokens, 0.0 * tokens
    for name, ((seconds, covered), count) in priced.items():
        changes[name] = np.where(covered, seconds, getattr(terms, name))
        table_s = table_s + np.where(covered & (np.asarray(count) > 0), seconds * count, 0.0)
        runs = full_layers if name == "full_attention_s" else count
        table_kernels = table_kernels + np.where(covered, TABLE_KERNELS[name] * runs, 0.0)
    return replace(terms, **changes), table_s, table_kernels


def step_time(model: ModelSpec, cluster: ClusterSpec, prec: WeightPrecision, shard: Sharding, *,
              tokens_per_rank: Column, sequences_per_rank: Column, attended_keys: tuple[Column, Column],
              attention_flops: tuple[Column, Column], decode: bool, moe_tokens: Column | None = None) -> StepTime:
    """One step over every layer on one GPU of every pipeline stage in turn (a token crosses all of them).

    ``tokens_per_rank``: tokens each attention-DP rank runs this step; ``sequences_per_rank``: how many
    sequences they belong to (the output head runs once per sequence); ``attended_keys``: KV-cache entries
    read per layer per rank at decode, as (full-attention keys, sliding-window keys) summed over the rank's
    sequences; ``attention_flops``: (full, sliding) attention-core FLOPs per layer per rank at prefill;
    ``moe_tokens``: tokens the MoE group receives from all attention-DP ranks (default: every rank runs
    ``tokens_per_rank``, all dp ranks' tokens in all). With attention DP a decode step's per-rank work is the
    busiest rank's (``_busiest_rank``: ceil(B) of a mean B sequences). Linear-attention layers and a sparse-
    attention indexer are priced from ``model.mixers``. Where ``cluster.serving_kernels`` holds measured tables of
    the deployment's engine, the terms they cover are priced from them (``_table_terms``).
    """
    moe_tokens = np.asarray(tokens_per_rank, dtype=float) * shard.dp if moe_tokens is None else moe_tokens
    tokens, seqs, attended_keys, attention_flops = _busiest_rank(shard, tokens_per_rank, sequences_per_rank,
                                                                 attended_keys, attention_flops, decode)
    dense_layers, moe_layers, _, _, linear_layers = _layer_counts(model)
    terms = _analytical_terms(model, cluster, prec, shard, tokens, seqs, moe_tokens, attended_keys, attention_flops,
                              decode)
    table_s: np.ndarray | float = 0.0
    table_kernels: np.ndarray | float = 0.0
    if cluster.serving_kernels is not None:
        terms, table_s, table_kernels = _table_terms(terms, cluster.serving_kernels, model, shard, tokens, seqs,
                                                     moe_tokens, attended_keys[0], decode)
    gemm = (model.num_layers - linear_layers) * terms.attention_proj_s + linear_layers * terms.linear_proj_s \
        + dense_layers * terms.dense_mlp_s + moe_layers * terms.shared_s + terms.head_s
    experts = moe_layers * terms.experts_s
    dense_rates = rates_for(cluster, prec.dense_dtype)
    elementwise = model.num_layers * tokens * model.hidden_size * ELEMENTWISE_BYTES_PER_HIDDEN \
        / dense_rates.memory_bytes_per_s
    comm = dense_layers * _comm_per_layer_s(model, terms.all_reduce_s, moe_tokens, shard, cluster, False) \
        + moe_layers * _comm_per_layer_s(model, terms.all_reduce_s, moe_tokens, shard, cluster, True)
    kernels = model.num_layers * KERNELS_PER_LAYER + moe_layers * MOE_EXTRA_KERNELS
    # Eager prefill launches each kernel from the host whether a table priced it or not (tables time CUDA graphs).
    overhead = (kernels - table_kernels) * GRAPH_KERNEL_OVERHEAD_S if decode \
        else kernels * dense_rates.kernel_overhead_s
    overhead = overhead + 0.0 * tokens
    # Pipeline stages: each GPU holds 1/pp of the layers and a token crosses every stage, so the step is the
    # same sum over all layers (pp = 1 in every measured row; pipelined micro-batches are not modelled).
    return StepTime(gemm_s=gemm, experts_s=experts, attention_s=terms.full_attention_s + terms.other_attention_s,
                    elementwise_s=elementwise, comm_s=comm, overhead_s=overhead, table_s=table_s)


def prefill_chunk_tokens(prompts: Column, prompt_tokens: Column, max_batched_tokens: Column) -> np.ndarray:
    """Tokens of the one prefill chunk a step runs for ``prompts`` prompts admitted together: min(k·isl,
    max_batched_tokens), the chunked-prefill budget of vLLM (max_num_batched_tokens), SGLang
    (chunked_prefill_size) and TRT-LLM (max_num_tokens); a longer total spills into the next steps' chunks."""
    total = np.asarray(prompts, dtype=float) * np.asarray(prompt_tokens, dtype=float)
    return np.minimum(total, np.asarray(max_batched_tokens, dtype=float))


def admitted_prefill_s(model: ModelSpec, cluster: ClusterSpec, prec: WeightPrecision, shard: Sharding, *,
                       prompts: Column, prompt_tokens: Column, max_batched_tokens: Column) -> np.ndarray:
    """Seconds one attention-DP rank spends prefilling ``prompts`` prompts of ``prompt_tokens`` admitted
    together: their k·isl tokens run as prefill chunks of ``prefill_chunk_tokens`` beside the decode batch
    (floor(k·isl/M) full chunks of M = ``max_batched_tokens`` tokens, then the remainder), each chunk reading
    every weight and hit expert once, not once per prompt; each chunk carries its token share of the prompts'
    causal attention FLOPs and output-head rows. Without the engine's per-step overhead."""
    k = np.asarray(prompts, dtype=float)
    isl = np.asarray(prompt_tokens, dtype=float)
    total = k * isl
    chunk = prefill_chunk_tokens(k, isl, max_batched_tokens)
    full_chunks = np.floor(total / np.maximum(chunk, 1e-9) + 1e-9)
    # A remainder below a billionth of a chunk is the rounding of k·isl/M, not a chunk of its own (it would read
    # every weight once more).
    rest = np.where(total - full_chunks * chunk > 1e-9 * chunk, total - full_chunks * chunk, 0.0)
    full, sliding = prefill_attention_flops(model, isl)

    def one_chunk(tokens: np.ndarray) -> np.ndarray:
        share = tokens / np.maximum(total, 1e-9)
        return step_time(model, cluster, prec, shard, tokens_per_rank=tokens, sequences_per_rank=k * share,
                         attended_keys=(0.0, 0.0), attention_flops=(k * full * share, k * sliding * share),
                         decode=False, moe_tokens=tokens).total_s
    return full_chunks * one_chunk(chunk) + np.where(rest > 0.0, one_chunk(np.maximum(rest, 1e-9)), 0.0)
