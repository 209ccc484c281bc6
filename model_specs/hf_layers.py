"""Per-layer facts of a config.json: which layers slide, chunk or run linear attention, which are MoE,
and the exact parameter counts of the mixers the cost model does not price (Gated DeltaNet, the DSA
indexer). Every list is length-checked before it is walked, so a hostile config stays fast."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from paraplan.errors import InputError
from paraplan.files import shown
from paraplan.limits import MAX_LAYERS
from paraplan.model_specs.model_families import FamilyTraits

LAYER_KINDS = ("full_attention", "sliding_attention", "chunked_attention", "linear_attention")


def non_negative_int(value: Any, field: str, origin: str) -> int:
    """A layer count or index that may be 0 (at most MAX_LAYERS)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LAYERS:
        raise InputError(f"{origin}: {field} must be a non-negative integer, got {shown(value)}")
    return value


def _bounded_list(value: Any, field: str, origin: str, most: int) -> list[Any]:
    if not isinstance(value, list):
        raise InputError(f"{origin}: {field} must be a list, got {type(value).__name__}")
    if len(value) > most:
        raise InputError(f"{origin}: {field} lists {len(value):,} entries; at most {most:,} (one per layer)")
    return value


def layer_indices(value: Any, field: str, origin: str) -> set[int]:
    """A list of 0-based layer indices. transformers tests ``layer_idx in config.<field>``, so an index past
    the last layer selects nothing (Llama4TextConfig's default moe_layers may list more than the model has)."""
    items = _bounded_list(value, field, origin, MAX_LAYERS)
    if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < MAX_LAYERS for i in items):
        raise InputError(f"{origin}: {field} must list layer indices (0 to {MAX_LAYERS - 1:,}), got {shown(value)}")
    return set(items)


def per_layer(value: Any, field: str, layers: int, origin: str, allowed: tuple[str, ...]) -> list[str]:
    """A list of one string per layer, each among ``allowed``."""
    items = _bounded_list(value, field, origin, MAX_LAYERS)
    if len(items) != layers:
        raise InputError(f"{origin}: {field} must list one entry per layer ({layers}), got {len(items)}")
    bad = next((kind for kind in items if kind not in allowed), None) if all(isinstance(k, str) for k in items) \
        else next(k for k in items if not isinstance(k, str))
    if bad is not None:
        raise InputError(f"{origin}: {field} holds {shown(bad)}; expected one of {', '.join(allowed)}")
    return items


def _pattern_kinds(config: dict[str, Any], layers: int, origin: str) -> list[str] | None:
    """Older configs state the window layout as sliding_window_pattern: every p-th layer is full (Gemma 3,
    Cohere 2; AFMoE's global_attn_every_n_layers), or a string of L (local) and G (global) repeated (EXAONE 4)."""
    pattern = next((config[key] for key in ("sliding_window_pattern", "_sliding_window_pattern",
                                            "global_attn_every_n_layers") if config.get(key) is not None), None)
    if pattern is None:
        return None
    if isinstance(pattern, str) and 0 < len(pattern) <= 64 and set(pattern) <= {"L", "G"}:
        return ["sliding_attention" if pattern[i % len(pattern)] == "L" else "full_attention" for i in range(layers)]
    if isinstance(pattern, bool) or not isinstance(pattern, int) or not 0 < pattern <= MAX_LAYERS:
        raise InputError(f"{origin}: sliding_window_pattern must be a positive integer or a string of L and G, "
                         f"got {shown(pattern)}")
    return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)]


def _llama4_kinds(config: dict[str, Any], layers: int, origin: str) -> list[str] | None:
    """Llama4TextConfig: a layer with RoPE (no_rope_layers[i] == 1) attends within its chunk."""
    no_rope = config.get("no_rope_layers")
    if not no_rope:
        return None
    flags = _bounded_list(no_rope, "no_rope_layers", origin, MAX_LAYERS)
    if len(flags) != layers or any(flag not in (0, 1) for flag in flags):
        raise InputError(f"{origin}: no_rope_layers must list 0 or 1 for each of the {layers} layers")
    return ["chunked_attention" if flag else "full_attention" for flag in flags]


def layer_kinds(config: dict[str, Any], traits: FamilyTraits, layers: int, origin: str) -> list[str]:
    """The attention kind of every layer (full_attention when the family has no pattern)."""
    if traits.windows != "layer_types":
        return ["full_attention"] * layers
    if config.get("layer_types") is not None:
        return per_layer(config["layer_types"], "layer_types", layers, origin, LAYER_KINDS)
    if traits.linear_attention == "lightning" and config.get("attn_type_list") is not None:
        # MiniMax-Text-01's original config: 1 = softmax attention, 0 = lightning attention.
        flags = _bounded_list(config["attn_type_list"], "attn_type_list", origin, MAX_LAYERS)
        if len(flags) != layers or any(flag not in (0, 1) for flag in flags):
            raise InputError(f"{origin}: attn_type_list must list 0 or 1 for each of the {layers} layers")
        return ["full_attention" if flag else "linear_attention" for flag in flags]
    if traits.linear_attention and config.get("full_attention_interval") is not None:
        step = config["full_attention_interval"]
        if isinstance(step, bool) or not isinstance(step, int) or not 0 < step <= MAX_LAYERS:
            raise InputError(f"{origin}: full_attention_interval must be a positive integer, got {shown(step)}")
        return ["full_attention" if (i + 1) % step == 0 else "linear_attention" for i in range(layers)]
    kinds = _llama4_kinds(config, layers, origin) if traits.window_kind == "chunked" \
        else _pattern_kinds(config, layers, origin)
    if kinds is None and traits.window_kind == "chunked":
        step = config.get("no_rope_layer_interval", 4)
        if isinstance(step, bool) or not isinstance(step, int) or not 0 < step <= MAX_LAYERS:
            raise InputError(f"{origin}: no_rope_layer_interval must be a positive integer, got {shown(step)}")
        kinds = ["full_attention" if (i + 1) % step == 0 else "chunked_attention" for i in range(layers)]
    if kinds is None and traits.default_layer_types is not None:
        kinds = traits.default_layer_types(layers)
    return kinds or ["full_attention"] * layers


def _first_dense(config: dict[str, Any], layers: int, origin: str, key: str) -> list[int]:
    """DeepseekV3DecoderLayer: MoE from first_k_dense_replace (``key``) on, every moe_layer_freq-th layer."""
    first = non_negative_int(config.get(key) or 0, key, origin)
    freq = config.get("moe_layer_freq") or 1
    if isinstance(freq, bool) or not isinstance(freq, int) or not 0 < freq <= MAX_LAYERS:
        raise InputError(f"{origin}: moe_layer_freq must be a positive integer, got {shown(freq)}")
    return [i for i in range(layers) if i >= first and i % freq == 0]


def _step(config: dict[str, Any], key: str, default: int, origin: str) -> int:
    value = config.get(key)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_LAYERS:
        raise InputError(f"{origin}: {key} must be a positive integer, got {shown(value)}")
    return value


def moe_layers(config: dict[str, Any], traits: FamilyTraits, layers: int, origin: str) -> tuple[int, ...]:
    """Which layers are MoE, by the family's own rule (its transformers decoder layer)."""
    rule = traits.moe
    if rule == "all":
        return tuple(range(layers))
    if rule == "qwen":  # Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer / Qwen3NextDecoderLayer
        step = _step(config, "decoder_sparse_step", 1, origin)
        dense = layer_indices(config.get("mlp_only_layers") or [], "mlp_only_layers", origin)
        return tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0)
    if rule == "mlp_layer_types" and config.get("mlp_layer_types") is not None:
        kinds = per_layer(config["mlp_layer_types"], "mlp_layer_types", layers, origin, ("dense", "sparse"))
        return tuple(i for i, kind in enumerate(kinds) if kind == "sparse")
    if rule in ("deepseek", "mlp_layer_types"):
        return tuple(_first_dense(config, layers, origin, traits.first_dense_key))
    if rule == "llama4":  # Llama4TextDecoderLayer: is_moe_layer = layer_idx in config.moe_layers
        if config.get("moe_layers") is not None:
            chosen = layer_indices(config["moe_layers"], "moe_layers", origin)
            return tuple(i for i in range(layers) if i in chosen)
        step = _step(config, "interleave_moe_layer_step", 1, origin)
        return tuple(range(step - 1, layers, step))
    if rule == "ernie":  # Ernie4_5_MoeDecoderLayer
        interval = _step(config, "moe_layer_interval", 1, origin)
        start = non_negative_int(config.get("moe_layer_start_index", 1), "moe_layer_start_index", origin)
        end = config.get("moe_layer_end_index", -1)
        end = layers - 1 if end == -1 or end is None else non_negative_int(end, "moe_layer_end_index", origin)
        return tuple(i for i in range(layers) if (i + 1) % interval == 0 and start <= i <= end)
    return ()


def gated_deltanet_params(config: dict[str, Any], hidden: int, positive: Callable[[str], int]) -> int:
    """One Gated DeltaNet mixer (Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet): in_proj_qkvz h -> 2·k + 2·v,
    in_proj_ba h -> 2·n_v, a depthwise causal conv1d over q, k, v (2·k + v channels, kernel taps, no bias),
    dt_bias and A_log (n_v each), a gated RMSNorm of d_v, out_proj v -> h; k = n_k·d_k, v = n_v·d_v."""
    nk, dk = positive("linear_num_key_heads"), positive("linear_key_head_dim")
    nv, dv = positive("linear_num_value_heads"), positive("linear_value_head_dim")
    kernel = positive("linear_conv_kernel_dim")
    key_dim, value_dim = nk * dk, nv * dv
    return (hidden * (2 * key_dim + 2 * value_dim) + hidden * 2 * nv + (2 * key_dim + value_dim) * kernel
            + 2 * nv + dv + value_dim * hidden)


def lightning_attention_params(q_width: int, hidden: int) -> int:
    """One lightning-attention mixer (MiniMaxLightningAttention): qkv_proj h -> 3·q, out_proj q -> h,
    output_gate h -> q, an RMSNorm of q; q = heads · head_dim."""
    return 3 * hidden * q_width + 2 * q_width * hidden + q_width


def indexer_params(config: dict[str, Any], hidden: int, q_lora_rank: int, positive: Callable[[str], int], layers: int,
                   origin: str) -> int:
    """One layer's lightning indexer (DeepseekV32Indexer / GlmMoeDsaIndexer): wq_b q_lora -> n·d, wk h -> d,
    a LayerNorm of d with bias, weights_proj h -> n; n = index_n_heads, d = index_head_dim."""
    if config.get("indexer_types") is not None:
        kinds = per_layer(config["indexer_types"], "indexer_types", layers, origin, ("full", "shared"))
        if "shared" in kinds:
            raise InputError(f"{origin}: indexer_types has shared layers (reusing another layer's indexer); "
                             "paraplan counts one indexer per layer only")
    if not q_lora_rank:
        raise InputError(f"{origin}: the sparse-attention indexer reads the query latent; q_lora_rank must be set")
    heads, dim = positive("index_n_heads"), positive("index_head_dim")
    return q_lora_rank * heads * dim + hidden * dim + 2 * dim + hidden * heads
