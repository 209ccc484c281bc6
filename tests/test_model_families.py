"""Every family paraplan reads, counted against transformers as the oracle, plus fuzzing of the reader.

The oracle: transformers' own config class gives a config (its defaults, shrunk to small widths so the
model builds in milliseconds on the meta device), ``config.to_dict()`` is what paraplan reads, and
``AutoModelForCausalLM.from_config`` under ``torch.device("meta")`` is what it must count: every parameter
(shared tensors once) plus the learned router biases it keeps as buffers (DeepSeek-style routers hold
``e_score_correction_bias`` so: it is not trained by gradients, yet it is a checkpoint weight and part of the
published counts; constant tables registered as buffers, such as MiniMax-01's decay tables, are not). MTP modules,
which transformers does not build, are outside ``total_params``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paraplan.errors import InputError
from paraplan.model_specs.hf_config import load_model, model_from_config, supported_model_types
from paraplan.model_specs.model_families import FAMILIES, TEXT_CONFIG_WRAPPERS

SHARED_CONFIGS = Path(__file__).resolve().parents[2] / "shared" / "data" / "serving" / "model_configs"

# Small widths, applied to whichever of these keys a family's default config has (so every key keeps
# its family's meaning): 64-wide, 4 heads of 16, 2 KV heads, 8 experts of which 2 are active.
SMALL: dict[str, Any] = {"hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
         "shared_expert_intermediate_size": 48, "vocab_size": 1000, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "num_experts": 8, "n_routed_experts": 8,
         "num_local_experts": 8, "num_experts_per_tok": 2, "kv_lora_rank": 32, "q_lora_rank": 48,
         "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16, "num_hidden_layers": 6, "n_group": 2,
         "topk_group": 1, "d_model": 64, "n_embd": 64, "n_head": 4, "n_layer": 6, "n_heads": 4, "n_layers": 6,
         "ffn_dim": 128, "n_inner": 128, "intermediate_size_mlp": 96, "moe_num_experts": 8, "moe_k": 2,
         "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2,
         "linear_num_value_heads": 4, "index_n_heads": 4, "index_head_dim": 16, "shared_intermediate_size": 40,
         "ffn_hidden_size": 128, "attention_chunk_size": 64, "sliding_window": 64,
         "max_position_embeddings": 256, "n_positions": 256, "max_seq_len": 256, "moe_topk": 2,
         "n_shared_experts": 1, "word_embed_proj_dim": 64}
# (MPT has none: transformers' port hard-codes bias=False and a 4h MLP, while paraplan follows llm-foundry's
# no_bias and expansion_ratio, which agree with it for every released MPT.)
# Family-specific switches the default config leaves off, so the oracle sees each trait the reader handles.
VARIANTS: dict[str, list[dict[str, Any]]] = {
    "llama": [{"attention_bias": True, "mlp_bias": True}, {"tie_word_embeddings": True}],
    "qwen2_moe": [{"mlp_only_layers": [1], "decoder_sparse_step": 2}],
    "qwen3_moe": [{"mlp_only_layers": [0, 3]}],
    "cohere": [{"use_qk_norm": True}],
    "phi": [{"qk_layernorm": True}],
    "stablelm": [{"qk_layernorm": True}, {"use_parallel_residual": True}, {"use_qkv_bias": True}],
    "glm4_moe": [{"use_qk_norm": True}],
    "falcon": [{"new_decoder_architecture": True, "num_kv_heads": 2},
               {"multi_query": False, "parallel_attn": False, "bias": True, "num_kv_heads": 4}, {"alibi": True}],
    "gpt_bigcode": [{"multi_query": False}],
    "opt": [{"enable_bias": False}, {"layer_norm_elementwise_affine": False}],
    "granitemoeshared": [{"shared_intermediate_size": 0}],
    "llama4_text": [{"interleave_moe_layer_step": 2, "moe_layers": None}],
    "deepseek_v3": [{"q_lora_rank": None}, {"first_k_dense_replace": 2}],
    "ernie4_5_moe": [{"moe_layer_interval": 2}],
    "phimoe": [{"lm_head_bias": True}],
    "seed_oss": [{"attention_out_bias": True}],
    "gemma2": [{"tie_word_embeddings": False}],
    "cohere2_moe": [{"num_shared_experts": 2, "mlp_layer_types": ["dense"] + ["sparse"] * 5,
                     "prefix_dense_intermediate_size": 96}],
}


def _shrunk(source: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """The default config with SMALL applied to the keys it has; per-layer lists re-derived (None) or cut."""
    changes = {key: value for key, value in SMALL.items() if key in source}
    changes.update(extra)
    layers = changes.get("num_hidden_layers", changes.get("n_layer", changes.get("n_layers")))
    for key in ("layer_types", "mlp_layer_types", "no_rope_layers", "moe_layers", "indexer_types"):
        if key in source and key not in extra:
            changes[key] = None
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if key in source:
            changes[key] = None
    if source.get("sliding_window") is None and "sliding_window" in changes and "sliding_window" not in extra:
        changes["sliding_window"] = None  # keep a family's windows off when its default has none
    assert layers, "every family states a layer count"
    return changes


def _router_bias_buffers(model) -> int:
    """The learned router biases transformers keeps as buffers (DeepSeek-V3's e_score_correction_bias and its
    kin): checkpoint weights, unlike the constant tables some models register (MiniMax-01's decay tables)."""
    return sum(b.numel() for name, b in model.named_buffers() if name.endswith("e_score_correction_bias"))


def _oracle(model_type: str, extra: dict[str, Any], shrink: bool = True):
    """(config dict as paraplan reads it, transformers' count of the decoder's checkpoint tensors)."""
    transformers = pytest.importorskip("transformers", reason="the oracle needs transformers (extra: oracle)")
    torch = pytest.importorskip("torch", reason="the oracle needs torch (extra: oracle)")
    outer = transformers.AutoConfig.for_model(model_type)
    text = getattr(outer, "text_config", None) if model_type in TEXT_CONFIG_WRAPPERS else None
    base = text if text is not None else outer
    values = base.to_dict()
    if shrink:
        values.update(_shrunk(values, extra))
    for nested in FAMILIES[model_type].flatten if shrink and model_type in FAMILIES else ():  # DBRX's attn/ffn configs
        inner = {k: v for k, v in values[nested].items() if k not in ("model_type", "_name_or_path")}
        # DbrxAttention reads rope_theta from attn_config, which transformers 5.24's default leaves unset.
        values[nested] = {**inner, **{k: v for k, v in SMALL.items() if k in inner}, "rope_theta": 10000.0,
                          "kv_n_heads": 2} if nested == "attn_config" else {**inner, **{
                              k: v for k, v in SMALL.items() if k in inner}, "moe_top_k": 2}
    values.pop("transformers_version", None)
    if text is not None:  # the wrapper's own tie_word_embeddings decides for the whole checkpoint
        values["tie_word_embeddings"] = getattr(outer, "tie_word_embeddings", False)
    config = type(base)(**{k: v for k, v in values.items() if k != "model_type"})
    with torch.device("meta"):
        try:
            model = transformers.AutoModelForCausalLM.from_config(config)
            head = 0
        except ValueError:  # Qwen-VL text configs build only as a text model: add its untied output head
            model = transformers.AutoModel.from_config(config)
            head = 0 if values.get("tie_word_embeddings") else config.vocab_size * config.hidden_size
    count = head + sum(p.numel() for p in model.parameters()) + _router_bias_buffers(model)
    read = config.to_dict()
    if text is not None:  # read through the wrapper, as a multimodal checkpoint's config.json is
        read = {"model_type": model_type, "tie_word_embeddings": outer.tie_word_embeddings, "text_config": read}
    return read, count, model


ORACLE_CASES = [(t, {}) for t in sorted(FAMILIES) if t != "kimi_k2"] + \
    [(t, {}) for t in sorted(TEXT_CONFIG_WRAPPERS) if t != "kimi_k25"] + \
    [(t, extra) for t, extras in VARIANTS.items() for extra in extras]


@pytest.mark.parametrize("model_type, extra", ORACLE_CASES, ids=[f"{t}-{i}" for i, (t, _) in enumerate(ORACLE_CASES)])
def test_total_params_equal_transformers(model_type, extra):
    config, expected, _ = _oracle(model_type, extra)
    assert model_from_config(config, model_type).total_params() == expected


def _expert_mass(model) -> int:
    """Parameters of all routed experts transformers built (tensors under an ``experts`` module)."""
    return sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)


MOE_TYPES = sorted(t for t, traits in FAMILIES.items() if traits.moe != "none" and t != "kimi_k2")


@pytest.mark.parametrize("model_type", MOE_TYPES)
def test_active_params_are_total_less_the_unvisited_experts(model_type):
    """Oracle: transformers' total less (E - k) / E of its routed-expert tensors."""
    config, expected, model = _oracle(model_type, {})
    spec = model_from_config(config, model_type)
    unvisited = _expert_mass(model) * (spec.num_experts - spec.experts_per_token) // spec.num_experts
    assert unvisited > 0 and spec.num_moe_layers > 0
    assert spec.active_params() == expected - unvisited


def test_every_supported_type_ran_the_oracle():
    """The count of types read comes from the table, and each of them (the Kimi aliases through DeepSeek-V3)
    is counted exactly against transformers here, in one pass."""
    exact = set()
    for model_type in supported_model_types():
        oracle_type = {"kimi_k2": "deepseek_v3", "kimi_k25": "deepseek_v3"}.get(model_type, model_type)
        config, expected, _ = _oracle(oracle_type, {})
        if oracle_type != model_type:  # read the alias's own spelling of the same config
            config = {**config, "model_type": "kimi_k2"}
            config = {"model_type": "kimi_k25", "text_config": config} if model_type == "kimi_k25" else config
        if model_from_config(config, model_type).total_params() == expected:
            exact.add(model_type)
    assert exact == set(supported_model_types())
    assert len(exact) >= 45


def test_kimi_aliases_read_as_deepseek_v3():
    config, expected, _ = _oracle("deepseek_v3", {})
    base = model_from_config(config, "v3")
    assert model_from_config({**config, "model_type": "kimi_k2"}, "k2").total_params() == expected
    wrapped = model_from_config({"model_type": "kimi_k25", "text_config": {**config, "model_type": "kimi_k2"}}, "k25")
    assert wrapped.total_params() == base.total_params() == expected
    assert "encoder towers not counted" in wrapped.name


# transformers 5.24's own defaults for these do not build (an unset head_dim, KV heads, rope_theta or expert
# count, or no top-k), so their full-size check uses the small config only.
UNBUILDABLE_DEFAULTS = {"dbrx", "dots1", "hunyuan_v1_dense", "hunyuan_v1_moe", "ministral", "nemotron", "deepseek_v2"}
FULL_SIZE = sorted(t for t in set(FAMILIES) | set(TEXT_CONFIG_WRAPPERS)
                   if t not in UNBUILDABLE_DEFAULTS | {"kimi_k2", "kimi_k25"})


@pytest.mark.parametrize("model_type", FULL_SIZE)
def test_full_size_default_config_equals_transformers(model_type):
    """Each family's default config as transformers ships it (billions of parameters, on the meta device)."""
    config, expected, _ = _oracle(model_type, {}, shrink=False)
    assert model_from_config(config, model_type).total_params() == expected


# -- real checkpoints (../shared/data/serving/model_configs) ------------------------------------------------
def _real_configs() -> list[Path]:
    return sorted(SHARED_CONFIGS.glob("*_config.json")) if SHARED_CONFIGS.is_dir() else []


# What the real configs must say beyond their counts: refused-for-planning features and weight formats.
REAL_UNPRICED = {"Qwen--Qwen3.5-397B-A17B": ("Gated DeltaNet linear attention in 45 of 60 layers",
                                             "the gated attention output"),
                 "zai-org--GLM-5": ("the sparse-attention indexer (DSA)",)}
REAL_WEIGHTS = {"MiniMaxAI--MiniMax-M2.5": ("fp8", "float8_e4m3fn", (128, 128)),
                "Qwen--Qwen3-235B-A22B-FP8": ("fp8", "float8_e4m3fn", (128, 128)),
                "deepseek-ai--DeepSeek-V3": ("fp8", "float8_e4m3fn", (128, 128)),
                "deepseek-ai--DeepSeek-R1": ("fp8", "float8_e4m3fn", (128, 128)),
                "Qwen--Qwen3-32B-FP8": ("fp8", "float8_e4m3fn", (128, 128)),
                "moonshotai--Kimi-K2.5": ("compressed-tensors", "int4", (32,)),
                "openai--gpt-oss-120b": ("mxfp4", "mxfp4", (32,))}


def _transformers_count(config: dict[str, Any]) -> int:
    """transformers' count of a real config's text decoder (vision towers left out by name)."""
    transformers = pytest.importorskip("transformers", reason="the oracle needs transformers (extra: oracle)")
    torch = pytest.importorskip("torch", reason="the oracle needs torch (extra: oracle)")
    skip = ("model_type", "transformers_version", "auto_map", "quantization_config")
    built = transformers.AutoConfig.for_model(config["model_type"],
                                              **{k: v for k, v in config.items() if k not in skip})
    with torch.device("meta"):
        try:
            model = transformers.AutoModelForCausalLM.from_config(built)
        except ValueError:  # a multimodal checkpoint: build it whole, count all but its vision tower
            model = transformers.AutoModelForImageTextToText.from_config(built)
    towers = ("visual", "vision", "multi_modal_projector", "mm_projector")
    return _router_bias_buffers(model) + sum(p.numel() for name, p in model.named_parameters()
                                             if not any(tower in name for tower in towers))


@pytest.mark.parametrize("path", _real_configs() or [pytest.param(None, marks=pytest.mark.skip(
    reason=f"{SHARED_CONFIGS} is absent (the project's shared folder beside the checkout)"))],
    ids=lambda p: p.name.removesuffix("_config.json") if p else "absent")
def test_real_configs_read_exactly(path):
    stem = path.name.removesuffix("_config.json")
    spec = load_model(str(path))
    assert spec.total_params() == _transformers_count(json.loads(path.read_text()))
    assert spec.unpriced_features == REAL_UNPRICED.get(stem, ())
    if stem in REAL_WEIGHTS:
        assert (spec.weights.method, spec.weights.weight_format, spec.weights.block_size) == REAL_WEIGHTS[stem]
    else:  # NVIDIA's FP8 Llama keeps its format in hf_quant_config.json, which this folder does not hold
        assert spec.weights is None


def test_unpriced_models_are_refused_when_a_job_is_built():
    from paraplan.planner.job import TrainingJob

    config, _, _ = _oracle("qwen3_next", {})
    spec = model_from_config(config, "qwen3-next")
    assert spec.linear_attention_layers == 5  # every 4th layer is full attention: index 3 of 0-5
    with pytest.raises(InputError, match="Gated DeltaNet") as info:
        TrainingJob(model=spec, seq_len=4096, global_batch=8)
    assert "\n" not in str(info.value) and len(str(info.value)) < 300
    dsa, _, _ = _oracle("glm_moe_dsa", {})
    glm5 = model_from_config(dsa, "glm5")
    with pytest.raises(InputError, match="indexer"):
        TrainingJob(model=glm5, seq_len=4096, global_batch=8)
    assert math.isnan(glm5.model_flops_per_token(4096)) and math.isnan(spec.model_flops_per_token(4096))


def test_gated_deltanet_and_indexer_counts_by_hand():
    """Qwen3-Next's mixer and GLM-5's indexer, from the shapes listed in hf_layers (small oracle config)."""
    config, _, _ = _oracle("qwen3_next", {})
    spec = model_from_config(config, "q")
    h, nk, dk, nv, dv, kernel = 64, 2, 16, 4, 16, 4  # SMALL's linear_* widths; the default conv kernel
    key, value = nk * dk, nv * dv
    assert spec.linear_attention_params == (h * (2 * key + 2 * value) + h * 2 * nv + (2 * key + value) * kernel
                                            + 2 * nv + dv + value * h)
    dsa, _, _ = _oracle("glm_moe_dsa", {})
    heads, dim, q_lora = 4, 16, 48
    assert model_from_config(dsa, "g").indexer_params == q_lora * heads * dim + h * dim + 2 * dim + h * heads


def test_config_readers_fill_the_mixer_shapes_a_plan_leaves_out():
    """ModelSpec carries the mixer shapes serving prices, read from the whole config.json (a wrapper's
    text_config too); a training plan's model.shape leaves them out and reads back without them."""
    import dataclasses

    from paraplan.model_specs.mixers import mixer_shapes
    from paraplan.model_specs.model_spec import NO_MIXERS
    from paraplan.planner.plan import model_from_shape, model_shape

    dsa = {**BASES[1], "model_type": "deepseek_v32", "index_n_heads": 4, "index_head_dim": 16, "index_topk": 64}
    for config in (BASES[2], dsa):
        spec = model_from_config(config, "m")
        assert spec.mixers == mixer_shapes(config) != NO_MIXERS
        shape = json.loads(json.dumps(model_shape(spec)))
        assert "mixers" not in shape
        assert model_from_shape(spec.name, shape) == dataclasses.replace(spec, mixers=NO_MIXERS)
        with pytest.raises(InputError, match="mixers is not a plan field"):
            model_from_shape("m", {**shape, "mixers": {}})
    assert model_from_config(dsa, "m").mixers.index_topk == 64
    assert model_from_config(BASES[2], "m").mixers.linear_key_heads == 2
    assert model_from_config(BASES[0], "llama").mixers == NO_MIXERS


# -- what the new traits do and do not change in the FLOPs --------------------------------------------------
def test_norms_qk_norms_and_biases_add_parameters_not_gemm_flops():
    llama, _, _ = _oracle("llama", {})
    gemma2, _, _ = _oracle("gemma2", {"sliding_window": None, "tie_word_embeddings": False})
    a, b = model_from_config(llama, "l"), model_from_config(gemma2, "g")
    assert (a.hidden_size, a.ffn_size, a.q_width, a.kv_width) == (b.hidden_size, b.ffn_size, b.q_width, b.kv_width)
    assert b.total_params() - a.total_params() == 2 * a.num_layers * a.hidden_size  # two post-norms per layer
    assert b.model_flops_per_token(128) == a.model_flops_per_token(128)


def test_attention_output_gate_doubles_the_query_projection_flops():
    config, _, _ = _oracle("qwen3_next", {})
    spec = model_from_config(config, "q")
    import dataclasses
    spec = dataclasses.replace(spec, linear_attention_layers=0, unpriced_features=())
    plain = dataclasses.replace(spec, attention_output_gate=False)
    extra = spec.attention_weight_params() - plain.attention_weight_params()
    assert extra == spec.hidden_size * spec.q_width
    assert spec.layer_gemm_flops_per_token() - plain.layer_gemm_flops_per_token() == 2 * extra


def test_llama4_chunked_attention_is_priced_as_a_window():
    """Llama 4: three of every four layers attend within attention_chunk_size keys (each query sees at most
    that many: priced as a sliding window, an upper bound); every fourth layer (NoPE) attends fully."""
    config, _, _ = _oracle("llama4_text", {})
    spec = model_from_config(config, "l4")
    assert (spec.window_kind, spec.sliding_window, spec.sliding_layers) == ("chunked", 64, 5)  # 6 layers: 3 is full
    seq = 4096
    assert spec.attention_span(seq) == (5 * 64 + 1 * seq) / 6


# -- fuzzing: only InputError, one short line, fast ---------------------------------------------------------
JSON_SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**400)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
FUZZ_KEYS = sorted({"model_type", "text_config", "topk_method", "rotary_dim", "qk_norm_type", "use_routing_bias",
                    "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size", "layer_types",
                    "sliding_window", "mlp_only_layers", "decoder_sparse_step", "moe_layers", "mlp_layer_types",
                    "first_k_dense_replace", "moe_layer_freq", "n_group", "topk_group", "num_experts",
                    "n_routed_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
                    "n_shared_experts", "shared_expert_intermediate_size", "quantization_config", "kv_lora_rank",
                    "q_lora_rank", "index_n_heads", "indexer_types", "linear_num_value_heads", "no_rope_layers",
                    "sliding_window_pattern", "attn_config", "ffn_config", "tie_word_embeddings", "attention_bias",
                    "new_decoder_architecture", "word_embed_proj_dim", "moe_layer_end_index", "attention_chunk_size",
                    "full_attention_interval", "use_qk_norm", "resid_pdrop"})
BASES = [
    {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
     "intermediate_size": 128, "vocab_size": 100},
    {"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
     "intermediate_size": 128, "vocab_size": 100, "n_routed_experts": 8, "num_experts_per_tok": 2,
     "moe_intermediate_size": 32, "kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 8,
     "qk_nope_head_dim": 8, "v_head_dim": 8, "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 2,
     "topk_group": 1, "topk_method": "noaux_tc", "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                                                          "weight_block_size": [128, 128]}},
    {"model_type": "qwen3_5_moe", "text_config": {
        "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": 100, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32, "linear_num_key_heads": 2, "linear_key_head_dim": 8,
        "linear_num_value_heads": 4, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4}},
    {"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
     "intermediate_size": 128, "vocab_size": 100, "sliding_window": 16, "sliding_window_pattern": 2},
    {"model_type": "falcon", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100},
    {"model_type": "llama4", "text_config": {
        "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 32,
        "intermediate_size_mlp": 96, "vocab_size": 100, "num_local_experts": 4, "num_experts_per_tok": 1,
        "attention_chunk_size": 32}},
]


def _read_or_refuse(config: Any) -> None:
    started = time.perf_counter()
    try:
        spec = model_from_config(config, "fuzz")
        assert spec.total_params() > 0 and spec.active_params() > 0
    except InputError as exc:
        message = str(exc)
        assert "\n" not in message and 0 < len(message) < 300, message
    assert time.perf_counter() - started < 0.25


# The real checkpoints' configs as fuzz seeds too, when the shared folder is there.
FUZZ_BASES = BASES + [json.loads(path.read_text()) for path in _real_configs()]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(FUZZ_BASES),
       changes=st.lists(st.tuples(st.sampled_from(FUZZ_KEYS), JSON_VALUES), max_size=4), inner=st.booleans())
def test_mutated_configs_give_a_spec_or_one_input_error(base, changes, inner):
    config = json.loads(json.dumps(base))
    target = config["text_config"] if inner and "text_config" in config else config
    for key, value in changes:
        target[key] = value
    _read_or_refuse(config)


@settings(max_examples=300, deadline=None)
@given(config=st.dictionaries(st.sampled_from(FUZZ_KEYS), JSON_VALUES, max_size=12),
       model_type=st.sampled_from(supported_model_types()) | JSON_VALUES)
def test_arbitrary_dicts_give_a_spec_or_one_input_error(config, model_type):
    _read_or_refuse({**config, "model_type": model_type})


def test_deep_stacks_and_huge_lists_stay_fast():
    layers = 10_000
    deep = {**BASES[3], "num_hidden_layers": layers,
            "layer_types": ["sliding_attention", "full_attention"] * (layers // 2)}
    started = time.perf_counter()
    spec = model_from_config(deep, "deep")
    assert spec.sliding_layers == layers // 2 and time.perf_counter() - started < 0.25
    for key in ("layer_types", "mlp_only_layers", "no_rope_layers", "moe_layers"):
        huge = {**BASES[5]["text_config"], "model_type": "llama4_text", key: [0] * 10_000_000}
        if key == "mlp_only_layers":
            huge["model_type"] = "qwen3_moe"
        started = time.perf_counter()
        with pytest.raises(InputError, match=f"{key}|one per layer"):
            model_from_config(huge, "huge")
        assert time.perf_counter() - started < 0.25
    moe = {**BASES[1], "quantization_config": {"quant_method": "fp8", "modules_to_not_convert": ["x"] * 10_000_000}}
    with pytest.raises(InputError, match="modules_to_not_convert"):
        model_from_config(moe, "huge")


# -- quantized checkpoints ---------------------------------------------------------------------------------
@pytest.mark.parametrize("quant, expected", [
    ({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]},
     ("fp8", "float8_e4m3fn", 8.0, (128, 128), ("lm_head",))),
    ({"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]},
     ("mxfp4", "mxfp4", 4.0, (32,), ("model.layers.*.self_attn",))),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {
        "num_bits": 4, "type": "float", "group_size": 16}}}, "ignore": ["lm_head"]},
     ("compressed-tensors", "nvfp4", 4.0, (16,), ("lm_head",))),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, ("gptq", "int4", 4.0, (128,), ())),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
     ("bitsandbytes", "nf4", 4.0, (), ())),
])
def test_quantization_config_is_read_and_counts_stay_logical(quant, expected):
    plain = model_from_config(BASES[0], "plain")
    spec = model_from_config({**BASES[0], "quantization_config": quant}, "q")
    w = spec.weights
    assert (w.method, w.weight_format, w.bits, w.block_size, w.unquantized_modules) == expected
    assert spec.total_params() == plain.total_params()


def test_unknown_quantization_is_refused_with_the_known_ones():
    with pytest.raises(InputError, match="quant_method 'hqq' is not read.*fp8, mxfp4"):
        model_from_config({**BASES[0], "quantization_config": {"quant_method": "hqq"}}, "q")


def test_modelopt_hf_quant_config_beside_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(BASES[0]))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                                                          "exclude_modules": ["lm_head"]}}))
    w = load_model(str(tmp_path)).weights
    assert (w.method, w.weight_format, w.bits, w.block_size, w.unquantized_modules) == \
        ("modelopt", "nvfp4", 4.0, (16,), ("lm_head",))


# -- Hugging Face repo ids from the local cache --------------------------------------------------------------
def _fake_cache(root: Path, repo: str, config: dict[str, Any]) -> None:
    folder = root / f"models--{repo.replace('/', '--')}"
    revision = "0123456789abcdef0123456789abcdef01234567"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(revision)
    (folder / "snapshots" / revision).mkdir(parents=True)
    (folder / "snapshots" / revision / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("variable, subfolder", [("HF_HUB_CACHE", ""), ("HF_HOME", "hub")])
def test_repo_id_reads_the_local_hugging_face_cache(tmp_path, monkeypatch, variable, subfolder):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.setenv(variable, str(tmp_path))
    _fake_cache(tmp_path / subfolder if subfolder else tmp_path, "acme/Tiny-Llama", BASES[0])
    spec = load_model("acme/Tiny-Llama")
    assert spec.name == "acme/Tiny-Llama"
    assert spec.total_params() == model_from_config(BASES[0], "x").total_params()


def test_repo_id_not_in_the_cache_says_how_to_fetch_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(InputError) as info:
        load_model("meta-llama/Llama-3.1-8B")
    message = str(info.value)
    assert "not in the local Hugging Face cache" in message and "hf download meta-llama/Llama-3.1-8B config.json" \
        in message and "\n" not in message and len(message) < 300


def test_plan_shape_round_trips_quantized_and_new_fields():
    """A plan file stores every ModelSpec field as plain JSON that the shipped schema accepts."""
    from paraplan.planner.json_schema import schema_errors
    from paraplan.planner.plan import model_from_shape, model_shape, plan_schema

    config, _, _ = _oracle("gemma3_text", {})
    spec = model_from_config({**config, "quantization_config": {"quant_method": "mxfp4"}}, "g")
    shape = json.loads(json.dumps(model_shape(spec)))
    assert model_from_shape("g", shape) == spec
    assert schema_errors(shape, plan_schema()["properties"]["model"]["properties"]["shape"]) == []


@pytest.mark.parametrize("model_type", ["nemotron_h", "jamba", "mamba", "t5", "gemma3n"])
def test_known_unread_families_say_why(model_type):
    from paraplan.model_specs.model_families import REFUSED

    with pytest.raises(InputError) as info:
        model_from_config({**BASES[0], "model_type": model_type}, "m")
    message = str(info.value)
    assert message.endswith(REFUSED[model_type]) and "\n" not in message and len(message) < 300


def test_repo_id_pinned_to_a_revision_reads_its_only_snapshot(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    _fake_cache(tmp_path, "acme/Pinned", BASES[0])
    (tmp_path / "models--acme--Pinned" / "refs" / "main").unlink()
    assert load_model("acme/Pinned").total_params() == model_from_config(BASES[0], "x").total_params()


def test_a_deep_path_still_gives_a_short_message():
    deep = "/" + "/".join(["very-long-folder-name"] * 20) + "/config.json"
    with pytest.raises(InputError) as info:
        model_from_config({**BASES[2], "text_config": {**BASES[2]["text_config"], "hidden_size": -1}}, deep)
    message = str(info.value)
    assert message.startswith("...") and "hidden_size" in message and len(message) < 300
    spec = model_from_config(BASES[2], deep)
    assert spec.name.startswith(deep) and "text decoder of qwen3_5_moe" in spec.name


def test_models_show_says_not_priced_for_unpriced_flops():
    from paraplan.cli.catalog_json import model_document
    from paraplan.cli.render import count

    config, _, _ = _oracle("glm_moe_dsa", {})
    document = model_document(model_from_config(config, "glm5"), seq_len=4096)
    assert document["model_flops_per_token"] is None
    assert document["shape"]["unpriced_features"] == ["the sparse-attention indexer (DSA)"]
    json.dumps(document, allow_nan=False)
    assert count(math.nan) == "not priced" and count(1234.4) == "1,234"


def test_any_text_config_wrapper_reads_its_decoder():
    """An unlisted multimodal wrapper (LLaVA) still reads its text_config; a listed one without the inner
    model_type gets its transformers default (Mistral 3 -> mistral)."""
    llama = model_from_config(BASES[0], "x")
    inner = {k: v for k, v in BASES[0].items() if k != "model_type"}
    llava = model_from_config({"model_type": "llava", "text_config": BASES[0]}, "llava")
    mistral3 = model_from_config({"model_type": "mistral3", "text_config": inner}, "m3")
    assert llava.total_params() == mistral3.total_params() == llama.total_params()
    assert mistral3.model_type == "mistral" and "text decoder of llava" in llava.name


def test_post_norms_are_priced_in_stored_activations_and_elementwise_bytes():
    """Gemma 2's two post-norms: each keeps its 16-bit input for backward (2 bytes x h per token) and reads and
    writes h values once (4 bytes x h per token), on top of the two pre-norms."""
    import dataclasses

    import numpy as np

    from paraplan.cost_models.layer import _elementwise_bytes_per_token
    from paraplan.cost_models.memory import layer_activation_bytes_per_token

    config, _, _ = _oracle("gemma2", {})
    four = model_from_config(config, "g")
    two = dataclasses.replace(four, norms_per_layer=2)
    h, one = four.hidden_size, np.array([1])
    stored = layer_activation_bytes_per_token(four, one, one * 0, one * 0) \
        - layer_activation_bytes_per_token(two, one, one * 0, one * 0)
    assert stored == pytest.approx(2 * 2 * h)
    moved = _elementwise_bytes_per_token(four, one, one * 0, "bf16") - _elementwise_bytes_per_token(two, one, one * 0,
                                                                                                      "bf16")
    assert moved == pytest.approx(2 * 2 * 2 * h)


def test_models_types_lists_every_type_read_and_every_refusal():
    from typer.testing import CliRunner

    from paraplan.cli.app import app
    from paraplan.model_specs.model_families import REFUSED

    result = CliRunner().invoke(app, ["models", "types", "--json", "-"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert set(document["read"]) | set(document["text_config_wrappers"]) == set(supported_model_types())
    assert not set(document["read"]) & set(document["text_config_wrappers"])
    assert document["refused"] == REFUSED and not set(REFUSED) & set(supported_model_types())
    with pytest.raises(InputError, match="paraplan models types"):
        model_from_config({"model_type": "lama", "hidden_size": 64}, "x.json")


@pytest.mark.skipif(not SHARED_CONFIGS.is_dir(),
                    reason=f"{SHARED_CONFIGS} is absent (the shared folder beside the checkout)")
def test_models_show_names_what_is_not_priced():
    from typer.testing import CliRunner

    from paraplan.cli.app import app

    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        app, ["models", "show", str(SHARED_CONFIGS / "zai-org--GLM-5_config.json")])
    assert result.exit_code == 0, result.output
    assert "not priced, so not planned: the sparse-attention indexer (DSA)" in result.stdout
