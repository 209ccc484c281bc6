"""Build a :class:`ModelSpec` from a Hugging Face ``config.json`` (a path, a shipped preset, or a repo id
in the local Hugging Face cache).

The families read are the rows of :data:`paraplan.model_specs.model_families.FAMILIES` (what each
``model_type`` fixes rather than states); :func:`supported_model_types` lists them. A multimodal
checkpoint's ``text_config`` is its decoder and is what is read; its vision and audio towers are not
counted (the ModelSpec's name says so).

Transformers 4.x and 5.x spell a few keys differently (``rope_theta`` moved into
``rope_parameters``, ``torch_dtype`` became ``dtype``); only shape keys matter here and both
spellings of each are accepted, as are the GPT-2 / MPT / DBRX names (``n_embd``, ``d_model`` ...).
"""

from __future__ import annotations

import difflib
import math
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from paraplan.errors import InputError
from paraplan.files import parse_user_json, read_user_json, shown
from paraplan.limits import MAX_EXPERTS, MAX_HEADS, MAX_LAYERS, MAX_SEQ_LEN, MAX_VOCAB, MAX_WIDTH
from paraplan.model_specs import hf_layers
from paraplan.model_specs.hf_checkpoint import REPO_ID, cached_config_path, not_cached_message, weight_format
from paraplan.model_specs.mixers import mixer_shapes
from paraplan.model_specs.model_families import (
    FAMILIES,
    REFUSED,
    TEXT_CONFIG_WRAPPERS,
    FamilyTraits,
    resolve,
)
from paraplan.model_specs.model_spec import ModelSpec

if TYPE_CHECKING:  # importlib.abc's name works on 3.10 (importlib.resources.abc is 3.11+); only mypy reads it
    from importlib.abc import Traversable

SUPPORTED_TYPES = tuple(sorted(FAMILIES)) + tuple(sorted(TEXT_CONFIG_WRAPPERS))
"""Every model_type read: the decoder families and the multimodal wrappers whose text_config is read."""
SUPPORTED_LIST_HINT = "'paraplan models types' lists them"
"""Where the unsupported-type message points for the full list."""
MAX_CONFIG_BYTES = 4 * 1024 * 1024
"""A config.json is a few KiB: the largest of the 13 in ../shared/data/serving/model_configs is 12.6 KiB
(Qwen3-235B-A22B-FP8, its quantization block listing modules); 4 MiB leaves 300x room."""

_ALIASES = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers"),
    "num_heads": ("num_attention_heads", "n_head", "n_heads"),
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "ffn_size": ("intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim"),
    "vocab_size": ("vocab_size",),
    "max_positions": ("max_position_embeddings", "n_positions", "max_seq_len", "n_ctx"),
    "head_dim": ("head_dim",),
    # MoE: Mixtral and GPT-OSS call routed experts num_local_experts, Qwen num_experts, DeepSeek n_routed_experts.
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "experts_per_token": ("num_experts_per_tok", "experts_per_token", "num_experts_per_token"),
    "expert_ffn_size": ("moe_intermediate_size",),
    "num_shared_experts": ("n_shared_experts",),
    "dropout": ("resid_pdrop", "hidden_dropout", "hidden_dropout_prob"),
}


def _get(config: dict[str, Any], field: str, origin: str, default: Any = None,
         traits: FamilyTraits | None = None) -> Any:
    names = (traits.aliases.get(field, ()) if traits else ()) + _ALIASES[field]
    for key in names:
        if config.get(key) is not None:
            return config[key]
    if default is None:
        raise InputError(f"{origin}: config.json lacks {' / '.join(names)}")
    return default


# The most each config.json field may say (paraplan.limits gives the reasons); other widths: MAX_WIDTH.
_FIELD_MAX = {"num_hidden_layers": MAX_LAYERS, "num_attention_heads": MAX_HEADS, "num_key_value_heads": MAX_HEADS,
              "vocab_size": MAX_VOCAB, "num_experts": MAX_EXPERTS, "num_experts_per_tok": MAX_EXPERTS,
              "n_shared_experts": MAX_EXPERTS, "max_position_embeddings": MAX_SEQ_LEN,
              "decoder_sparse_step": MAX_LAYERS, "moe_layer_freq": MAX_LAYERS, "n_group": MAX_EXPERTS,
              "topk_group": MAX_EXPERTS, "num_nextn_predict_layers": MAX_LAYERS, "mtp_num_hidden_layers": MAX_LAYERS}


def _int(value: Any, field: str, origin: str) -> int:
    # Floats are checked as floats: a 400-digit JSON integer is a valid int that math.isfinite cannot convert.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or (
            isinstance(value, float) and not (math.isfinite(value) and value.is_integer())):
        raise InputError(f"{origin}: {field} must be a positive integer, got {shown(value)}")
    most = _FIELD_MAX.get(field, MAX_WIDTH)
    if value > most:
        size = f"{int(value):,}" if value < 10**15 else shown(int(value))
        raise InputError(f"{origin}: {field} = {size} is implausibly large (at most {most:,})")
    return int(value)


def _optional_int(config: dict[str, Any], key: str, origin: str) -> int:
    """A width that may be absent or null (0 then), else a positive integer."""
    value = config.get(key)
    return 0 if value is None or value == 0 else _int(value, key, origin)


def _traits(config: dict[str, Any], traits: FamilyTraits, origin: str) -> dict[str, Any]:
    """The family's fixed facts resolved against this config, as ModelSpec keyword arguments."""
    values = {name: resolve(getattr(traits, name), config) for name in (
        "norm", "norm_bias", "norm_weight", "norms_per_layer", "qk_norm", "qkv_bias", "out_bias", "mlp_bias",
        "gated_mlp", "tied", "position", "parallel_residual", "output_bias", "final_norm", "attention_output_gate")}
    if values["norm"] not in ("rmsnorm", "layernorm") or values["position"] not in ("rope", "learned", "alibi") \
            or values["qk_norm"] not in (False, "head", "full") or values["norms_per_layer"] not in (1, 2, 3, 4):
        raise InputError(f"{origin}: config.json states an unknown norm, position or QK-norm kind")
    rate = _get(config, "dropout", origin, default=traits.dropout_default, traits=traits)
    fields: dict[str, Any] = {name: bool(values[name]) for name in ("norm_bias", "norm_weight", "qkv_bias", "out_bias",
                                                                     "output_bias", "final_norm",
                                                                     "attention_output_gate")}
    fields.update(
        norm=values["norm"], norms_per_layer=values["norms_per_layer"], qk_norm=bool(values["qk_norm"]),
        qk_norm_width=values["qk_norm"] or "head", qk_norm_bias=traits.qk_norm_bias,
        linear_bias=bool(values["mlp_bias"]), gated_mlp=bool(values["gated_mlp"]),
        tied_embeddings=bool(values["tied"]), position=values["position"],
        parallel_attn_mlp=bool(values["parallel_residual"]), embedding_norm=traits.embedding_norm,
        position_offset=traits.position_offset, attention_sinks=traits.attention_sinks,
        post_norm_only=traits.post_norm_only,
        dropout=isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate > 0,
    )
    return fields


def _moe_fields(config: dict[str, Any], traits: FamilyTraits, layers: int, origin: str) -> dict[str, Any]:
    """ModelSpec keyword arguments for the MoE and MLA parts of a config (empty for dense families)."""
    fields: dict[str, Any] = {}
    if traits.moe != "none":
        fields.update(
            num_experts=_int(_get(config, "num_experts", origin, traits=traits), "num_experts", origin),
            experts_per_token=_int(_get(config, "experts_per_token", origin, traits=traits), "num_experts_per_tok",
                                   origin),
            # Mixtral, GPT-OSS, OLMoE, Granite-MoE size their experts with intermediate_size.
            expert_ffn_size=_int(_get(config, "expert_ffn_size", origin, default=config.get("intermediate_size"),
                                      traits=traits), "moe_intermediate_size", origin),
            moe_layers=hf_layers.moe_layers(config, traits, layers, origin),
            router_bias=bool(resolve(traits.router_bias, config)), expert_bias=traits.expert_bias,
            expert_glu_clamp=config.get("swiglu_limit") is not None,
        )
        fields.update(_shared_expert(config, traits, fields["expert_ffn_size"], origin))
        groups = config.get("n_group")
        if resolve(traits.group_limited, config) and groups not in (None, 0, 1):
            fields["expert_groups"] = _int(groups, "n_group", origin)
            fields["groups_per_token"] = _int(config.get("topk_group"), "topk_group", origin)
    if traits.mla:
        fields["q_lora_rank"] = _optional_int(config, "q_lora_rank", origin)
        for key in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            fields[key] = _int(config.get(key), key, origin)
    if traits.mtp_key and config.get(traits.mtp_key):
        fields["mtp_layers"] = _int(config[traits.mtp_key], traits.mtp_key, origin)
    return fields


def _shared_expert(config: dict[str, Any], traits: FamilyTraits, expert_ffn: int, origin: str) -> dict[str, Any]:
    """The always-on shared expert: Qwen's own width (with a sigmoid gate), DeepSeek's count of
    expert-wide experts, or a width under a family key (Llama 4, Granite-MoE-shared, Hunyuan)."""
    if traits.shared == "qwen":
        width = _optional_int(config, "shared_expert_intermediate_size", origin)
    elif traits.shared == "deepseek":
        count = _get(config, "num_shared_experts", origin, default=0, traits=traits)
        width = _int(count, "n_shared_experts", origin) * expert_ffn if count else 0
    elif traits.shared == "width":
        width = _optional_int(config, traits.shared_width_key, origin)
    else:
        return {}
    return {"shared_expert_ffn_size": width, "shared_expert_gate": traits.shared_gate and width > 0}


def _windows(config: dict[str, Any], traits: FamilyTraits, kinds: list[str], origin: str) -> dict[str, Any]:
    """Sliding-window (or chunked) layers: every layer when the family slides all, else those layer_types names."""
    window = config.get(traits.window_key)
    windowed = len(kinds) if traits.windows == "all" else \
        sum(kind in ("sliding_attention", "chunked_attention") for kind in kinds)
    if traits.windows == "none" or not window or not windowed:
        return {}
    return {"sliding_window": _int(window, traits.window_key, origin), "sliding_layers": windowed,
            "window_kind": traits.window_kind}


def _unpriced_mixers(config: dict[str, Any], traits: FamilyTraits, kinds: list[str], widths: tuple[int, int, int],
                     origin: str) -> dict[str, Any]:
    """Exact counts of the token mixers the cost model does not price, and the list that says so.
    ``widths``: hidden size, all query heads' width, the query latent rank (MLA)."""
    hidden, q_width, q_lora = widths

    def positive(key: str) -> int:
        return _int(config.get(key), key, origin)

    fields: dict[str, Any] = {}
    unpriced: list[str] = []
    linear = kinds.count("linear_attention")
    if linear:
        lightning = traits.linear_attention == "lightning"
        params = hf_layers.lightning_attention_params(q_width, hidden) if lightning \
            else hf_layers.gated_deltanet_params(config, hidden, positive)
        fields.update(linear_attention_layers=linear, linear_attention_params=params)
        kind = "lightning (linear) attention" if lightning else "Gated DeltaNet linear attention"
        unpriced.append(f"{kind} in {linear} of {len(kinds)} layers")
    if traits.indexer:
        fields["indexer_params"] = hf_layers.indexer_params(config, hidden, q_lora, positive, len(kinds), origin)
        unpriced.append("the sparse-attention indexer (DSA)")
    if resolve(traits.attention_output_gate, config):
        unpriced.append("the gated attention output")
    fields["unpriced_features"] = tuple(unpriced)
    return fields


def _unwrap(config: dict[str, Any], name: str) -> tuple[dict[str, Any], str]:
    """The decoder config of a multimodal checkpoint (its text_config) and the name to give it."""
    outer = config.get("model_type")
    text = config.get("text_config")
    if not isinstance(outer, str):
        return config, name
    if outer in TEXT_CONFIG_WRAPPERS or (isinstance(text, dict) and outer not in FAMILIES):
        if not isinstance(text, dict):
            raise InputError(f"{name}: model_type {shown(outer)} keeps its decoder in text_config, which is missing")
        # The checkpoint's top-level model ties (or not) its output head, so the outer key wins.
        inner = {**text, **{key: config[key] for key in ("tie_word_embeddings", "quantization_config")
                            if key in config}}
        inner.setdefault("model_type", TEXT_CONFIG_WRAPPERS.get(outer))
        return inner, f"{name} (text decoder of {outer}; encoder towers not counted)"
    return config, name


def _unsupported(model_type: Any, name: str) -> InputError:
    if model_type is None:
        return InputError(f"{name}: config.json lacks model_type (as in \"model_type\": \"llama\"); "
                          f"{len(SUPPORTED_TYPES)} types are read ({SUPPORTED_LIST_HINT})")
    if isinstance(model_type, str) and model_type in REFUSED:
        return InputError(f"{name}: model_type {model_type!r} is not read: {REFUSED[model_type]}")
    close = difflib.get_close_matches(str(model_type), SUPPORTED_TYPES, n=3, cutoff=0.6) \
        if isinstance(model_type, str) else []
    hint = f"; closest: {', '.join(close)}" if close else ""
    return InputError(f"{name}: model_type {shown(model_type)} is not supported{hint} ({len(SUPPORTED_TYPES)} "
                      f"types are; {SUPPORTED_LIST_HINT})")


def supported_model_types() -> tuple[str, ...]:
    """Every model_type paraplan reads, sorted: decoder families, then multimodal wrappers (text_config read)."""
    return SUPPORTED_TYPES


def _shape(config: dict[str, Any], traits: FamilyTraits, moe: dict[str, Any], name: str) -> dict[str, Any]:
    """Widths and counts every family states (under its own spellings), as ModelSpec keyword arguments."""
    hidden = _int(_get(config, "hidden_size", name, traits=traits), "hidden_size", name)
    heads = _int(_get(config, "num_heads", name, traits=traits), "num_attention_heads", name)
    layers = _int(_get(config, "num_layers", name, traits=traits), "num_hidden_layers", name)
    # Without head_dim transformers uses hidden // heads, rounding down (its Glm4MoeConfig defaults: 4096 // 96).
    head_dim = _get(config, "head_dim", name, default=hidden // heads or None, traits=traits)
    if traits.mla:  # MLA: every head has its own K and V; a query/key head is nope + rope wide
        head_dim = moe["qk_nope_head_dim"] + moe["qk_rope_head_dim"]
    # Families whose every layer is MoE (Mixtral, DBRX) may state no dense width: it is the experts'.
    ffn = _get(config, "ffn_size", name, default=resolve(traits.ffn, config) or (
        moe["expert_ffn_size"] if len(moe.get("moe_layers", ())) == layers else None), traits=traits)
    kv_heads = heads if traits.mla else resolve(traits.kv_heads, config) or _get(
        config, "num_kv_heads", name, default=heads, traits=traits)
    return {"num_layers": layers, "hidden_size": hidden, "num_heads": heads,
            "num_kv_heads": _int(kv_heads, "num_key_value_heads", name), "head_dim": _int(head_dim, "head_dim", name),
            "ffn_size": _int(ffn, "intermediate_size", name),
            "vocab_size": _int(_get(config, "vocab_size", name, traits=traits), "vocab_size", name),
            "max_positions": _int(_get(config, "max_positions", name, default=2048, traits=traits),
                                  "max_position_embeddings", name)}


MAX_ORIGIN_CHARS = 100
"""Messages name the config by its last 100 characters: a deep path still leaves room for the sentence
within the 300-character line an InputError may take."""


def model_from_config(config: dict[str, Any], name: str) -> ModelSpec:
    """Read the shape of a dense, MoE or hybrid transformer decoder from a parsed config.json."""
    spec_name = _unwrap(config, name)[1]
    origin = name if len(name) <= MAX_ORIGIN_CHARS else "..." + name[3 - MAX_ORIGIN_CHARS:]
    try:
        return _read(config, origin, spec_name)
    except InputError as exc:
        raise InputError(str(exc).replace(spec_name, origin)) from None


def _read(config: dict[str, Any], name: str, spec_name: str) -> ModelSpec:
    mixers = mixer_shapes(config)  # the whole config.json: mixer_shapes finds a wrapper's text_config itself
    config, name = _unwrap(config, name)
    model_type = config.get("model_type")
    traits = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if traits is None or not isinstance(model_type, str):  # the second test only narrows the type for mypy
        raise _unsupported(model_type, name)
    for nested in traits.flatten:  # DBRX keeps attention and FFN keys in sub-objects
        if isinstance(config.get(nested), dict):
            config = {**config[nested], **config}
    reason = traits.refuse(config) if traits.refuse else ""
    if reason:
        raise InputError(f"{name}: {model_type} with {reason}")
    layers = _int(_get(config, "num_layers", name, traits=traits), "num_hidden_layers", name)
    moe = _moe_fields(config, traits, layers, name)
    shape = _shape(config, traits, moe, name)
    kinds = hf_layers.layer_kinds(config, traits, layers, name)
    widths = (shape["hidden_size"], shape["num_heads"] * shape["head_dim"], moe.get("q_lora_rank", 0))
    quantization = config.get("quantization_config")
    try:
        return ModelSpec(
            name=spec_name, model_type=model_type, **shape, **_traits(config, traits, name), **moe,
            **_windows(config, traits, kinds, name), **_unpriced_mixers(config, traits, kinds, widths, name),
            weights=None if quantization is None else weight_format(quantization, f"{name} quantization_config"),
            mixers=mixers,
        )
    except ValueError as exc:
        raise InputError(str(exc)) from None


def _presets_root() -> Traversable:
    """The shipped presets' folder (one sub-folder per preset, each holding config.json)."""
    return resources.files("paraplan.data").joinpath("models")


def preset_names() -> list[str]:
    """Names of every shipped preset."""
    return sorted(entry.name for entry in _presets_root().iterdir() if entry.joinpath("config.json").is_file())


def _read_checkpoint_config(path: Path, name: str) -> ModelSpec:
    """config.json at ``path``, with ModelOpt's hf_quant_config.json beside it when present (its
    ``quantization`` block says how the weights are stored)."""
    # top=dict: an object; Infinity as transformers writes float("inf") (falcon-h1's time_step_max ...)
    config = cast(dict[str, Any], read_user_json(path, MAX_CONFIG_BYTES, "model config", allow_infinity=True))
    beside = path.parent / "hf_quant_config.json"
    if beside.is_file() and "quantization_config" not in config:
        outer = cast(dict[str, Any], read_user_json(beside, MAX_CONFIG_BYTES, "quantization config"))
        quant = outer.get("quantization")
        if quant is not None:
            config = {**config, "quantization_config": {"quant_method": "modelopt", **quant}
                      if isinstance(quant, dict) else quant}
    return model_from_config(config, name)


def load_model(name_or_path: str) -> ModelSpec:
    """A preset by name, a config.json path (a file, or a folder holding config.json), or a Hugging Face
    repo id (owner/name) whose config.json is in the local Hugging Face cache."""
    path = Path(name_or_path)
    if _exists(path, "dir"):
        path = path / "config.json"
    if _exists(path, "file"):
        return _read_checkpoint_config(path, str(name_or_path))
    names = preset_names()
    if name_or_path in names:
        text = (_presets_root() / name_or_path / "config.json").read_text()
        config = parse_user_json(text, f"preset {name_or_path}", allow_infinity=True)
        return model_from_config(cast(dict[str, Any], config), name_or_path)
    if REPO_ID.match(name_or_path):
        cached = cached_config_path(name_or_path)
        if cached is None:
            raise InputError(not_cached_message(name_or_path))
        return _read_checkpoint_config(cached, name_or_path)
    close = difflib.get_close_matches(name_or_path[:200], names, n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    raise InputError(
        f"unknown model {shown(name_or_path, 120)}: not a preset and no such config.json{hint} "
        f"(run 'paraplan models list' for presets)"
    )


def _exists(path: Path, kind: str) -> bool:
    """Whether ``path`` is a folder (``kind`` "dir") or a file; a name the system cannot look up (too long, a NUL
    byte) is neither."""
    try:
        return path.is_dir() if kind == "dir" else path.is_file()
    except (OSError, ValueError):
        return False
