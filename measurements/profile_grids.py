"""The shapes ``paraplan profile --suite training`` times, part by part, and each part's estimated run time.

Pure arithmetic, no PyTorch: the grids, the GEMM passes of a linear layer, the minimum HBM bytes of the
memory-bound ops, and run-time estimates from a device's calibrated rates (``SuiteRates``). The default grid covers
Llama and Qwen training shapes on one GPU and is sized so that each part, and the whole suite, fits in one
10-minute call on an H100 (``tests/test_profiler.py`` checks the estimates at H100-like rates); the quick grid is a
few tiny shapes per part, for CPU runs and tests.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from paraplan.measurements.profiler import ProfileSettings, estimated_seconds
from paraplan.model_specs.model_spec import ModelSpec

PartName = Literal["gemm", "attention", "elementwise", "grouped_gemm", "optimizer", "collectives"]
PARTS: tuple[PartName, ...] = ("gemm", "attention", "elementwise", "grouped_gemm", "optimizer", "collectives")
"""The suite's parts in the order they run; each is written to the output file as soon as it finishes."""
GemmPass = Literal["forward", "dgrad", "wgrad"]
GEMM_PASSES: tuple[GemmPass, ...] = ("forward", "dgrad", "wgrad")
ATTENTION_BACKENDS = ("default", "flash", "efficient", "cudnn", "math")
"""``default``: SDPA's own choice; the others forced through ``torch.nn.attention.sdpa_kernel``."""
ELEMENTWISE_OPS = ("rmsnorm", "swiglu", "rotary", "residual_add")
BF16_BYTES = 2
ADAMW_BYTES_PER_PARAMETER = 28
"""fp32 AdamW: reads parameter, gradient and both moments, writes parameter and both moments (7 x 4 bytes)."""
MATH_MAX_SCORE_ELEMENTS = 2**30
"""The math SDPA backend materialises the batch x heads x seq x seq scores (bf16, several copies through the
backward); above 2**30 elements it needs over 10 GiB and seconds per call, so those shapes are skipped."""
OPTIMIZER_TENSOR_ELEMENTS = 2**24
"""Parameters are split into tensors of at most 2**24 elements (a 4096 x 4096 weight), as a model's are."""
COMPILE_S = {"cuda": 6.0, "cpu": 4.0}
"""Seconds per ``torch.compile`` of one op at one shape, first-compile imports included (assumed, not calibrated:
about 2 s on this project's 2-core CPU after a first compile of 8 s)."""
ELEMENTWISE_BYTES_FRAC = 0.5
"""Share of the calibrated copy bandwidth an eager memory-bound op or an optimizer step is assumed to reach."""
LINK_BYTES_FRAC = 0.1
"""Collectives' bandwidth as a share of the copy bandwidth (H100: 450 GB/s NVLink against 3.35 TB/s HBM)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionShape:
    """One causal attention shape."""

    batch: int
    """Sequences per call."""
    heads: int
    """Query heads."""
    kv_heads: int
    """Key/value heads (fewer than ``heads``: grouped-query attention)."""
    seq_len: int
    """Tokens per sequence."""
    head_dim: int
    """Width of one head."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupedShape:
    """One MoE grouped GEMM: every expert multiplies its tokens [tokens_per_expert, k] by its weight [k, n]."""

    experts: int
    """Experts (groups)."""
    tokens_per_expert: int
    """Rows per group (balanced routing)."""
    n: int
    """Output width."""
    k: int
    """Input width."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockWidths:
    """The widths of a Llama-style block whose memory-bound ops are timed."""

    hidden: int
    """Model width (RMSNorm, residual add)."""
    ffn: int
    """FFN width (SwiGLU activation over gate and up)."""
    heads: int
    """Query heads (rotary)."""
    kv_heads: int
    """Key/value heads (rotary)."""
    head_dim: int
    """Head width (rotary)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingGrid:
    """Everything one run of the training suite measures."""

    name: str
    """``default`` or ``quick``."""
    gemm_m: tuple[int, ...]
    """GEMM tokens (m)."""
    gemm_nk: tuple[int, ...]
    """GEMM output and input widths (n and k each take every value)."""
    attention: tuple[AttentionShape, ...]
    block: BlockWidths
    elementwise_tokens: tuple[int, ...]
    """Token counts of the memory-bound ops."""
    grouped: tuple[GroupedShape, ...]
    optimizer_parameters: tuple[int, ...]
    """Parameter counts of the AdamW steps."""
    collective_bytes: tuple[int, ...]
    """Message sizes in bytes (only under torchrun with several ranks)."""
    warmup: int
    """Untimed runs before timing."""
    repeats: int
    """Timed runs; the median is recorded."""

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.repeats < 1:
            raise ValueError(f"warmup must be >= 0 and repeats >= 1, got {self.warmup} and {self.repeats}")


@dataclass(frozen=True, slots=True, kw_only=True)
class SuiteRates:
    """A device's calibrated rates, for run-time estimates."""

    flops_per_s: float
    """bf16 GEMM FLOP/s at a saturating shape."""
    bytes_per_s: float
    """Device-to-device copy bandwidth (bytes read plus written per second)."""
    compile_s: float
    """Seconds per ``torch.compile`` of one op at one shape."""


def gemm_pass_shape(m: int, n: int, k: int, which: GemmPass) -> tuple[int, int, int]:
    """(m, n, k) of C[m, n] = A[m, k]·B[k, n] for one pass of a linear layer Y[m, n] = X[m, k]·W[n, k]ᵀ:
    forward as written; dgrad dX[m, k] = dY[m, n]·W[n, k]; wgrad dW[n, k] = dY[m, n]ᵀ·X[m, k]."""
    return {"forward": (m, n, k), "dgrad": (m, k, n), "wgrad": (n, k, m)}[which]


def gemm_layer_shapes(grid: TrainingGrid) -> tuple[tuple[int, int, int], ...]:
    """The forward (m, n, k) of every linear layer the GEMM part times."""
    return tuple((m, n, k) for m in grid.gemm_m for n in grid.gemm_nk for k in grid.gemm_nk)


def elementwise_bytes(op: str, tokens: int, block: BlockWidths) -> int:
    """The HBM bytes ``op`` must move at minimum over ``tokens`` tokens (bf16): each input read once, each output
    written once."""
    d, width = block.head_dim, (block.heads + block.kv_heads) * block.head_dim
    elements = {"rmsnorm": 2 * tokens * block.hidden + block.hidden,  # x in, y out, the weight
                "swiglu": 3 * tokens * block.ffn,  # gate and up in, the product out
                "rotary": 2 * tokens * width + 2 * tokens * d,  # q and k in and out, cos and sin
                "residual_add": 3 * tokens * block.hidden}[op]
    return BF16_BYTES * elements


def math_backend_fits(shape: AttentionShape) -> bool:
    """Whether the math SDPA backend is timed at ``shape`` (see MATH_MAX_SCORE_ELEMENTS)."""
    return shape.batch * shape.heads * shape.seq_len**2 <= MATH_MAX_SCORE_ELEMENTS


def optimizer_tensors(parameters: int) -> int:
    """How many tensors ``parameters`` are split into."""
    return max(1, -(-parameters // OPTIMIZER_TENSOR_ELEMENTS))


def grid_for(spec: ModelSpec, quick: bool, warmup: int | None = None, repeats: int | None = None) -> TrainingGrid:
    """The default grid (``quick``: the tiny one), the memory-bound ops at ``spec``'s widths; ``warmup`` and
    ``repeats`` override the grid's."""
    block = BlockWidths(hidden=spec.hidden_size, ffn=spec.ffn_size, heads=spec.num_heads,
                        kv_heads=spec.num_kv_heads, head_dim=spec.head_dim)
    grid = _quick_grid(block) if quick else _default_grid(block)
    return dataclasses.replace(grid, warmup=grid.warmup if warmup is None else warmup,
                               repeats=grid.repeats if repeats is None else repeats)


def _default_grid(block: BlockWidths) -> TrainingGrid:
    """Llama/Qwen training shapes on one GPU: m 512-65536 and n, k 512-65536 in powers of two (3 x 512 GEMMs:
    about 2.3 minutes at H100's 700 TFLOP/s); causal SDPA over 1k-32k tokens, batch x heads 8-256 with 4 query
    heads per KV head, head widths 64 and 128; experts 8-128 with 128-8192 tokens each."""
    powers = tuple(2**p for p in range(9, 17))
    pairs = ((1, 8), (1, 32), (2, 64), (4, 64))  # batch x heads: 8, 32, 128, 256
    attention = tuple(AttentionShape(batch=b, heads=h, kv_heads=h // 4, seq_len=2**s, head_dim=d)
                      for s in range(10, 16) for b, h in pairs for d in (64, 128))
    grouped = tuple(GroupedShape(experts=e, tokens_per_expert=t, n=n, k=k) for e in (8, 16, 32, 64, 128)
                    for t in (128, 512, 2048, 8192) for n in (512, 1024, 2048, 4096, 8192)
                    for k in (512, 1024, 2048, 4096, 8192))
    return TrainingGrid(name="default", gemm_m=powers, gemm_nk=powers, attention=attention, block=block,
                        elementwise_tokens=tuple(4**p for p in range(4, 9)), grouped=grouped,
                        optimizer_parameters=tuple(4**p for p in range(10, 16)),
                        collective_bytes=tuple(2**p for p in range(10, 31, 2)), warmup=2, repeats=5)


def _quick_grid(block: BlockWidths) -> TrainingGrid:
    """A few tiny shapes per part: every code path in seconds on a CPU (the memory-bound ops keep the model's
    widths, at a few tokens)."""
    attention = tuple(AttentionShape(batch=1, heads=4, kv_heads=2, seq_len=s, head_dim=32) for s in (32, 64))
    grouped = tuple(GroupedShape(experts=e, tokens_per_expert=16, n=32, k=64) for e in (2, 4))
    return TrainingGrid(name="quick", gemm_m=(16, 32), gemm_nk=(16, 32), attention=attention, block=block,
                        elementwise_tokens=(8,), grouped=grouped, optimizer_parameters=(2**10, 2**12),
                        collective_bytes=(2**12, 2**16), warmup=1, repeats=2)


def part_points(part: PartName, grid: TrainingGrid) -> int:
    """Measured points of ``part`` (the progress bar's length; a point may give several rows)."""
    return {"gemm": len(gemm_layer_shapes(grid)), "attention": len(grid.attention) * len(ATTENTION_BACKENDS),
            "elementwise": len(grid.elementwise_tokens) * len(ELEMENTWISE_OPS), "grouped_gemm": len(grid.grouped),
            "optimizer": len(grid.optimizer_parameters), "collectives": len(grid.collective_bytes)}[part]


def part_estimated_seconds(part: PartName, grid: TrainingGrid, rates: SuiteRates) -> float:
    """Run time of ``part`` at ``rates``, warm-up runs included: GEMMs and attention through ``estimated_seconds``
    (every pass of every shape; attention once per backend, the math backend only where it is timed), memory-bound
    ops and the optimizer at ELEMENTWISE_BYTES_FRAC of the copy bandwidth plus their compiles, collectives at
    LINK_BYTES_FRAC of it."""
    runs = grid.warmup + grid.repeats
    if part == "gemm":
        shapes = tuple(gemm_pass_shape(*s, p) for s in gemm_layer_shapes(grid) for p in GEMM_PASSES)
        return _flop_seconds(grid, rates, shapes)
    if part == "attention":
        times = tuple((s.batch, s.heads, s.seq_len, s.head_dim) for s in grid.attention
                      for backend in ATTENTION_BACKENDS if backend != "math" or math_backend_fits(s))
        return _flop_seconds(grid, rates, (), times)
    if part == "grouped_gemm":
        shapes = tuple((g.experts * g.tokens_per_expert, g.n, g.k) for g in grid.grouped)
        return _flop_seconds(grid, rates, shapes)
    bandwidth = rates.bytes_per_s * ELEMENTWISE_BYTES_FRAC
    if part == "elementwise":
        moved = sum(elementwise_bytes(op, t, grid.block) for op in ELEMENTWISE_OPS for t in grid.elementwise_tokens)
        return 2 * moved * runs / bandwidth + part_points(part, grid) * rates.compile_s
    if part == "optimizer":
        return sum(grid.optimizer_parameters) * ADAMW_BYTES_PER_PARAMETER * runs / bandwidth
    return 5 * sum(grid.collective_bytes) * runs / (rates.bytes_per_s * LINK_BYTES_FRAC)


def _flop_seconds(grid: TrainingGrid, rates: SuiteRates, gemm_shapes: tuple[tuple[int, int, int], ...],
                  attention_shapes: tuple[tuple[int, int, int, int], ...] = ()) -> float:
    """``estimated_seconds`` of these GEMMs and attention shapes at the grid's runs and the calibrated FLOP rate."""
    settings = ProfileSettings(gemm_shapes=gemm_shapes, attention_shapes=attention_shapes, warmup=grid.warmup,
                               repeats=grid.repeats)
    return estimated_seconds(settings, rates.flops_per_s)
