"""Build a :class:`ModelSpec` from a Hugging Face ``config.json`` (a path or a shipped preset).

Dense families: llama, mistral, qwen2, qwen3, gpt2, gpt_neox, mpt. MoE families: mixtral, qwen2_moe,
qwen3_moe, deepseek_v2, deepseek_v3 (with MLA and MTP), gpt_oss.

Transformers 4.x and 5.x spell a few keys differently (``rope_theta`` moved into
``rope_parameters``, ``torch_dtype`` became ``dtype``); only shape keys matter here and both
spellings of each are accepted, as are the GPT-2 / MPT names (``n_embd``, ``d_model`` ...).
"""

from __future__ import annotations

import difflib
import math
from importlib import resources
from pathlib import Path
from typing import Any

from paraplan.cost_models.model_spec import ModelSpec
from paraplan.errors import InputError
from paraplan.files import parse_user_json, read_user_json
from paraplan.limits import MAX_EXPERTS, MAX_HEADS, MAX_LAYERS, MAX_SEQ_LEN, MAX_VOCAB, MAX_WIDTH

DENSE_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gpt2", "gpt_neox", "mpt")
MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss")
SUPPORTED_TYPES = DENSE_TYPES + MOE_TYPES
_QWEN_MOE = ("qwen2_moe", "qwen3_moe")
_DEEPSEEK = ("deepseek_v2", "deepseek_v3")
MAX_CONFIG_BYTES = 4 * 1024 * 1024
"""A config.json is a few KiB: the largest of the 13 in ../shared/data/serving/model_configs is 12.6 KiB
(Qwen3-235B-A22B-FP8, its quantization block listing modules); 4 MiB leaves 300x room."""
GROUP_LIMITED_METHODS = ("group_limited_greedy", "noaux_tc")

_ALIASES = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers"),
    "num_heads": ("num_attention_heads", "n_head", "n_heads"),
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "ffn_size": ("intermediate_size", "n_inner", "ffn_hidden_size"),
    "vocab_size": ("vocab_size",),
    "max_positions": ("max_position_embeddings", "n_positions", "max_seq_len", "n_ctx"),
    "head_dim": ("head_dim",),
    # MoE: Mixtral and GPT-OSS call routed experts num_local_experts, Qwen num_experts, DeepSeek n_routed_experts.
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "experts_per_token": ("num_experts_per_tok", "experts_per_token", "num_experts_per_token"),
    "expert_ffn_size": ("moe_intermediate_size",),
}


def _get(config: dict[str, Any], field: str, origin: str, default: Any = None) -> Any:
    for key in _ALIASES[field]:
        if config.get(key) is not None:
            return config[key]
    if default is None:
        raise InputError(f"{origin}: config.json lacks {' / '.join(_ALIASES[field])}")
    return default


# The most each config.json field may say (paraplan.limits gives the reasons); other widths: MAX_WIDTH.
_FIELD_MAX = {"num_hidden_layers": MAX_LAYERS, "num_attention_heads": MAX_HEADS, "num_key_value_heads": MAX_HEADS,
              "vocab_size": MAX_VOCAB, "num_experts": MAX_EXPERTS, "num_experts_per_tok": MAX_EXPERTS,
              "n_shared_experts": MAX_EXPERTS, "max_position_embeddings": MAX_SEQ_LEN,
              "decoder_sparse_step": MAX_LAYERS, "moe_layer_freq": MAX_LAYERS}


def _int(value: Any, field: str, origin: str) -> int:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0
            or int(value) != value):
        raise InputError(f"{origin}: {field} must be a positive integer, got {value!r}")
    most = _FIELD_MAX.get(field, MAX_WIDTH)
    if value > most:
        raise InputError(f"{origin}: {field} = {int(value):,} is implausibly large (at most {most:,})")
    return int(value)


def _family_defaults(model_type: str, config: dict[str, Any], hidden: int) -> dict[str, Any]:
    """Architecture facts each model family fixes rather than states in config.json."""
    if model_type == "gpt2":
        return {"gated_mlp": False, "norm": "layernorm", "norm_bias": True, "qkv_bias": True, "linear_bias": True,
                "position": "learned", "tied": config.get("tie_word_embeddings", True), "ffn": 4 * hidden}
    if model_type == "gpt_neox":
        attention_bias = bool(config.get("attention_bias", True))  # GPTNeoXConfig: query_key_value and dense
        return {"gated_mlp": False, "norm": "layernorm", "norm_bias": True, "qkv_bias": attention_bias,
                "out_bias": attention_bias, "linear_bias": True, "position": "rope",
                "tied": config.get("tie_word_embeddings", False), "ffn": None}
    if model_type == "mpt":
        bias = not config.get("no_bias", False)
        alibi = (config.get("attn_config") or {}).get("alibi", False)
        return {"gated_mlp": False, "norm": "layernorm", "norm_bias": bias, "qkv_bias": bias, "linear_bias": bias,
                "position": "alibi" if alibi else "learned", "tied": True,
                "ffn": int(config.get("expansion_ratio", 4) * hidden)}
    # Llama-family attention_bias switches q, k, v and o biases (GPT-OSS sets it); Qwen2 and
    # Qwen2-MoE have q, k, v biases only.
    attention_bias = bool(config.get("attention_bias", model_type == "gpt_oss"))
    return {"gated_mlp": True, "norm": "rmsnorm", "norm_bias": False,
            "qkv_bias": model_type in ("qwen2", "qwen2_moe") or attention_bias, "out_bias": attention_bias,
            "linear_bias": bool(config.get("mlp_bias", False)), "position": "rope",
            "tied": config.get("tie_word_embeddings", False), "ffn": None}


def _dropout(model_type: str, config: dict[str, Any]) -> bool:
    # GPT-2 configs default resid_pdrop to 0.1 when the key is absent (transformers GPT2Config).
    default = 0.1 if model_type == "gpt2" else 0.0
    rates = [config.get(key, default if key == "resid_pdrop" else 0.0)
             for key in ("resid_pdrop", "hidden_dropout", "hidden_dropout_prob")]
    return any(isinstance(rate, (int, float)) and rate > 0 for rate in rates)


def _layer_indices(value: Any, field: str, origin: str) -> list[int]:
    if not isinstance(value, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in value):
        raise InputError(f"{origin}: {field} must be a list of layer indices, got {value!r}")
    return value


def _moe_layers(model_type: str, config: dict[str, Any], layers: int, origin: str) -> tuple[int, ...]:
    """Which layers are MoE, by each family's own rule (transformers modeling code)."""
    if model_type in ("mixtral", "gpt_oss"):
        return tuple(range(layers))
    if model_type in _QWEN_MOE:  # Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer
        step = _int(config.get("decoder_sparse_step", 1), "decoder_sparse_step", origin)
        dense = set(_layer_indices(config.get("mlp_only_layers", []), "mlp_only_layers", origin))
        return tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0)
    # DeepseekV3DecoderLayer: MoE from first_k_dense_replace on, every moe_layer_freq-th layer.
    first_dense = config.get("first_k_dense_replace", 0)
    if isinstance(first_dense, bool) or not isinstance(first_dense, int) or first_dense < 0:
        raise InputError(f"{origin}: first_k_dense_replace must be a non-negative integer, got {first_dense!r}")
    freq = _int(config.get("moe_layer_freq", 1), "moe_layer_freq", origin)
    return tuple(i for i in range(layers) if i >= first_dense and i % freq == 0)


def _optional_int(config: dict[str, Any], key: str, origin: str) -> int:
    """A width that may be absent or null (0 then), else a positive integer."""
    value = config.get(key)
    return 0 if value is None or value == 0 else _int(value, key, origin)


def _moe_fields(model_type: str, config: dict[str, Any], layers: int, origin: str) -> dict[str, Any]:
    """ModelSpec keyword arguments for the MoE and MLA parts of a config (empty for dense families)."""
    if model_type not in MOE_TYPES:
        return {}
    fields: dict[str, Any] = {
        "num_experts": _int(_get(config, "num_experts", origin), "num_experts", origin),
        "experts_per_token": _int(_get(config, "experts_per_token", origin), "num_experts_per_tok", origin),
        # Mixtral and GPT-OSS size their experts with intermediate_size (they have no dense MLP).
        "expert_ffn_size": _int(_get(config, "expert_ffn_size", origin, default=config.get("intermediate_size")),
                                "moe_intermediate_size", origin),
        "moe_layers": _moe_layers(model_type, config, layers, origin),
    }
    if model_type == "qwen2_moe":
        fields["shared_expert_ffn_size"] = _optional_int(config, "shared_expert_intermediate_size", origin)
        fields["shared_expert_gate"] = fields["shared_expert_ffn_size"] > 0
    if model_type in _DEEPSEEK:
        shared = config.get("n_shared_experts") or 0
        fields["shared_expert_ffn_size"] = _int(shared, "n_shared_experts", origin) * fields["expert_ffn_size"] \
            if shared else 0
        # noaux_tc routing (DeepSeek-V3) keeps a learned per-expert bias, e_score_correction_bias.
        fields["router_bias"] = config.get("topk_method") == "noaux_tc"
        fields["q_lora_rank"] = _optional_int(config, "q_lora_rank", origin)
        for key in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            fields[key] = _int(config.get(key), key, origin)
        fields["mtp_layers"] = config.get("num_nextn_predict_layers") or 0
        # Group-limited routing: DeepSeek-V2's device-limited greedy and V3's node-limited noaux_tc pick
        # topk_group of n_group expert groups first (modeling_deepseek_v3.py MoEGate).
        if config.get("topk_method") in GROUP_LIMITED_METHODS and (config.get("n_group") or 1) > 1:
            fields["expert_groups"] = _int(config.get("n_group"), "n_group", origin)
            fields["groups_per_token"] = _int(config.get("topk_group"), "topk_group", origin)
    if model_type == "gpt_oss":
        fields.update(router_bias=True, expert_bias=True, attention_sinks=True)
    return fields


def _sliding(model_type: str, config: dict[str, Any], layers: int, origin: str) -> dict[str, int]:
    """Sliding-window attention: every layer in Mistral/Mixtral when a window is set; GPT-OSS's
    layer_types (default: even layers slide). Qwen's use_sliding_window is off in every release."""
    window = config.get("sliding_window")
    if model_type not in ("mistral", "mixtral", "gpt_oss") or not window:
        return {}
    window = _int(window, "sliding_window", origin)
    if model_type != "gpt_oss":
        return {"sliding_window": window, "sliding_layers": layers}
    kinds = config.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention"
                                          for i in range(layers)]
    if not isinstance(kinds, list) or len(kinds) != layers:
        raise InputError(f"{origin}: layer_types must list one attention kind per layer ({layers})")
    return {"sliding_window": window, "sliding_layers": sum(kind == "sliding_attention" for kind in kinds)}


def model_from_config(config: dict[str, Any], name: str) -> ModelSpec:
    """Read the shape of a dense or MoE transformer from a parsed config.json."""
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_TYPES:
        raise InputError(
            f"{name}: model_type {model_type!r} is not supported "
            f"(dense: {', '.join(DENSE_TYPES)}; MoE: {', '.join(MOE_TYPES)})"
        )
    hidden = _int(_get(config, "hidden_size", name), "hidden_size", name)
    heads = _int(_get(config, "num_heads", name), "num_attention_heads", name)
    family = _family_defaults(model_type, config, hidden)
    ffn = _get(config, "ffn_size", name, default=family["ffn"])
    head_dim = _get(config, "head_dim", name, default=hidden // heads if hidden % heads == 0 else None)
    layers = _int(_get(config, "num_layers", name), "num_hidden_layers", name)
    moe = _moe_fields(model_type, config, layers, name)
    if moe.get("kv_lora_rank"):  # MLA: every head has its own K and V; a query/key head is nope + rope wide
        head_dim = moe["qk_nope_head_dim"] + moe["qk_rope_head_dim"]
    if ffn is None and model_type in ("mixtral", "gpt_oss"):
        ffn = moe["expert_ffn_size"]
    try:
        return ModelSpec(
            name=name,
            model_type=model_type,
            num_layers=layers,
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=heads if moe.get("kv_lora_rank") else _int(
                _get(config, "num_kv_heads", name, default=heads), "num_key_value_heads", name),
            head_dim=_int(head_dim, "head_dim", name),
            ffn_size=_int(ffn, "intermediate_size", name),
            vocab_size=_int(_get(config, "vocab_size", name), "vocab_size", name),
            gated_mlp=family["gated_mlp"],
            tied_embeddings=bool(family["tied"]),
            norm=family["norm"],
            norm_bias=family["norm_bias"],
            qkv_bias=family["qkv_bias"],
            linear_bias=family["linear_bias"],
            out_bias=family.get("out_bias"),
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            position=family["position"],
            max_positions=_int(_get(config, "max_positions", name, default=2048), "max_position_embeddings", name),
            # GPTNeoXConfig defaults use_parallel_residual to True; no other family has it.
            parallel_attn_mlp=bool(config.get("use_parallel_residual", model_type == "gpt_neox")),
            dropout=_dropout(model_type, config),
            **moe,
            **_sliding(model_type, config, layers, name),
        )
    except ValueError as exc:
        raise InputError(str(exc)) from None


def _presets_root():
    return resources.files("paraplan.data").joinpath("models")


def preset_names() -> list[str]:
    """Names of every shipped preset."""
    return sorted(entry.name for entry in _presets_root().iterdir() if entry.joinpath("config.json").is_file())


def load_model(name_or_path: str) -> ModelSpec:
    """A preset by name, or a config.json path (a file, or a folder holding config.json)."""
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return model_from_config(read_user_json(path, MAX_CONFIG_BYTES, "model config"), str(name_or_path))
    names = preset_names()
    if name_or_path not in names:
        close = difflib.get_close_matches(name_or_path, names, n=3, cutoff=0.5)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise InputError(
            f"unknown model {name_or_path!r}: not a preset and no such config.json{hint} "
            f"(run 'paraplan models list' for presets)"
        )
    text = _presets_root().joinpath(name_or_path, "config.json").read_text()
    return model_from_config(parse_user_json(text, f"preset {name_or_path}"), name_or_path)
