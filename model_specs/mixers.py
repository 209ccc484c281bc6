"""Token mixers the training cost model does not price, priced for inference: Gated DeltaNet linear attention
(Qwen3-Next, Qwen3.5) and DeepSeek's sparse-attention indexer (DSA: DeepSeek-V3.2, GLM-5).

ModelSpec counts their parameters exactly but does not carry their shapes; ``mixer_shapes`` reads them from
the decoder's config.json keys (transformers' Qwen3NextConfig / GlmMoeDsaConfig names).

- Gated DeltaNet: a layer keeps a recurrent state per sequence instead of a KV cache: per value head a
  d_k × d_v matrix (fp32 where the config says ``mamba_ssm_dtype: float32``) plus a short-convolution state
  of (kernel − 1) past inputs of the q, k and v channels (16-bit). Decode reads and writes the state once per
  token; prefill runs the chunked delta rule, about 6·d_k·d_v FLOPs per value head per token (state update,
  output and the intra-chunk terms), at the attention kernel's rate.
- DSA: each query scores every cached key with a small multi-head indexer (``index_n_heads`` heads of
  ``index_head_dim``, fp8 keys with a 4-B scale per token) and attends only to the ``index_topk`` best.
  Decode reads the indexer keys of the whole context and the MLA latents of top-k tokens; prefill scores
  s²/2 pairs and attends to min(position, top-k) keys per query.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from paraplan.arrays import Column
from paraplan.model_specs.model_spec import ModelSpec

CONV_STATE_BYTES = 2.0
"""The short-convolution state is kept in the activation dtype (bf16)."""
DELTA_RULE_FLOPS_PER_STATE_ELEMENT = 6.0
"""Chunked gated delta rule per token and value head: state update (2·d_k·d_v), output from the state
(2·d_k·d_v) and the intra-chunk attention and correction terms (about 2·d_k·d_v at chunk 64)."""
INDEX_KEY_SCALE_BYTES = 4.0
"""One fp32 scale per fp8 indexer key (DeepSeek-V3.2's indexer cache: 128 fp8 values + a 4-B scale)."""
_STATE_DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}


@dataclass(frozen=True, slots=True, kw_only=True)
class MixerShapes:
    """Shapes of the linear-attention and sparse-attention-indexer mixers (all 0 when the model has none)."""

    linear_key_heads: int = 0
    """Gated DeltaNet query/key heads."""
    linear_value_heads: int = 0
    """Gated DeltaNet value heads (one recurrent state each)."""
    linear_key_dim: int = 0
    """Width of one Gated DeltaNet key head (d_k)."""
    linear_value_dim: int = 0
    """Width of one Gated DeltaNet value head (d_v)."""
    linear_conv_kernel: int = 0
    """Short-convolution kernel length."""
    state_bytes: float = 4.0
    """Bytes per recurrent-state element (``mamba_ssm_dtype``)."""
    index_heads: int = 0
    """Sparse-attention indexer heads."""
    index_head_dim: int = 0
    """Width of one indexer head (and of the cached indexer key)."""
    index_topk: int = 0
    """Keys each query attends to after the indexer's selection."""

    def linear_state_bytes(self, tp: Column) -> np.ndarray:
        """Recurrent and convolution state of one sequence in one linear-attention layer on one GPU (heads
        split over tp)."""
        tp = np.asarray(tp, dtype=float)
        recurrent = self.linear_value_heads * self.linear_key_dim * self.linear_value_dim * self.state_bytes
        channels = 2 * self.linear_key_heads * self.linear_key_dim + self.linear_value_heads * self.linear_value_dim
        conv = channels * max(self.linear_conv_kernel - 1, 0) * CONV_STATE_BYTES
        return (recurrent + conv) / tp

    def linear_prefill_flops_per_token(self, tp: Column) -> np.ndarray:
        """Delta-rule FLOPs per prompt token per linear-attention layer on one GPU."""
        return DELTA_RULE_FLOPS_PER_STATE_ELEMENT * self.linear_value_heads * self.linear_key_dim \
            * self.linear_value_dim / np.asarray(tp, dtype=float)

    @property
    def index_key_bytes(self) -> float:
        """Indexer-cache bytes per token per layer (fp8 key and its scale)."""
        return self.index_head_dim + INDEX_KEY_SCALE_BYTES if self.index_topk else 0.0

    @property
    def index_flops_per_key(self) -> float:
        """Indexer FLOPs per (query, key) pair: a dot product per indexer head."""
        return 2.0 * self.index_heads * self.index_head_dim


NO_MIXERS = MixerShapes()


def _positive(config: dict[str, Any], key: str) -> int:
    value = config.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 1 << 20 else 0


def mixer_shapes(config: dict[str, Any]) -> MixerShapes:
    """The mixer shapes a decoder config.json states (its text_config for a multimodal wrapper)."""
    text = config.get("text_config")
    config = text if isinstance(text, dict) else config
    return MixerShapes(
        linear_key_heads=_positive(config, "linear_num_key_heads"),
        linear_value_heads=_positive(config, "linear_num_value_heads"),
        linear_key_dim=_positive(config, "linear_key_head_dim"),
        linear_value_dim=_positive(config, "linear_value_head_dim"),
        linear_conv_kernel=_positive(config, "linear_conv_kernel_dim"),
        state_bytes=_STATE_DTYPE_BYTES.get(str(config.get("mamba_ssm_dtype", "float32")), 4.0),
        index_heads=_positive(config, "index_n_heads"),
        index_head_dim=_positive(config, "index_head_dim"),
        index_topk=_positive(config, "index_topk"),
    )


def unpriced_for_serving(model: ModelSpec, mixers: MixerShapes) -> str:
    """Why the serving model cannot price ``model`` ('' when it can): a linear-attention or indexer feature
    without the shapes to price it. The gated attention output is priced (its gate widens the query GEMM)."""
    missing = []
    if model.linear_attention_layers and not (mixers.linear_value_heads and mixers.linear_key_dim
                                              and mixers.linear_value_dim):
        missing.append(f"linear attention in {model.linear_attention_layers} layers without its head shapes")
    if model.indexer_params and not (mixers.index_topk and mixers.index_heads and mixers.index_head_dim):
        missing.append("a sparse-attention indexer without index_n_heads, index_head_dim, index_topk")
    if not missing:
        return ""
    return f"{model.name[:60]}: the serving model cannot price {'; '.join(missing)}"
