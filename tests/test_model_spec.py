"""ModelSpec: exact parameter counts, config.json reading, and model FLOPs against the papers."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from conftest import make_model, make_table

from paraplan.cost_models.estimate import estimate
from paraplan.cost_models.recipes import MEGATRON_MIXED
from paraplan.cost_models.table import Workload
from paraplan.errors import InputError
from paraplan.model_specs.hf_config import SUPPORTED_TYPES, load_model, model_from_config, preset_names


# -- presets: exact counts (Hugging Face model cards / safetensors metadata) --------------------
@pytest.mark.parametrize(
    "name, params",
    [
        ("llama-3.1-8b", 8_030_261_248),
        ("llama-3.1-70b", 70_553_706_496),
        ("llama-3.1-405b", 405_853_388_800),
        ("llama-2-7b", 6_738_415_616),
        ("llama-2-13b", 13_015_864_320),
        ("llama-2-70b", 68_976_648_192),
    ],
)
def test_preset_exact_parameter_counts(name, params):
    assert load_model(name).total_params() == params


def test_every_preset_loads():
    names = preset_names()
    assert len(names) >= 10
    for name in names:
        model = load_model(name)
        assert model.total_params() > 0
        assert model.model_type in SUPPORTED_TYPES


@pytest.mark.parametrize(
    "name, billions",
    [
        ("megatron-gpt-1.7b", 1.7),
        ("megatron-gpt-3.6b", 3.6),
        ("megatron-gpt-7.5b", 7.5),
        ("megatron-gpt-18.4b", 18.4),
        ("megatron-gpt-39.1b", 39.1),
        ("megatron-gpt-76.1b", 76.1),
        ("megatron-gpt-145.6b", 145.6),
        ("megatron-gpt-174.6b", 174.6),
        ("megatron-gpt-310.1b", 310.1),
        ("megatron-gpt-529.6b", 529.6),
        ("megatron-gpt-1008b", 1008.0),
    ],
)
def test_megatron_table1_parameter_counts(name, billions):
    """Narayanan et al. 2021 section 5.1: P = 12lh²(1 + 13/12h + (V + s)/12lh), i.e. layers with
    biases and two LayerNorms, word + position embeddings; the paper's formula leaves out the
    final LayerNorm (2h), which an exact count has."""
    m = load_model(name)
    L, h, v, s = m.num_layers, m.hidden_size, m.vocab_size, m.max_positions
    paper = 12 * L * h * h + 13 * L * h + (v + s) * h
    assert m.total_params() == paper + 2 * h
    # Table 1 quotes the count in billions, rounded (1.65 is printed as 1.7).
    assert m.total_params() / 1e9 == pytest.approx(billions, abs=0.051)


def test_gpt3_175b_published_size():
    # Brown et al. 2020, Table 2.1: 175.0B parameters.
    assert load_model("gpt3-175b").total_params() / 1e9 == pytest.approx(175.0, rel=0.005)


# -- hand-derived counts of tiny configs -----------------------------------------------------------
LLAMA_TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 176,
    "vocab_size": 1000,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
}


def test_llama_tiny_hand_count():
    h, layers, heads, kv_heads, f, vocab = 64, 3, 4, 2, 176, 1000
    d = h // heads  # 16
    q_proj = h * heads * d
    k_proj = h * kv_heads * d
    v_proj = h * kv_heads * d
    o_proj = heads * d * h
    gate_proj, up_proj, down_proj = h * f, h * f, f * h
    input_layernorm = post_attention_layernorm = h  # RMSNorm: weight only
    layer = (
        q_proj + k_proj + v_proj + o_proj + gate_proj + up_proj + down_proj + input_layernorm + post_attention_layernorm
    )
    embed_tokens, final_norm, lm_head = vocab * h, h, vocab * h
    expected = embed_tokens + layers * layer + final_norm + lm_head
    assert expected == 64_000 + 3 * 46_208 + 64 + 64_000
    model = model_from_config(LLAMA_TINY, "tiny")
    assert model.layer_params() == layer
    assert model.total_params() == expected
    assert (model.head_dim, model.num_kv_heads, model.gated_mlp, model.norm) == (16, 2, True, "rmsnorm")
    assert not (model.qkv_bias or model.linear_bias or model.norm_bias or model.qk_norm)


def test_llama_tiny_tied_embeddings():
    tied = model_from_config({**LLAMA_TINY, "tie_word_embeddings": True}, "tiny")
    untied = model_from_config(LLAMA_TINY, "tiny")
    assert untied.total_params() - tied.total_params() == 1000 * 64


GPT2_TINY = {
    "model_type": "gpt2",
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 4,
    "n_inner": None,
    "vocab_size": 500,
    "n_positions": 128,
    "resid_pdrop": 0.1,
}


def test_gpt2_tiny_hand_count():
    h, layers, vocab, positions = 64, 2, 500, 128
    f = 4 * h  # n_inner null -> 4h
    ln_1 = ln_2 = 2 * h  # LayerNorm weight + bias
    c_attn = h * 3 * h + 3 * h  # fused QKV with bias
    attn_c_proj = h * h + h
    c_fc = h * f + f
    mlp_c_proj = f * h + h
    layer = ln_1 + c_attn + attn_c_proj + ln_2 + c_fc + mlp_c_proj
    wte, wpe, ln_f = vocab * h, positions * h, 2 * h
    expected = wte + wpe + layers * layer + ln_f  # lm_head tied to wte
    model = model_from_config(GPT2_TINY, "tiny-gpt2")
    assert model.layer_params() == layer == 12 * h * h + 13 * h
    assert model.embedding_params() == wte + wpe
    assert model.output_params() == ln_f
    assert model.total_params() == expected
    assert model.tied_embeddings and model.position == "learned" and model.dropout
    assert model.ffn_size == f


def test_qwen2_qkv_bias_count():
    config = {**LLAMA_TINY, "model_type": "qwen2"}
    qwen2 = model_from_config(config, "q2")
    llama = model_from_config(LLAMA_TINY, "q2")
    assert qwen2.qkv_bias and not qwen2.linear_bias
    # q_proj, k_proj, v_proj biases: q_width + 2 kv_width per layer.
    assert qwen2.total_params() - llama.total_params() == 3 * (64 + 2 * 32)


def test_qwen3_head_dim_and_qk_norm():
    config = {
        "model_type": "qwen3",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "intermediate_size": 128,
        "vocab_size": 300,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "rope_theta": 1000000.0,
        "torch_dtype": "bfloat16",
    }
    model = model_from_config(config, "q3")
    h, d, heads, kv_heads, f, vocab = 64, 32, 4, 2, 128, 300
    assert model.head_dim == d != h // heads
    assert model.q_width == 128 and model.kv_width == 64
    assert model.qk_norm and not model.qkv_bias
    q_proj, k_proj, v_proj, o_proj = h * heads * d, h * kv_heads * d, h * kv_heads * d, heads * d * h
    q_norm = k_norm = d
    mlp = 3 * h * f
    layer = q_proj + k_proj + v_proj + o_proj + q_norm + k_norm + mlp + 2 * h
    assert model.layer_params() == layer
    assert model.total_params() == vocab * h + 2 * layer + h
    # Attention FLOPs follow the query width, not hidden_size.
    assert model.attention_core_flops_per_token(100) == 4 * 100 * heads * d


def test_mistral_parses():
    config = {
        "model_type": "mistral",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": None,
        "intermediate_size": 224,
        "vocab_size": 320,
        "max_position_embeddings": 32768,
        "sliding_window": 4096,
        "tie_word_embeddings": False,
    }
    model = model_from_config(config, "mistral")
    assert (model.head_dim, model.num_kv_heads, model.gated_mlp, model.position) == (8, 2, True, "rope")
    as_llama = model_from_config({**config, "model_type": "llama"}, "mistral")
    # Mistral is Llama plus a sliding window on every layer: attention beyond 4096 keys costs nothing.
    assert dataclasses.replace(as_llama, model_type="mistral", sliding_window=4096, sliding_layers=2) == model
    assert model.attention_core_flops_per_token(8192) == model.attention_core_flops_per_token(4096) \
        == as_llama.attention_core_flops_per_token(4096) == 4 * 4096 * 64


# A tiny GPT-NeoX config.json; each test adds the keys it is about.
_NEOX = {
    "model_type": "gpt_neox",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "vocab_size": 400,
    "max_position_embeddings": 2048,
}


def test_gpt_neox_parses():
    config = {**_NEOX, "use_parallel_residual": True, "rotary_pct": 0.25, "tie_word_embeddings": False}
    model = model_from_config(config, "neox")
    assert model.parallel_attn_mlp and model.position == "rope" and not model.gated_mlp
    h, f, vocab = 64, 256, 400
    # input/post-attention LayerNorms, fused query_key_value, dense, dense_h_to_4h, dense_4h_to_h.
    layer = 2 * h + 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h)
    assert model.total_params() == vocab * h + 2 * layer + 2 * h + vocab * h


def test_gpt_neox_parallel_residual_defaults_to_true():
    assert model_from_config(dict(_NEOX), "neox").parallel_attn_mlp


def test_gpt_neox_attention_bias_false():
    config = {**_NEOX, "use_parallel_residual": True, "tie_word_embeddings": False}
    with_bias = model_from_config(config, "neox")
    without = model_from_config({**config, "attention_bias": False}, "neox")
    assert with_bias.total_params() - without.total_params() == 2 * (3 * 64 + 64)


# -- transformers 4.x vs 5.x spellings -------------------------------------------------------------
def test_transformers_v4_and_v5_spellings_agree():
    v4 = dict(LLAMA_TINY)
    v5 = {k: val for k, val in LLAMA_TINY.items() if k not in ("rope_theta", "torch_dtype")}
    v5["rope_parameters"] = {"rope_theta": 10000.0, "rope_type": "default"}
    v5["dtype"] = "bfloat16"
    assert model_from_config(v4, "m") == model_from_config(v5, "m")


def test_gpt2_key_spellings_agree():
    hf_names = {
        "model_type": "gpt2",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 500,
        "max_position_embeddings": 128,
        "resid_pdrop": 0.1,
    }
    assert model_from_config(GPT2_TINY, "g") == model_from_config(hf_names, "g")


# -- errors ---------------------------------------------------------------------------------------
def test_unsupported_model_type_is_one_short_line_with_close_matches():
    with pytest.raises(InputError) as info:
        model_from_config({**LLAMA_TINY, "model_type": "zebra_lm"}, "zebra")
    message = str(info.value)
    assert "zebra_lm" in message and f"{len(SUPPORTED_TYPES)} types" in message
    assert "\n" not in message and len(message) < 300
    with pytest.raises(InputError, match="closest: qwen3_moe") as info:
        model_from_config({**LLAMA_TINY, "model_type": "qwen3moe"}, "typo")
    assert len(str(info.value)) < 300


def test_missing_model_type():
    config = {k: v for k, v in LLAMA_TINY.items() if k != "model_type"}
    with pytest.raises(InputError, match="llama"):
        model_from_config(config, "x")


def test_missing_shape_key():
    config = {k: v for k, v in LLAMA_TINY.items() if k != "hidden_size"}
    with pytest.raises(InputError, match="hidden_size"):
        model_from_config(config, "x")


@pytest.mark.parametrize("bad", [0, -64, 64.5, "64", True])
def test_bad_shape_value(bad):
    with pytest.raises(InputError, match="hidden_size"):
        model_from_config({**LLAMA_TINY, "hidden_size": bad}, "x")


@pytest.mark.parametrize("key", ["hidden_size", "num_attention_heads", "vocab_size", "num_hidden_layers"])
@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_non_finite_shape_value_is_input_error(key, bad):
    with pytest.raises(InputError, match=key.split("_")[0]):
        model_from_config({**LLAMA_TINY, key: bad}, "x")


def test_infinity_in_config_file_is_input_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_TINY).replace('"vocab_size": 1000', '"vocab_size": Infinity'))
    with pytest.raises(InputError):
        load_model(str(path))


# transformers writes float("inf") as the JSON extension Infinity (falcon-h1's time_step_max, granite-4.0-h and
# nemotron-h limits): a model config.json may hold it, so a refused hybrid is named rather than "write a number".
HYBRID_WITH_INFINITY = ('{"model_type": "falcon_h1", "hidden_size": 64, "num_hidden_layers": 2, '
                        '"time_step_limit": [0.0, Infinity], "time_step_max": Infinity, "time_step_min": -Infinity}')


def test_refused_hybrid_with_infinity_names_its_model_type(tmp_path):
    from conftest import assert_bad_input
    from typer.testing import CliRunner

    from paraplan.cli.app import app

    (tmp_path / "config.json").write_text(HYBRID_WITH_INFINITY)
    result = CliRunner().invoke(app, ["models", "show", str(tmp_path / "config.json")])
    line = assert_bad_input(result, "falcon_h1")
    assert "write a number" not in line and "Infinity" not in line


def test_supported_config_with_an_infinity_key_loads(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_TINY)[:-1] + ', "time_step_max": Infinity, "floor": -Infinity}')
    spec = load_model(str(path))
    assert spec.model_type == "llama"
    assert spec.total_params() == model_from_config(LLAMA_TINY, "x").total_params()


def test_nan_in_a_model_config_is_still_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_TINY)[:-1] + ', "time_step_max": NaN}')
    with pytest.raises(InputError, match="holds NaN"):
        load_model(str(path))


def test_other_user_json_stays_strict():
    from paraplan.files import parse_user_json

    with pytest.raises(InputError, match="holds Infinity"):
        parse_user_json('{"a": Infinity}', "plan.json")


def test_heads_not_multiple_of_kv_heads():
    with pytest.raises(InputError, match="KV heads"):
        model_from_config({**LLAMA_TINY, "num_key_value_heads": 3}, "x")


def test_malformed_json_file_names_the_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n  "model_type": "llama",\n  "hidden_size": 64,,\n  "vocab_size": 10\n}\n')
    with pytest.raises(InputError, match=r"malformed JSON at line 3"):
        load_model(str(path))


def test_json_not_an_object(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("[1, 2]")
    with pytest.raises(InputError, match="object"):
        load_model(str(path))


def test_config_file_and_folder_load(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_TINY))
    from_folder = load_model(str(tmp_path))
    from_file = load_model(str(tmp_path / "config.json"))
    assert from_folder.total_params() == from_file.total_params() == model_from_config(LLAMA_TINY, "x").total_params()


def test_unknown_preset_suggests():
    with pytest.raises(InputError) as info:
        load_model("llama-3.1-8")
    hint = re.search(r"did you mean (.*?)\?", str(info.value))
    assert hint and "llama-3.1-8b" in hint.group(1)


# -- FLOPs ----------------------------------------------------------------------------------------
GPT_SHAPES = [
    {"num_layers": 24, "hidden_size": 2048, "num_heads": 16, "vocab_size": 51200},
    {"num_layers": 96, "hidden_size": 12288, "num_heads": 96, "vocab_size": 50257},
    {
        "num_layers": 2,
        "hidden_size": 64,
        "num_heads": 4,
        "vocab_size": 1000,
        "qkv_bias": False,
        "linear_bias": False,
        "norm_bias": False,
        "norm": "rmsnorm",
    },
]


@pytest.mark.parametrize("shape", GPT_SHAPES)
@pytest.mark.parametrize("seq_len", [1024, 2048, 8192])
def test_gpt_model_flops_closed_form(shape, seq_len):
    m = make_model(**shape)
    L, h, v, s = m.num_layers, m.hidden_size, m.vocab_size, seq_len
    # Forward per token: layer GEMMs 2·12h², attention core 4·s·h, logits 2·h·V; training = 3x forward.
    assert m.layer_gemm_flops_per_token() == 2 * 12 * h * h
    assert m.attention_core_flops_per_token(s, "full") == 4 * s * h
    assert m.logits_flops_per_token() == 2 * h * v
    expected = 3 * (L * (24 * h * h + 4 * s * h) + 2 * h * v)
    assert m.model_flops_per_token(s, "full") == expected
    closed = 72 * L * h * h * (1 + s / (6 * h) + v / (12 * L * h))
    assert m.model_flops_per_token(s, "full") == pytest.approx(closed, rel=1e-12)


@pytest.mark.parametrize("shape", GPT_SHAPES)
def test_causal_attention_is_half(shape):
    m = make_model(**shape)
    s = 4096
    full = m.attention_core_flops_per_token(s, "full")
    assert m.attention_core_flops_per_token(s, "causal") * 2 == full
    diff = m.model_flops_per_token(s, "full") - m.model_flops_per_token(s, "causal")
    assert diff == 3 * m.num_layers * full / 2


def test_gqa_gated_gemm_flops_are_twice_the_weights():
    """For a bias-free model, forward GEMM FLOPs per token are 2 x the layer's matrix parameters."""
    m = load_model("llama-3.1-8b")
    matrices = m.layer_params() - 2 * m.hidden_size  # minus the two RMSNorm weights
    assert m.layer_gemm_flops_per_token() == 2 * matrices
    h = m.hidden_size
    assert matrices == h * (h + 2 * 1024) + h * h + 3 * h * 14336


@pytest.mark.parametrize("shape", GPT_SHAPES[:2])
def test_full_recompute_matches_narayanan_eq3(shape, dgx_h100):
    """Narayanan et al. 2021 Eq. 3: with full recompute, executed FLOPs per token are
    96·l·h²·(1 + s/6h + V/16lh) = model FLOPs + one extra forward of the layers."""
    m = make_model(**shape)
    L, h, v, s = m.num_layers, m.hidden_size, m.vocab_size, 2048
    model_flops = m.model_flops_per_token(s, "full")
    extra_forward = L * (m.layer_gemm_flops_per_token() + m.attention_core_flops_per_token(s, "full"))
    eq3 = 96 * L * h * h * (1 + s / (6 * h) + v / (16 * L * h))
    assert model_flops + extra_forward == pytest.approx(eq3, rel=1e-12)
    # The estimate's HFU / MFU ratio is executed over model FLOPs.
    work = Workload(seq_len=s, global_batch=16, precision="bf16", recipe=MEGATRON_MIXED)
    est = estimate(m, dgx_h100, work, make_table(tp=8, dp=2, recompute=[0, 1, 2]))
    ratio = est.hfu / est.mfu
    assert ratio[0] == pytest.approx(1.0, rel=1e-12)
    assert ratio[1] == pytest.approx((model_flops + L * m.attention_core_flops_per_token(s)) / model_flops, rel=1e-12)
    assert ratio[2] == pytest.approx(eq3 / model_flops, rel=1e-12)


def test_model_spec_rejects_bad_fields():
    with pytest.raises(ValueError, match="num_layers"):
        make_model(num_layers=0)
    with pytest.raises(ValueError, match="KV heads"):
        make_model(num_heads=16, num_kv_heads=5)
    with pytest.raises(ValueError, match="hidden_size"):
        make_model(hidden_size=True, head_dim=1, ffn_size=4)
