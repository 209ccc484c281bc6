"""The training suite's timings, one function per part: GEMM passes, SDPA per backend, memory-bound ops eager and
compiled, MoE grouped GEMMs, the AdamW step. PyTorch is imported by the caller (``profile_suite``) and handed in.

Each function returns paraplan-profile rows; whatever a device or a PyTorch build cannot run (an SDPA backend,
``torch.compile``, ``torch._grouped_mm``, a shape past the GPU's memory) is left out and noted in ``Bench.skipped``
with its reason, and the part goes on.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from types import ModuleType
from typing import Any

from paraplan.files import one_line
from paraplan.measurements.profile_grids import (
    ADAMW_BYTES_PER_PARAMETER,
    ATTENTION_BACKENDS,
    ELEMENTWISE_OPS,
    GEMM_PASSES,
    OPTIMIZER_TENSOR_ELEMENTS,
    AttentionShape,
    BlockWidths,
    TrainingGrid,
    elementwise_bytes,
    gemm_layer_shapes,
    gemm_pass_shape,
    math_backend_fits,
    optimizer_tensors,
)
from paraplan.measurements.profiler import Row, Tensor, measured_row, median_seconds

SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "math": "MATH"}
"""paraplan's backend names and ``torch.nn.attention.SDPBackend``'s."""
GPU_MEMORY_FRAC = 0.5
"""A grouped GEMM whose operands need more than this share of the GPU's memory is skipped (the allocator's cache
and the previous shapes' blocks need the rest)."""


@dataclass(slots=True, kw_only=True)
class Bench:
    """What every timing needs, and the skips collected along the way."""

    torch: ModuleType
    """The imported ``torch``."""
    device: str
    """``cuda`` or ``cpu``."""
    stack: str
    """The ``stack`` param of every row (``pytorch <version>``)."""
    warmup: int
    """Untimed runs before timing."""
    repeats: int
    """Timed runs; the median is recorded."""
    progress: Callable[[str], None] | None = None
    """Called with a short label before each measured point."""
    skipped: dict[tuple[str, str], int] = field(default_factory=dict)
    """(what, reason) -> points left out."""

    def time(self, fn: Callable[[], object]) -> float:
        """Median seconds of ``fn``."""
        return median_seconds(self.torch, self.device, fn, self.warmup, self.repeats)

    def tick(self, label: str) -> None:
        """Report the next point."""
        if self.progress is not None:
            self.progress(label)

    def skip(self, what: str, reason: object) -> None:
        """Note that a point of ``what`` was left out, and why."""
        key = (what, one_line(str(reason).strip().split("\n")[0] or type(reason).__name__, 200))
        self.skipped[key] = self.skipped.get(key, 0) + 1

    def attempt(self, what: str, measure: Callable[[], list[Row]]) -> list[Row]:
        """``measure()``, or no rows and a skip where it raises (out of memory; a kernel this build lacks)."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # SDPA explains at length why a forced backend cannot run
                return measure()
        except RuntimeError as exc:  # torch's OutOfMemoryError and "no kernel" errors are RuntimeErrors
            self.skip(what, exc)
            if self.device == "cuda":
                self.torch.cuda.empty_cache()
            return []

    def randn(self, *shape: int, dtype: Any = None, grad: bool = False) -> Tensor:
        """A bf16 (or ``dtype``) normal tensor on the device."""
        dtype = self.torch.bfloat16 if dtype is None else dtype
        return self.torch.randn(*shape, device=self.device, dtype=dtype, requires_grad=grad)

    def row(self, kind: str, name: str, seconds: float, params: dict[str, Any]) -> Row:
        """A row with this stack."""
        return measured_row(kind, name, seconds, {**params, "stack": self.stack})


def gemm_rows(bench: Bench, grid: TrainingGrid) -> list[Row]:
    """Forward, dgrad and wgrad of a linear layer Y = X·Wᵀ at every (m, n, k) of the grid, each recorded as the
    GEMM it is (``gemm_pass_shape``)."""
    rows: list[Row] = []
    for m, n, k in gemm_layer_shapes(grid):
        bench.tick(f"GEMM {m}x{n}x{k}")
        rows += bench.attempt(f"GEMM {m}x{n}x{k}", partial(_gemm_passes, bench, m, n, k))
    return rows


def _gemm_passes(bench: Bench, m: int, n: int, k: int) -> list[Row]:
    torch = bench.torch
    x, w, dy = bench.randn(m, k), bench.randn(n, k), bench.randn(m, n)
    calls = {"forward": partial(torch.nn.functional.linear, x, w), "dgrad": partial(torch.matmul, dy, w),
             "wgrad": partial(torch.matmul, dy.t(), x)}
    rows = []
    for which in GEMM_PASSES:
        mm, nn, kk = gemm_pass_shape(m, n, k, which)
        rows.append(bench.row("gemm", "matmul", bench.time(calls[which]),
                              {"m": mm, "n": nn, "k": kk, "dtype": "bf16", "pass": which}))
    return rows


def attention_rows(bench: Bench, grid: TrainingGrid) -> list[Row]:
    """Causal SDPA forward and backward at every shape, for SDPA's own choice and each forced backend."""
    rows: list[Row] = []
    for shape in grid.attention:
        for backend in ATTENTION_BACKENDS:
            bench.tick(f"attention {backend} s={shape.seq_len} h={shape.heads}")
            if backend == "math" and not math_backend_fits(shape):
                bench.skip("attention backend math", "shapes of over 2**30 score elements (memory and time)")
                continue
            rows += bench.attempt(f"attention backend {backend}", partial(_attention_pair, bench, shape, backend))
    return rows


@contextlib.contextmanager
def _forced_backend(torch: ModuleType, backend: str) -> Iterator[None]:
    """SDPA restricted to ``backend`` (``default``: unrestricted)."""
    if backend == "default":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[backend])):
        yield


def _attention_pair(bench: Bench, shape: AttentionShape, backend: str) -> list[Row]:
    """(forward, backward) rows of one shape under one backend."""
    torch = bench.torch
    q = bench.randn(shape.batch, shape.heads, shape.seq_len, shape.head_dim, grad=True)
    k, v = (bench.randn(shape.batch, shape.kv_heads, shape.seq_len, shape.head_dim, grad=True) for _ in range(2))
    with torch.enable_grad(), _forced_backend(torch, backend):
        call, gqa = _sdpa_call(torch, q, k, v)
        forward = bench.time(call)
        out = call()
        grad = torch.randn_like(out)
        backward = bench.time(partial(torch.autograd.grad, out, (q, k, v), grad, retain_graph=True))
    params = {"batch": shape.batch, "seq_len": shape.seq_len, "heads": shape.heads, "kv_heads": shape.kv_heads,
              "head_dim": shape.head_dim, "causal": 1, "backend": backend, "gqa": gqa, "dtype": "bf16"}
    return [bench.row("attention", "sdpa", forward, {**params, "pass": "forward"}),
            bench.row("attention", "sdpa", backward, {**params, "pass": "backward"})]


def _sdpa_call(torch: ModuleType, q: Tensor, k: Tensor, v: Tensor) -> tuple[Callable[[], Tensor], str]:
    """Causal SDPA on (q, k, v) and how grouped-query attention is done: ``none`` (as many KV heads as query
    heads), ``enable_gqa`` (SDPA's own, PyTorch >= 2.5, where the backend takes it) or ``repeat_kv`` (K and V
    repeated to every query head first, as torchtitan's Llama does)."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if k.shape[1] == q.shape[1]:
        return partial(sdpa, q, k, v, is_causal=True), "none"
    try:
        sdpa(q, k, v, is_causal=True, enable_gqa=True)
        return partial(sdpa, q, k, v, is_causal=True, enable_gqa=True), "enable_gqa"
    except (TypeError, RuntimeError):  # TypeError: a PyTorch before enable_gqa; RuntimeError: this backend lacks it
        groups = q.shape[1] // k.shape[1]
        return (lambda: sdpa(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), is_causal=True),
                "repeat_kv")


def block_ops(torch: ModuleType) -> dict[str, Callable[..., Any]]:
    """A Llama block's memory-bound ops as torchtitan writes them: RMSNorm (in fp32, eps 1e-6), SwiGLU's
    silu(gate)·up, rotary embedding (rotate-half form) of q and k, and the residual add."""
    def rmsnorm(x: Tensor, weight: Tensor) -> Tensor:
        y = x.float()
        return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x) * weight

    def rotary(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        def half(x: Tensor) -> Tensor:
            x1, x2 = x.chunk(2, dim=-1)
            return torch.cat((-x2, x1), dim=-1)

        return q * cos + half(q) * sin, k * cos + half(k) * sin

    return {"rmsnorm": rmsnorm, "swiglu": lambda gate, up: torch.nn.functional.silu(gate) * up, "rotary": rotary,
            "residual_add": torch.add}


def _op_inputs(bench: Bench, op: str, tokens: int, block: BlockWidths) -> tuple[Tensor, ...]:
    """The bf16 inputs of ``op`` over ``tokens`` tokens."""
    if op == "rmsnorm":
        return bench.randn(tokens, block.hidden), bench.randn(block.hidden)
    if op == "swiglu":
        return bench.randn(tokens, block.ffn), bench.randn(tokens, block.ffn)
    if op == "rotary":
        return (bench.randn(tokens, block.heads, block.head_dim), bench.randn(tokens, block.kv_heads, block.head_dim),
                bench.randn(tokens, 1, block.head_dim), bench.randn(tokens, 1, block.head_dim))
    return bench.randn(tokens, block.hidden), bench.randn(tokens, block.hidden)


def elementwise_rows(bench: Bench, grid: TrainingGrid) -> list[Row]:
    """Each memory-bound op at each token count, eager and through ``torch.compile`` (forward, no autograd)."""
    ops, rows = block_ops(bench.torch), list[Row]()
    for tokens in grid.elementwise_tokens:
        for op in ELEMENTWISE_OPS:
            bench.tick(f"{op} t={tokens}")
            args = _op_inputs(bench, op, tokens, grid.block)
            params = {"op": op, "bytes": elementwise_bytes(op, tokens, grid.block), "tokens": tokens,
                      "dtype": "bf16", "pass": "forward"}
            with bench.torch.no_grad():
                rows.append(bench.row("elementwise", op, bench.time(partial(ops[op], *args)),
                                      {**params, "compiled": 0}))
                seconds = _compiled_seconds(bench, ops[op], args, f"torch.compile of {op}")
            if seconds is not None:
                rows.append(bench.row("elementwise", op, seconds, {**params, "compiled": 1}))
    return rows


def _compiled_seconds(bench: Bench, fn: Callable[..., Any], args: tuple[Tensor, ...], what: str) -> float | None:
    """Median seconds of ``torch.compile(fn)`` on ``args``, compiled first outside the timing; None (and a skip)
    where compiling fails (no C++ compiler or Triton, an unsupported op)."""
    torch = bench.torch
    try:
        torch._dynamo.reset()  # a fresh cache per shape: no recompile limit, no dynamic-shape kernel
        compiled = torch.compile(fn, dynamic=False)
        compiled(*args)
    except Exception as exc:  # noqa: BLE001 - the compiler stack raises many types; the eager row stands alone
        bench.skip(what, exc)
        return None
    return bench.time(partial(compiled, *args))


def grouped_rows(bench: Bench, grid: TrainingGrid) -> list[Row]:
    """``torch._grouped_mm`` (the MoE experts' GEMM torchtitan calls) at every grouped shape, balanced routing."""
    torch, rows = bench.torch, list[Row]()
    if not hasattr(torch, "_grouped_mm"):
        bench.skip("grouped_mm", f"torch {torch.__version__} has no torch._grouped_mm")
        return rows
    cuda = bench.device == "cuda"
    memory = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory if cuda else None
    for g in grid.grouped:
        bench.tick(f"grouped_mm e={g.experts} t={g.tokens_per_expert} {g.n}x{g.k}")
        total = g.experts * g.tokens_per_expert
        if memory is not None and 2 * (total * g.k + g.experts * g.n * g.k + total * g.n) > GPU_MEMORY_FRAC * memory:
            bench.skip("grouped_mm", "operands over half of the GPU's memory")
            continue
        rows += bench.attempt("grouped_mm", partial(_grouped_row, bench, g.experts, g.tokens_per_expert, g.n, g.k))
    return rows


def _grouped_row(bench: Bench, experts: int, tokens_per_expert: int, n: int, k: int) -> list[Row]:
    torch, total = bench.torch, experts * tokens_per_expert
    x, w = bench.randn(total, k), bench.randn(experts, n, k)
    offsets = torch.arange(tokens_per_expert, total + 1, tokens_per_expert, device=bench.device, dtype=torch.int32)
    seconds = bench.time(partial(torch._grouped_mm, x, w.transpose(-2, -1), offs=offsets))
    return [bench.row("gemm", "grouped_mm", seconds, {"experts": experts, "tokens_per_expert": tokens_per_expert,
                                                      "m": total, "n": n, "k": k, "dtype": "bf16",
                                                      "pass": "forward"})]


def optimizer_rows(bench: Bench, grid: TrainingGrid) -> list[Row]:
    """One ``torch.optim.AdamW`` step over fp32 parameters with gradients: fused on a GPU, foreach on CPU."""
    rows: list[Row] = []
    for parameters in grid.optimizer_parameters:
        bench.tick(f"adamw {parameters:,} parameters")
        rows += bench.attempt("adamw_step", partial(_adamw_row, bench, parameters))
    return rows


def _adamw_row(bench: Bench, parameters: int) -> list[Row]:
    torch, tensors = bench.torch, optimizer_tensors(parameters)
    sizes = [min(OPTIMIZER_TENSOR_ELEMENTS, parameters - i * OPTIMIZER_TENSOR_ELEMENTS) for i in range(tensors)]
    weights = [torch.zeros(size, device=bench.device, dtype=torch.float32, requires_grad=True) for size in sizes]
    for weight in weights:
        weight.grad = torch.randn_like(weight)
    fused = bench.device == "cuda"
    optimizer = torch.optim.AdamW(weights, lr=1e-4, weight_decay=0.1, **({"fused": True} if fused else
                                                                        {"foreach": True}))
    optimizer.step()  # the moments are created on the first step: never inside the timing
    seconds = bench.time(optimizer.step)
    return [bench.row("elementwise", "adamw_step", seconds,
                      {"parameters": parameters, "tensors": tensors, "bytes": ADAMW_BYTES_PER_PARAMETER * parameters,
                       "implementation": "fused" if fused else "foreach", "dtype": "fp32"})]
