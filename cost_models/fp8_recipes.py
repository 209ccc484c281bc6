"""fp8 scaling recipes priced apart: how fast each one's GEMMs run against the per-tensor recipe.

The fp8 GEMM fractions of efficiency.yaml are fitted to runs of the per-tensor ("tensorwise", current scaling)
recipe. Finer scaling keeps more accuracy and costs time: a scale per row (torchao ``rowwise``), per 1x128 /
128x128 tile (Transformer Engine ``Float8BlockScaling``, DeepSeek-V3's recipe; on Hopper the scales are applied by
CUDA cores between tensor-core steps) or per 32 elements (MXFP8, which Blackwell's tensor cores read natively).
Each needs its own quantization of a tensor for each GEMM dimension it feeds, its own amax reductions and a
scaled-GEMM kernel. One factor per recipe and architecture multiplies the fp8 GEMM rate; it absorbs all of that
(casts, scale computation, the slower kernel), because the published measurements that isolate a recipe compare
whole training steps of one layout, not kernels. Fitted by bench/fp8_recipes.py to those paired measurements
(leave-one-pair-out figures there); ``delayed`` (Transformer Engine's amax-history scaling) runs the same
per-tensor GEMMs and costs the same.
"""

from __future__ import annotations

import dataclasses

from paraplan.choices import Precision
from paraplan.cost_models.compute import ComputeRates

FP8_RECIPES = ("tensorwise", "delayed", "rowwise", "blockwise", "mxfp8")
"""Megatron-LM's --fp8-recipe names (tensorwise, delayed, blockwise, mxfp8) and torchao's rowwise."""

RECIPE_ARCHITECTURES: dict[str, tuple[str, ...]] = {"rowwise": ("hopper", "blackwell"),
                                                   "blockwise": ("hopper", "blackwell"), "mxfp8": ("blackwell",)}
"""Where a recipe runs: MXFP8 needs Blackwell's block-scaled tensor cores (Transformer Engine refuses it on
Hopper); the others need fp8 tensor cores (Hopper onwards). tensorwise and delayed run wherever fp8 does."""

GEMM_RATE_FACTOR: dict[tuple[str, str], float] = {
    ("rowwise", "hopper"): 0.77,
    ("blockwise", "hopper"): 1.00,
    ("mxfp8", "blackwell"): 0.91,
}
"""fp8 GEMM rate of a recipe over the per-tensor rate, per architecture, fitted by bench/fp8_recipes.py:
rowwise/hopper to torchao's float8 README (Llama 3 8B on 8 H100 under torchtitan, torch.compile and FSDP2: rowwise
6,768 vs tensorwise 7,689.5 tokens/s, a step ratio of 0.880; one pair, so no left-out figure); blockwise/hopper to
NeMo 25.09's DeepSeek-V3 on 1,024 H100 (1,297 tokens/s under both recipes; its TFLOP/s column says 330 vs 338,
so the table itself brackets the effect at 0-2.4% of the step: no measurable cost); mxfp8/blackwell to eight
same-layout pairs on B200, GB200 and GB300 (NeMo 25.09 and 26.x; step ratios 0.93-1.04): in-sample median
|ratio error| 1.3%, each pair left out 2.2%. A recipe on an architecture without an entry runs at the
per-tensor rate."""


def gemm_rate_factor(recipe: str, architecture: str) -> float:
    """The factor for ``recipe`` on ``architecture``; 1 for the per-tensor recipes."""
    return GEMM_RATE_FACTOR.get((recipe, architecture), 1.0)


def recipe_error(recipe: str, architecture: str, gpu_name: str) -> str | None:
    """Why ``recipe`` cannot run on this GPU, or None."""
    if recipe not in FP8_RECIPES:
        return f"fp8 recipe must be one of {', '.join(FP8_RECIPES)}, got {recipe!r}"
    allowed = RECIPE_ARCHITECTURES.get(recipe)
    if allowed is not None and architecture not in allowed:
        runs_here = [r for r in FP8_RECIPES if architecture in RECIPE_ARCHITECTURES.get(r, (architecture,))]
        return (f"fp8 recipe {recipe} needs a {' or '.join(allowed)} GPU; {gpu_name} is {architecture} "
                f"(choose {', '.join(runs_here)})")
    return None


def with_fp8_recipe(rates: ComputeRates, precision: Precision, recipe: str, architecture: str) -> ComputeRates:
    """``rates`` with the recipe's GEMM factor applied (fp8 jobs only, once: the rates remember their recipe)."""
    if precision != "fp8" or rates.fp8_recipe is not None:
        return rates
    factor = gemm_rate_factor(recipe, architecture)
    if factor == 1.0:
        return dataclasses.replace(rates, fp8_recipe=recipe)
    learned = rates.gemm_time_fn
    return dataclasses.replace(
        rates, fp8_recipe=recipe, gemm_flops_per_s=rates.gemm_flops_per_s * factor,
        gemm_time_fn=None if learned is None else (lambda m, n, k: learned(m, n, k) / factor),
        source=f"{rates.source}; fp8 {recipe} GEMMs at {factor:g}x the per-tensor rate (cost_models/fp8_recipes.py)")
