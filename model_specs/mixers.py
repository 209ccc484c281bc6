"""Token mixers the training cost model does not price, priced for inference: Gated DeltaNet linear attention
(Qwen3-Next, Qwen3.5) and DeepSeek's sparse-attention indexer (DSA: DeepSeek-V3.2, GLM-5).

ModelSpec counts their parameters exactly and carries their shapes (``ModelSpec.mixers``, a ``MixerShapes``
defined in model_spec.py); ``mixer_shapes`` reads them from the decoder's config.json keys (transformers'
Qwen3NextConfig / GlmMoeDsaConfig names) when hf_config builds the ModelSpec.

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

from typing import Any

from paraplan.model_specs.model_spec import MixerShapes, ModelSpec

_STATE_DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}


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


def unpriced_for_serving(model: ModelSpec) -> str:
    """Why the serving model cannot price ``model`` ('' when it can): a linear-attention or indexer feature
    without the shapes (``model.mixers``) to price it. The gated attention output is priced (its gate widens
    the query GEMM)."""
    mixers = model.mixers
    missing = []
    if model.linear_attention_layers and not (mixers.linear_value_heads and mixers.linear_key_dim
                                              and mixers.linear_value_dim):
        missing.append(f"linear attention in {model.linear_attention_layers} layers without its head shapes")
    if model.indexer_params and not (mixers.index_topk and mixers.index_heads and mixers.index_head_dim):
        missing.append("a sparse-attention indexer without index_n_heads, index_head_dim, index_topk")
    if not missing:
        return ""
    return f"{model.name[:60]}: the serving model cannot price {'; '.join(missing)}"
