"""Small factories shared by the tests: models, config tables and clusters."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import settings

from paraplan.cost_models.kernel_tables import KernelTable, build_table
from paraplan.cost_models.table import ConfigTable
from paraplan.hardware_profiles import ClusterSpec, load_cluster
from paraplan.model_specs.model_spec import ModelSpec

# The suite's property tests draw the same examples on every run, so CI is red only for a change, never for a
# rare input found by chance; exploring new inputs is bench/fuzz.py's job (--seed N), or run the suite with
# HYPOTHESIS_PROFILE=explore to draw fresh ones.
settings.register_profile("deterministic", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))

# A GPT-3-style dense decoder (Megatron GPT): LayerNorm with bias, biases on every GEMM, plain
# 4h MLP, learned positions, tied embeddings, dropout on. Small enough to cost in microseconds.
_GPT_DEFAULTS: dict[str, Any] = {
    "name": "gpt-test",
    "model_type": "gpt2",
    "num_layers": 24,
    "hidden_size": 2048,
    "num_heads": 16,
    "vocab_size": 51200,
    "gated_mlp": False,
    "tied_embeddings": True,
    "norm": "layernorm",
    "norm_bias": True,
    "qkv_bias": True,
    "linear_bias": True,
    "qk_norm": False,
    "position": "learned",
    "max_positions": 2048,
    "dropout": True,
}

TABLE_DEFAULTS = {"tp": 1, "pp": 1, "dp": 1, "cp": 1, "cp_comm": 0, "ep": 1, "etp": 1, "vpp": 1, "mbs": 1, "zero": 0,
                  "recompute": 0, "sp": 0, "ep_overlap": 0, "offload": 0, "pp_schedule": 0, "tp_overlap": 0}


def make_model(**overrides: Any) -> ModelSpec:
    """A GPT-like ModelSpec; head_dim, KV heads and FFN follow hidden/heads unless overridden."""
    fields = {**_GPT_DEFAULTS, **overrides}
    fields.setdefault("num_kv_heads", fields["num_heads"])
    fields.setdefault("head_dim", fields["hidden_size"] // fields["num_heads"])
    fields.setdefault("ffn_size", 4 * fields["hidden_size"])
    return ModelSpec(**fields)


def make_table(**columns: Any) -> ConfigTable:
    """A ConfigTable; scalars broadcast against list columns, unset columns take TABLE_DEFAULTS."""
    unknown = set(columns) - set(TABLE_DEFAULTS)
    if unknown:
        raise TypeError(f"unknown config table columns {sorted(unknown)}")
    merged = {**TABLE_DEFAULTS, **columns}
    names = list(merged)
    arrays = np.broadcast_arrays(*(np.atleast_1d(np.asarray(merged[n], dtype=np.int64)) for n in names))
    return ConfigTable.from_columns(**{n: np.array(a) for n, a in zip(names, arrays)})


@pytest.fixture
def dgx_h100_nodes():
    """Factory: a DGX H100 cluster of ``num_nodes`` 8-GPU nodes."""

    def build(num_nodes: int) -> ClusterSpec:
        return load_cluster("dgx-h100", num_nodes=num_nodes)

    return build


@pytest.fixture
def dgx_h100() -> ClusterSpec:
    """Two DGX H100 nodes: 16 GPUs, two 8-GPU NVLink domains."""
    return load_cluster("dgx-h100", num_nodes=2)


@pytest.fixture(scope="module")
def h100x16() -> ClusterSpec:
    """Two DGX H100 nodes taken as 16 GPUs."""
    return load_cluster("dgx-h100", num_gpus=16)


@pytest.fixture(scope="module")
def mixtral() -> ModelSpec:
    """Mixtral 8x7B: 8 experts, top-2."""
    from paraplan.model_specs.hf_config import load_model

    return load_model("mixtral-8x7b")


def assert_bad_input(result, *needles: str) -> str:
    """Exit 2, exactly one 'error: ...' line on stderr mentioning every needle, no traceback."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def aiconfigurator_wheel() -> Path:
    """The aiconfigurator-core 0.12.0 wheel $PARAPLAN_AICONFIGURATOR_WHEEL names, with pyarrow to read its tables;
    the test skips without them, and fails instead under PARAPLAN_REQUIRE_AICONFIGURATOR=1 (CI)."""
    named = os.environ.get("PARAPLAN_AICONFIGURATOR_WHEEL", "")
    if importlib.util.find_spec("pyarrow") is None:
        why = "pyarrow is not installed (pip install 'paraplan[aiconfigurator]')"
    elif not named or not Path(named).is_file():
        why = (f"PARAPLAN_AICONFIGURATOR_WHEEL names no file ({named!r}); set it to aiconfigurator_core-0.12.0-*.whl "
               "(pip download --no-deps aiconfigurator-core==0.12.0)")
    else:
        return Path(named)
    if os.environ.get("PARAPLAN_REQUIRE_AICONFIGURATOR") == "1":
        pytest.fail(f"PARAPLAN_REQUIRE_AICONFIGURATOR=1 but {why}")
    pytest.skip(why)


def one_cell_attention_table(seconds: float, *, decode: bool) -> KernelTable:
    """A synthetic serving attention table of one measured cell: decode at 4 sequences of 100 keys each, prefill at one
    64-token prompt (time linear in sequences and quadratic in tokens above it)."""
    if decode:
        return build_table("attention", ("batch", "kv_len"), np.array([[4.0, 100.0]]), np.array([seconds]),
                           "synthetic")
    return build_table("attention", ("batch", "seq_len"), np.array([[1.0, 64.0]]), np.array([seconds]), "synthetic",
                       exponents_above=(1.0, 2.0))
