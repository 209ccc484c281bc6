"""What each Hugging Face ``model_type`` fixes rather than states in config.json: one row per family.

A row says which norm the family uses and where, which projections carry biases, whether the MLP is
gated, how MoE layers are placed, how attention windows are laid out, and which features it has that
the cost model does not price. Values are constants, or a :class:`Key` read from the config with the
family's default (the default its transformers configuration class has). Each row was checked against
the parameter shapes transformers 5.24 builds (``models/<type>/modeling_<type>.py``);
tests/test_model_families.py compares every row's counts with transformers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from paraplan.files import shown

MoeRule = Literal["none", "all", "qwen", "deepseek", "mlp_layer_types", "llama4", "ernie"]
SharedRule = Literal["none", "qwen", "deepseek", "width"]
WindowRule = Literal["none", "all", "layer_types"]


@dataclass(frozen=True, slots=True)
class Key:
    """A trait the config may state under one of ``names``; ``default`` when none is present or null."""

    names: tuple[str, ...]
    default: Any

    def __call__(self, config: dict[str, Any]) -> Any:
        """The value under the first of ``names`` present and not null in ``config``, else ``default``."""
        for name in self.names:
            if config.get(name) is not None:
                return config[name]
        return self.default


def key(*names: str, default: Any = False) -> Key:
    """A :class:`Key` over ``names`` (first present wins)."""
    return Key(names, default)


Trait = Any
"""A constant, a :class:`Key`, or a function of the config dict."""
_ATTENTION_BIAS = key("attention_bias")
_MLP_BIAS = key("mlp_bias")
_TIED = key("tie_word_embeddings")


def resolve(trait: Trait, config: dict[str, Any]) -> Any:
    """The value of ``trait`` for ``config``."""
    return trait(config) if callable(trait) else trait


@dataclass(frozen=True, slots=True, kw_only=True)
class FamilyTraits:
    """The architecture facts of one family (see the module docstring)."""

    norm: Trait = "rmsnorm"
    """rmsnorm or layernorm."""
    norm_bias: Trait = False
    norm_weight: Trait = True
    norms_per_layer: Trait = 2
    post_norm_only: bool = False
    """The layer's two norms follow attention and the MLP instead of preceding them (OLMo 2, EXAONE 4)."""
    qk_norm: Trait = False
    """False, "head" (one head_dim-wide weight per q and k) or "full" (every channel of all heads)."""
    qk_norm_bias: bool = False
    qkv_bias: Trait = _ATTENTION_BIAS
    out_bias: Trait = _ATTENTION_BIAS
    mlp_bias: Trait = _MLP_BIAS
    gated_mlp: Trait = True
    tied: Trait = _TIED
    position: Trait = "rope"
    parallel_residual: Trait = False
    output_bias: Trait = False
    embedding_norm: bool = False
    final_norm: Trait = True
    position_offset: int = 0
    ffn: Trait = None
    """The dense MLP width when ``intermediate_size`` (and its aliases) is absent, as a function of the
    config (None: the key is required)."""
    kv_heads: Trait = None
    """A function of the config giving the KV heads, for families that ignore num_key_value_heads."""
    windows: WindowRule = "none"
    """none; all (every layer slides when sliding_window is set); layer_types (per-layer kinds)."""
    default_layer_types: Callable[[int], list[str]] | None = None
    """The layer_types a config without the key gets (its transformers config's default)."""
    window_key: str = "sliding_window"
    window_kind: Literal["sliding", "chunked"] = "sliding"
    moe: MoeRule = "none"
    first_dense_key: str = "first_k_dense_replace"
    """For moe == "deepseek": the key counting the leading dense layers (AFMoE: num_dense_layers)."""
    shared: SharedRule = "none"
    shared_width_key: str = ""
    """For shared == "width": the key giving the shared expert's width."""
    shared_gate: bool = False
    router_bias: Trait = False
    expert_bias: bool = False
    attention_sinks: bool = False
    group_limited: Trait = False
    mla: bool = False
    mtp_key: str = ""
    indexer: bool = False
    linear_attention: Literal["", "gated_deltanet", "lightning"] = ""
    """The linear-attention mixer of the hybrid layers: Qwen3-Next's Gated DeltaNet, MiniMax-01's lightning
    attention ('' = none)."""
    attention_output_gate: Trait = False
    dropout_default: float = 0.0
    """Dropout rate of resid_pdrop when the config omits it (GPT-2: 0.1)."""
    aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Extra spellings of the shape keys, tried before the common ones."""
    flatten: tuple[str, ...] = ()
    """Nested objects whose keys are read as top-level keys (DBRX's attn_config, ffn_config)."""
    refuse: Callable[[dict[str, Any]], str] | None = None
    """A function naming what of this config paraplan cannot count ('' when it can)."""
    notes: str = ""


def _alternating(layers: int) -> list[str]:
    """GPT-OSS and Gemma 2 default: even layers slide, odd layers attend fully."""
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]


def _every(period: int, kind: str, other: str = "sliding_attention") -> Callable[[int], list[str]]:
    """Every ``period``-th layer (1-based) is ``kind``, the rest ``other`` (Gemma 3 / Cohere 2 / Qwen3-Next)."""
    return lambda layers: [kind if (i + 1) % period == 0 else other for i in range(layers)]


def _mpt_bias(config: dict[str, Any]) -> bool:
    return not config.get("no_bias", False)


def _mpt_position(config: dict[str, Any]) -> str:
    attn = config.get("attn_config")
    return "alibi" if isinstance(attn, dict) and attn.get("alibi") else "learned"


def _four_h(config: dict[str, Any]) -> Any:
    hidden = config.get("hidden_size", config.get("n_embd"))
    return 4 * hidden if isinstance(hidden, int) and not isinstance(hidden, bool) else None


def _mpt_ffn(config: dict[str, Any]) -> Any:
    hidden, ratio = config.get("d_model"), config.get("expansion_ratio", 4)
    if isinstance(hidden, bool) or not isinstance(hidden, int) or not isinstance(ratio, (int, float)) \
            or isinstance(ratio, bool) or not 0 < ratio < 1e6:
        return None
    return int(ratio * hidden)


def _multi_query(config: dict[str, Any]) -> Any:
    """GPT-BigCode: one KV head with multi_query (its default), else one per query head."""
    return 1 if config.get("multi_query", True) else config.get("n_head", config.get("num_attention_heads"))


def _falcon_kv(config: dict[str, Any]) -> Any:
    """FalconAttention: num_kv_heads with the new decoder architecture or without multi-query, else 1."""
    if config.get("new_decoder_architecture") or not config.get("multi_query", True):
        return config.get("num_kv_heads", config.get("num_attention_heads"))
    return 1


def _falcon_norms(config: dict[str, Any]) -> int:
    """FalconDecoderLayer: ln_attn + ln_mlp (new architecture, num_ln_in_parallel_attn 2 or unset), one
    input norm (parallel), or input + post-attention norms (sequential)."""
    if config.get("new_decoder_architecture"):
        return 1 if config.get("num_ln_in_parallel_attn") == 1 else 2
    return 1 if config.get("parallel_attn", True) else 2


def _falcon_parallel(config: dict[str, Any]) -> bool:
    return bool(config.get("new_decoder_architecture") or config.get("parallel_attn", True))


def _opt_refuse(config: dict[str, Any]) -> str:
    proj = config.get("word_embed_proj_dim")
    if proj is not None and proj != config.get("hidden_size"):
        return (f"word_embed_proj_dim {shown(proj)} differs from hidden_size (OPT-350m's project_in/out "
                "layers are not modelled)")
    if not config.get("do_layer_norm_before", True):
        return "do_layer_norm_before = false (post-norm OPT) is not modelled"
    return ""


def _opt_affine(config: dict[str, Any]) -> bool:
    return bool(config.get("layer_norm_elementwise_affine", True))


def _opt_final_norm(config: dict[str, Any]) -> bool:
    return bool(config.get("do_layer_norm_before", True)) and not config.get("_remove_final_layer_norm", False)


def _deepseek_router_bias(config: dict[str, Any]) -> bool:
    # noaux_tc routing (DeepSeek-V3) keeps a learned per-expert bias, e_score_correction_bias.
    return config.get("topk_method") == "noaux_tc"


def _deepseek_group_limited(config: dict[str, Any]) -> bool:
    # DeepSeek-V2's device-limited greedy and V3's node-limited noaux_tc pick topk_group of n_group groups.
    return config.get("topk_method") in ("group_limited_greedy", "noaux_tc")


def _qwen2_qkv_bias(config: dict[str, Any]) -> bool:
    return True  # Qwen2Attention: q, k, v biases always, o_proj none


def _minimax_qk(config: dict[str, Any]) -> Any:
    return "full" if config.get("use_qk_norm", True) else False


LLAMA = FamilyTraits()
QWEN2 = replace(LLAMA, qkv_bias=_qwen2_qkv_bias, out_bias=False)
QWEN3 = replace(LLAMA, qk_norm="head")
MISTRAL = replace(LLAMA, windows="all")
GEMMA = replace(LLAMA, tied=key("tie_word_embeddings", default=True))
# GPT-2 configs default resid_pdrop to 0.1 when the key is absent (transformers GPT2Config; GPTBigCodeConfig too).
GPT2 = FamilyTraits(norm="layernorm", norm_bias=True, qkv_bias=True, out_bias=True, mlp_bias=True, gated_mlp=False,
                    tied=key("tie_word_embeddings", default=True), position="learned", ffn=_four_h,
                    dropout_default=0.1)
QWEN_MOE = replace(QWEN3, moe="qwen")
DEEPSEEK = replace(LLAMA, mla=True, moe="deepseek", shared="deepseek", router_bias=_deepseek_router_bias,
                   group_limited=_deepseek_group_limited, mtp_key="num_nextn_predict_layers")
DSA = replace(DEEPSEEK, moe="mlp_layer_types", indexer=True, router_bias=True, group_limited=True)
QWEN_NEXT = replace(QWEN3, moe="qwen", shared="qwen", shared_gate=True, windows="layer_types",
                    default_layer_types=_every(4, "full_attention", "linear_attention"),
                    linear_attention="gated_deltanet",
                    attention_output_gate=True,
                    # Qwen3-Next and Qwen3.5 ship one MTP module (mtp_num_hidden_layers: fc over the two normed inputs,
                    # a full-attention MoE layer, a norm: vLLM's qwen3_next_mtp.py); Megatron-Bridge maps the field to
                    # mtp_num_layers (model_bridge.py) and its Qwen3.5 recipes train it (examples/models/qwen/qwen35_vl)
                    mtp_key="mtp_num_hidden_layers")
COHERE = replace(LLAMA, norm="layernorm", norms_per_layer=1, parallel_residual=True,
                 qk_norm=lambda c: "full" if c.get("use_qk_norm") else False,
                 tied=key("tie_word_embeddings", default=True))
OLMO2 = replace(LLAMA, qk_norm="full", post_norm_only=True)

FAMILIES: dict[str, FamilyTraits] = {
    # -- dense, Llama-style (RMSNorm, SwiGLU, RoPE) -----------------------------------------------
    "llama": LLAMA,
    "mistral": MISTRAL,
    "ministral": replace(LLAMA, windows="layer_types", default_layer_types=lambda n: ["sliding_attention"] * n),
    "ministral3": MISTRAL,
    "qwen2": QWEN2,
    "qwen2_5_vl_text": QWEN2,
    "qwen3": QWEN3,
    "qwen3_vl_text": QWEN3,
    "granite": LLAMA,
    "helium": LLAMA,
    "internlm3": LLAMA,
    "arcee": replace(LLAMA, gated_mlp=False),
    "nanochat": replace(LLAMA, norm_weight=False, gated_mlp=False),
    "granite_swa": replace(LLAMA, attention_sinks=True, tied=key("tie_word_embeddings", default=True),
                           windows="layer_types"),
    "vaultgemma": replace(GEMMA, windows="layer_types", default_layer_types=_alternating),
    "youtu": replace(LLAMA, mla=True, tied=key("tie_word_embeddings", default=True)),
    "smollm3": replace(LLAMA, tied=key("tie_word_embeddings", default=True)),
    "ernie4_5": replace(LLAMA, qkv_bias=key("use_bias"), out_bias=key("use_bias"), mlp_bias=key("use_bias"),
                        tied=key("tie_word_embeddings", default=True)),
    "seed_oss": replace(LLAMA, qkv_bias=key("attention_bias", default=True), out_bias=key("attention_out_bias")),
    "hunyuan_v1_dense": replace(LLAMA, qk_norm=lambda c: "head" if c.get("use_qk_norm", True) else False),
    "phi3": MISTRAL,
    "glm": replace(LLAMA, qkv_bias=key("attention_bias", default=True), out_bias=False, mlp_bias=False),
    "glm4": replace(LLAMA, qkv_bias=key("attention_bias", default=True), out_bias=False, mlp_bias=False,
                    norms_per_layer=4),
    "gemma": GEMMA,
    "gemma2": replace(GEMMA, norms_per_layer=4, windows="layer_types", default_layer_types=_alternating),
    "gemma3_text": replace(GEMMA, norms_per_layer=4, qk_norm="head", windows="layer_types",
                           default_layer_types=_every(6, "full_attention")),
    "olmo": replace(LLAMA, norm="layernorm", norm_weight=False),
    "olmo2": OLMO2,
    "olmo3": replace(OLMO2, windows="layer_types", default_layer_types=_every(4, "full_attention")),
    "exaone4": replace(LLAMA, qk_norm="head", post_norm_only=True, windows="layer_types",
                       default_layer_types=_every(4, "full_attention")),
    "cohere": COHERE,
    "cohere2": replace(COHERE, qk_norm=False, windows="layer_types",
                       default_layer_types=_every(4, "full_attention")),
    "cohere2_moe": replace(COHERE, qk_norm=False, windows="layer_types",
                           default_layer_types=_every(4, "full_attention"),
                           moe="mlp_layer_types", shared="deepseek",
                           aliases={"ffn_size": ("prefix_dense_intermediate_size",),
                                    "expert_ffn_size": ("intermediate_size",),
                                    "num_shared_experts": ("num_shared_experts",)}),
    "nemotron": replace(LLAMA, norm="layernorm", norm_bias=True, gated_mlp=False),
    "starcoder2": replace(LLAMA, norm="layernorm", norm_bias=True, qkv_bias=key("use_bias", default=True),
                          out_bias=key("use_bias", default=True), mlp_bias=key("use_bias", default=True),
                          gated_mlp=False, tied=key("tie_word_embeddings", default=True), windows="all"),
    "stablelm": replace(LLAMA, norm="layernorm", norm_bias=True, qkv_bias=key("use_qkv_bias"), out_bias=False,
                        mlp_bias=False, parallel_residual=key("use_parallel_residual"),
                        norms_per_layer=lambda c: 1 if c.get("use_parallel_residual") else 2,
                        qk_norm=lambda c: "full" if c.get("qk_layernorm") else False),
    "phi": replace(LLAMA, norm="layernorm", norm_bias=True, norms_per_layer=1, qkv_bias=True, out_bias=True,
                   mlp_bias=True, gated_mlp=False, parallel_residual=True, output_bias=True,
                   qk_norm=lambda c: "head" if c.get("qk_layernorm") else False, qk_norm_bias=True),
    # -- dense, GPT-style (LayerNorm with bias, biased GEMMs, plain MLP) -------------------------------
    "gpt2": GPT2,
    "gpt_bigcode": replace(GPT2, kv_heads=_multi_query),
    "gptj": replace(GPT2, norms_per_layer=1, qkv_bias=False, out_bias=False, position="rope",
                    tied=key("tie_word_embeddings"), parallel_residual=True, output_bias=True, dropout_default=0.0),
    "gpt_neox": replace(GPT2, qkv_bias=key("attention_bias", default=True),
                        out_bias=key("attention_bias", default=True),
                        position="rope", tied=key("tie_word_embeddings"), ffn=None,
                        parallel_residual=key("use_parallel_residual", default=True), dropout_default=0.0),
    "codegen": replace(GPT2, norms_per_layer=1, qkv_bias=False, out_bias=False, position="rope",
                       tied=key("tie_word_embeddings"), parallel_residual=True, output_bias=True, dropout_default=0.0),
    "persimmon": replace(GPT2, position="rope", tied=key("tie_word_embeddings"), ffn=None, dropout_default=0.0,
                         qk_norm=lambda c: "head" if c.get("qk_layernorm", True) else False, qk_norm_bias=True),
    "mpt": replace(GPT2, norm_bias=_mpt_bias, qkv_bias=_mpt_bias, out_bias=_mpt_bias, mlp_bias=_mpt_bias, tied=True,
                   position=_mpt_position, ffn=_mpt_ffn, dropout_default=0.0),
    "bloom": replace(GPT2, position="alibi", embedding_norm=True, dropout_default=0.0),
    "opt": replace(GPT2, norm_weight=_opt_affine, norm_bias=_opt_affine, qkv_bias=key("enable_bias", default=True),
                   out_bias=key("enable_bias", default=True), mlp_bias=key("enable_bias", default=True),
                   final_norm=_opt_final_norm, position_offset=2, ffn=None, refuse=_opt_refuse,
                   dropout_default=0.0, aliases={"dropout": ("dropout",)}),
    "falcon": replace(GPT2, qkv_bias=key("bias"), out_bias=key("bias"), mlp_bias=key("bias"),
                      position=lambda c: "alibi" if c.get("alibi") else "rope", kv_heads=_falcon_kv,
                      norms_per_layer=_falcon_norms, parallel_residual=_falcon_parallel, ffn=_four_h,
                      dropout_default=0.0),
    # -- Mixture of Experts ---------------------------------------------------------------------
    "mixtral": replace(MISTRAL, moe="all"),
    "phimoe": replace(MISTRAL, moe="all", norm="layernorm", norm_bias=True, output_bias=key("lm_head_bias")),
    "qwen2_moe": replace(QWEN2, moe="qwen", shared="qwen", shared_gate=True),
    "qwen3_moe": QWEN_MOE,
    "qwen3_vl_moe_text": QWEN_MOE,
    "olmoe": replace(OLMO2, moe="all", post_norm_only=False),
    "granitemoe": replace(LLAMA, moe="all"),
    "granitemoe_swa": replace(LLAMA, moe="all", attention_sinks=True, tied=key("tie_word_embeddings", default=True),
                              windows="layer_types", shared="width", shared_width_key="shared_intermediate_size"),
    "flex_olmo": replace(OLMO2, moe="all"),
    "granitemoeshared": replace(LLAMA, moe="all", shared="width", shared_width_key="shared_intermediate_size"),
    "minimax_m2": replace(LLAMA, moe="all", qk_norm=_minimax_qk, router_bias=True),
    "hunyuan_v1_moe": replace(LLAMA, moe="all", shared="width", shared_width_key="intermediate_size",
                              qk_norm=lambda c: "head" if c.get("use_qk_norm", True) else False,
                              aliases={"experts_per_token": ("moe_topk",)}),
    "ernie4_5_moe": replace(LLAMA, moe="ernie", shared="deepseek", router_bias=True, qkv_bias=key("use_bias"),
                            out_bias=key("use_bias"), mlp_bias=key("use_bias"),
                            tied=key("tie_word_embeddings", default=True),
                            aliases={"num_experts": ("moe_num_experts",), "experts_per_token": ("moe_k",),
                                     "num_shared_experts": ("moe_num_shared_experts",)}),
    "dbrx": replace(LLAMA, norm="layernorm", moe="all", flatten=("attn_config", "ffn_config"),
                    aliases={"num_kv_heads": ("kv_n_heads",), "num_experts": ("moe_num_experts",),
                             "experts_per_token": ("moe_top_k",), "expert_ffn_size": ("ffn_hidden_size",)}),
    "llama4_text": replace(LLAMA, moe="llama4", shared="width", shared_width_key="intermediate_size",
                           windows="layer_types", window_key="attention_chunk_size", window_kind="chunked",
                           default_layer_types=_every(4, "full_attention", "chunked_attention"),
                           aliases={"ffn_size": ("intermediate_size_mlp",), "expert_ffn_size": ("intermediate_size",)}),
    "gpt_oss": replace(LLAMA, moe="all", qkv_bias=key("attention_bias", default=True),
                       out_bias=key("attention_bias", default=True), router_bias=True, expert_bias=True,
                       attention_sinks=True, windows="layer_types", default_layer_types=_alternating),
    "glm4_moe": replace(LLAMA, moe="deepseek", shared="deepseek", router_bias=True, group_limited=True,
                        qk_norm=lambda c: "head" if c.get("use_qk_norm") else False,
                        mtp_key="num_nextn_predict_layers"),
    "dots1": replace(QWEN3, moe="deepseek", shared="deepseek", router_bias=True, group_limited=True),
    "afmoe": replace(LLAMA, norms_per_layer=4, qk_norm="head", attention_output_gate=True, moe="deepseek",
                     first_dense_key="num_dense_layers", shared="deepseek", router_bias=True, windows="layer_types",
                     default_layer_types=_every(4, "full_attention"),
                     aliases={"num_shared_experts": ("num_shared_experts",)}),
    "solar_open": replace(LLAMA, moe="all", shared="deepseek", router_bias=True, group_limited=True),
    "exaone_moe": replace(LLAMA, qk_norm="head", windows="layer_types", default_layer_types=_every(4, "full_attention"),
                          moe="mlp_layer_types", shared="deepseek", router_bias=True, group_limited=True,
                          aliases={"num_shared_experts": ("num_shared_experts",)}),
    "glm4_moe_lite": replace(DEEPSEEK, moe="mlp_layer_types", router_bias=True, group_limited=True),
    "deepseek_v2": DEEPSEEK,
    # DeepseekV3TopkRouter always holds e_score_correction_bias (transformers 5.24), whatever topk_method says.
    "deepseek_v3": replace(DEEPSEEK, router_bias=True),
    "kimi_k2": replace(DEEPSEEK, router_bias=True),
    "deepseek_v32": DSA,
    "glm_moe_dsa": DSA,
    # -- hybrid linear attention (counted, not priced) ------------------------------------------
    "qwen3_next": QWEN_NEXT,
    "minimax": replace(LLAMA, moe="all", windows="layer_types", linear_attention="lightning",
                       default_layer_types=lambda n: ["full_attention" if (i + 1) % 2 else "linear_attention"
                                                      for i in range(n)]),
    "qwen3_5_text": replace(QWEN_NEXT, moe="none", attention_output_gate=key("attn_output_gate", default=True)),
    "qwen3_5_moe_text": replace(QWEN_NEXT, attention_output_gate=key("attn_output_gate", default=True)),
}
"""Every model_type paraplan reads, with its traits."""

TEXT_CONFIG_WRAPPERS: dict[str, str] = {
    "gemma3": "gemma3_text",
    "llama4": "llama4_text",
    "mistral3": "mistral",
    "qwen2_5_vl": "qwen2_5_vl_text",
    "qwen3_vl": "qwen3_vl_text",
    "qwen3_vl_moe": "qwen3_vl_moe_text",
    "qwen3_5": "qwen3_5_text",
    "qwen3_5_moe": "qwen3_5_moe_text",
    "kimi_k25": "deepseek_v3",
}
"""Multimodal checkpoints whose ``text_config`` is the decoder paraplan reads, with the text model_type its
transformers config defaults to (the text_config's own model_type wins). Vision and audio towers are not
counted."""

_SSM_HYBRID = "its layers mix Mamba state-space blocks with attention, a layer structure ModelSpec does not describe"
REFUSED: dict[str, str] = {
    "jamba": _SSM_HYBRID, "bamba": _SSM_HYBRID, "nemotron_h": _SSM_HYBRID, "falcon_h1": _SSM_HYBRID,
    "granitemoehybrid": _SSM_HYBRID, "zamba": _SSM_HYBRID, "zamba2": _SSM_HYBRID,
    "mamba": "it is a pure state-space model (no attention)", "mamba2": "it is a pure state-space model (no attention)",
    "falcon_mamba": "it is a pure state-space model (no attention)", "rwkv": "it is a recurrent (RWKV) model",
    "recurrent_gemma": "its recurrent (RG-LRU) blocks are not modelled", "xlstm": "its xLSTM blocks are not modelled",
    "lfm2": "its short-convolution blocks are not modelled",
    "lfm2_moe": "its short-convolution blocks are not modelled",
    "kimi_linear": "its Kimi Delta Attention layers are not modelled",
    "gemma3n": "its per-layer embeddings and AltUp streams are not modelled",
    "apertus": "its xIELU activation carries trained parameters that are not modelled",
    "jetmoe": "its mixture-of-attention-heads layers are not modelled",
    "bitnet": "its sub-norms inside attention and MLP are not modelled",
    "t5": "it is an encoder-decoder model; paraplan plans decoder-only transformers",
    "bart": "it is an encoder-decoder model; paraplan plans decoder-only transformers",
    "bert": "it is an encoder-only model; paraplan plans decoder-only transformers",
    "roberta": "it is an encoder-only model; paraplan plans decoder-only transformers",
}
"""Known model_types paraplan does not read, with the reason (said instead of 'not supported')."""
