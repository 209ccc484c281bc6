"""What a checkpoint says beside its shape: the weight format of a quantized checkpoint
(``quantization_config`` in config.json, or ModelOpt's ``hf_quant_config.json`` beside it), and where a
Hugging Face repo id's config.json sits in the local Hugging Face cache. paraplan never downloads."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from paraplan.errors import InputError
from paraplan.files import shown
from paraplan.model_specs.model_spec import WeightFormat

MAX_UNQUANTIZED_MODULES = 100_000
"""Module names a quantization config may list as kept unquantized: Qwen3-235B-A22B-FP8 lists 283 (lm_head and 3 per
layer of 94, ../shared/data/serving/model_configs); 100,000 leaves room for per-expert lists of the largest MoEs."""
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
"""A Hugging Face repo id, owner/name (huggingface_hub's validate_repo_id: letters, digits, '.', '_', '-')."""

_FP8_NAMES = {"e4m3": "float8_e4m3fn", "float8_e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2",
              "float8_e5m2": "float8_e5m2"}


def _ints(value: Any, field: str, origin: str) -> tuple[int, ...]:
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    if len(items) > 4 or any(isinstance(i, bool) or not isinstance(i, int) or not 0 < i <= 1 << 20 for i in items):
        raise InputError(f"{origin}: {field} must be a positive block size or a list of up to 4, got {shown(value)}")
    return tuple(items)


def _names(value: Any, field: str, origin: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_UNQUANTIZED_MODULES or \
            not all(isinstance(item, str) for item in value):
        raise InputError(f"{origin}: {field} must be a list of at most {MAX_UNQUANTIZED_MODULES:,} module names")
    return tuple(value)


def _compressed_tensors(q: dict[str, Any], origin: str) -> WeightFormat:
    """llm-compressor's format: config_groups.<group>.weights gives num_bits, type (int/float), group_size."""
    groups = q.get("config_groups")
    first = next(iter(groups.values())) if isinstance(groups, dict) and groups else None
    weights = first.get("weights") if isinstance(first, dict) else None
    if not isinstance(weights, dict) or weights.get("num_bits") not in (4, 8) or \
            weights.get("type") not in ("int", "float"):
        raise InputError(f"{origin}: quantization_config (compressed-tensors) needs config_groups.<group>.weights with "
                         "num_bits 4 or 8 and type int or float")
    bits, kind = weights["num_bits"], weights["type"]
    group = _ints(weights.get("group_size"), "group_size", origin)
    name = {("float", 4): "nvfp4" if group == (16,) else "fp4", ("float", 8): "float8_e4m3fn"}.get((kind, bits),
                                                                                                   f"int{bits}")
    return WeightFormat(method="compressed-tensors", weight_format=name, bits=float(bits), block_size=group,
                        unquantized_modules=_names(q.get("ignore"), "ignore", origin))


def _modelopt(q: dict[str, Any], origin: str) -> WeightFormat:
    """NVIDIA ModelOpt: quant_algo FP8 or NVFP4 (blocks of 16 with fp8 scales), exclude_modules."""
    algo = q.get("quant_algo")
    if algo not in ("FP8", "NVFP4"):
        raise InputError(f"{origin}: ModelOpt quant_algo {shown(algo)} is not read; paraplan reads FP8 and NVFP4")
    block = _ints(q.get("group_size", 16), "group_size", origin) if algo == "NVFP4" else ()
    return WeightFormat(method="modelopt", weight_format="float8_e4m3fn" if algo == "FP8" else "nvfp4",
                        bits=8.0 if algo == "FP8" else 4.0, block_size=block,
                        unquantized_modules=_names(q.get("exclude_modules", q.get("ignore")), "exclude_modules",
                                                   origin))


def weight_format(q: Any, origin: str) -> WeightFormat:
    """The weight format a ``quantization_config`` (or hf_quant_config.json's ``quantization``) describes."""
    if not isinstance(q, dict):
        raise InputError(f"{origin}: quantization_config must be an object, got {type(q).__name__}")
    method = q.get("quant_method", "modelopt" if "quant_algo" in q else None)
    skip = _names(q.get("modules_to_not_convert"), "modules_to_not_convert", origin)
    if method == "fp8":
        fmt = _FP8_NAMES.get(q.get("fmt", "e4m3")) if isinstance(q.get("fmt", "e4m3"), str) else None
        if fmt is None:
            raise InputError(f"{origin}: quantization_config.fmt {shown(q.get('fmt'))} is not an fp8 format "
                             "(e4m3 or e5m2)")
        return WeightFormat(method="fp8", weight_format=fmt, bits=8.0,
                            block_size=_ints(q.get("weight_block_size"), "weight_block_size", origin),
                            unquantized_modules=skip)
    if method == "mxfp4":  # OCP microscaling: 32 fp4 (e2m1) elements share one e8m0 scale
        return WeightFormat(method="mxfp4", weight_format="mxfp4", bits=4.0, block_size=(32,), unquantized_modules=skip)
    if method == "compressed-tensors":
        return _compressed_tensors(q, origin)
    if method == "modelopt":
        return _modelopt(q, origin)
    if method in ("gptq", "awq"):
        bits = q.get("bits", q.get("w_bit"))
        if bits not in (2, 3, 4, 8):
            raise InputError(f"{origin}: quantization_config.bits must be 2, 3, 4 or 8, got {shown(bits)}")
        group = q.get("group_size", q.get("q_group_size"))
        return WeightFormat(method=method, weight_format=f"int{bits}", bits=float(bits),
                            block_size=() if group in (None, -1) else _ints(group, "group_size", origin),
                            unquantized_modules=skip)
    if method == "bitsandbytes":  # BitsAndBytesConfig: load_in_4bit (fp4 unless it says nf4) or load_in_8bit;
        # the 4-bit block size is bitsandbytes' backend default, which the config does not state.
        if q.get("load_in_4bit"):
            kind = "nf4" if q.get("bnb_4bit_quant_type") == "nf4" else "fp4"
            return WeightFormat(method=method, weight_format=kind, bits=4.0,
                                unquantized_modules=_names(q.get("llm_int8_skip_modules"), "llm_int8_skip_modules",
                                                           origin))
        if q.get("load_in_8bit"):
            return WeightFormat(method=method, weight_format="int8", bits=8.0,
                                unquantized_modules=_names(q.get("llm_int8_skip_modules"), "llm_int8_skip_modules",
                                                           origin))
    if method == "fbgemm_fp8":  # FbgemmFp8Config: per-channel float8_e4m3fn weights
        return WeightFormat(method=method, weight_format="float8_e4m3fn", bits=8.0, unquantized_modules=skip)
    raise InputError(f"{origin}: quantization_config.quant_method {shown(method)} is not read (paraplan reads fp8, "
                     "mxfp4, compressed-tensors, modelopt, gptq, awq, bitsandbytes, fbgemm_fp8); remove the block to "
                     "plan with 16-bit weights")


def hub_cache_dir() -> Path:
    """The local Hugging Face hub cache: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def cached_config_path(repo_id: str) -> Path | None:
    """config.json of ``repo_id`` in the local cache: at the revision refs/main names, else in the only
    snapshot that holds one (a download pinned to a revision writes no refs/main)."""
    repo = hub_cache_dir() / f"models--{repo_id.replace('/', '--')}"
    try:
        revision = (repo / "refs" / "main").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        revision = ""
    if re.fullmatch(r"[0-9a-fA-F]{7,64}", revision):
        path = repo / "snapshots" / revision / "config.json"
        return path if path.is_file() else None
    try:
        found = [snapshot / "config.json" for snapshot in (repo / "snapshots").iterdir()
                 if (snapshot / "config.json").is_file()]
    except OSError:
        return None
    return found[0] if len(found) == 1 else None


def not_cached_message(repo_id: str) -> str:
    """One line: the repo's config.json is not in the local cache, and how to get it there."""
    return (f"{repo_id!r} is not a preset, not a file, and not in the local Hugging Face cache ({hub_cache_dir()}); "
            f"fetch it with 'hf download {repo_id} config.json' or pass a config.json path")
