"""The Megatron export says which of a model family's traits its pretrain_gpt.py arguments cannot state, so a
Gemma 2 plan never silently launches a Llama-shaped model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from paraplan.exporters.megatron import unexpressed
from paraplan.model_specs.hf_config import model_from_config
from paraplan.model_specs.model_families import FAMILIES

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 1000, "max_position_embeddings": 4096}


def _notes(model_type: str, **extra) -> tuple[str, ...]:
    return unexpressed(model_from_config({"model_type": model_type, **SMALL, **extra}, model_type))


def test_llama_needs_no_family_note():
    assert len(_notes("llama")) == 1  # only the rotary / epsilon reminder every export carries


def test_gemma2_post_norms_are_named():
    notes = _notes("gemma2", sliding_window=1024)
    assert any("4 norms per layer (post-norms)" in note for note in notes)


def test_olmo2_full_width_qk_norms_are_named():
    notes = _notes("olmo2")
    assert any("QK norms over the full query/key width" in note for note in notes)
    assert any("norms after attention and the MLP" in note for note in notes)
    assert not any("norms after attention" in note for note in _notes("olmoe", num_experts=4, num_experts_per_tok=2))


def test_cohere_shared_norm_is_named():
    assert any("one norm shared by attention and MLP" in note for note in _notes("cohere"))


def test_post_norm_only_matches_transformers_decoder_layers():
    """Oracle: a family's decoder layer in transformers has post_feedforward_layernorm and no input or
    pre-feedforward norm exactly when paraplan's trait table says its norms follow attention and the MLP."""
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed (pip install '.[oracle]')")
    import transformers

    models = Path(transformers.__file__).parent / "models"
    checked = 0
    for model_type, traits in FAMILIES.items():
        source = models / model_type / f"modeling_{model_type}.py"
        if not source.is_file():
            continue
        text = source.read_text(encoding="utf-8")
        post_only = "post_feedforward_layernorm" in text and "self.input_layernorm" not in text \
            and "self.pre_feedforward_layernorm" not in text
        assert traits.post_norm_only == post_only, model_type
        checked += 1
    assert checked >= 60
