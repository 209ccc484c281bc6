"""``paraplan profile``: microbenchmarks written in paraplan's JSON profile format.

GEMMs over the shapes a model's layers use (QKV, output, up, down projections at several token
counts and TP degrees; bf16, and fp8 where the GPU has it), scaled-dot-product attention forward
and backward, a device-to-device copy for memory bandwidth, and, under ``torchrun`` with several
ranks, NCCL all-reduce, all-gather, reduce-scatter, all-to-all and send/recv. Each timing is the
median of ``repeats`` runs after ``warmup`` runs, with CUDA events on a GPU and the wall clock on
CPU (hardware ``cpu``: for tests and dry runs, never mixed with GPU data). Every row's params name
the ``stack`` (``pytorch <version>``). PyTorch is imported only inside the functions, here and in
the training suite (``profile_suite``), so paraplan works without it.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeAlias

from paraplan.errors import InputError
from paraplan.measurements.ingest.hardware_names import CPU, catalog_name
from paraplan.measurements.ingest.paraplan_format import FORMAT_NAME, FORMAT_VERSION
from paraplan.model_specs.model_spec import ModelSpec

COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")

Tensor: TypeAlias = Any
"""A torch.Tensor: PyTorch is optional and imported inside the functions, so its types are not imported here."""
Row: TypeAlias = dict[str, Any]
"""One measurement of the paraplan-profile JSON format (kind, name, model, time_s, params)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileSettings:
    """What to measure and how often."""

    gemm_shapes: tuple[tuple[int, int, int], ...]
    """(m, n, k) of every GEMM to time."""
    attention_shapes: tuple[tuple[int, int, int, int], ...] = ()
    """(batch, heads, seq_len, head_dim) of causal attention to time forward and backward."""
    copy_bytes: tuple[int, ...] = ()
    """Buffer sizes in bytes for the memory-bandwidth copy."""
    collective_bytes: tuple[int, ...] = ()
    """Message sizes in bytes for the collectives (only with several ranks)."""
    warmup: int = 3
    """Untimed runs before timing (kernel selection, caches, clocks)."""
    repeats: int = 10
    """Timed runs; the median is recorded."""
    device: str = "auto"
    """``auto`` (GPU when present), ``cuda`` or ``cpu``."""

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.repeats < 1:
            raise ValueError("warmup must be >= 0 and repeats >= 1")
        if self.device not in ("auto", "cuda", "cpu"):
            raise ValueError(f"device must be auto, cuda or cpu, got {self.device!r}")


def model_gemm_shapes(model: ModelSpec, tokens: tuple[int, ...],
                      tps: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
    """The forward GEMMs of one of ``model``'s layers for each token count and TP degree (as layer.py costs them)."""
    h, q, kv, f = model.hidden_size, model.q_width, model.kv_width, model.ffn_size
    up = f * (model.mlp_matrices - 1)
    shapes = {(t, (q + 2 * kv) // tp, h) for t in tokens for tp in tps}
    shapes |= {(t, h, q // tp) for t in tokens for tp in tps}
    shapes |= {(t, up // tp, h) for t in tokens for tp in tps} | {(t, h, f // tp) for t in tokens for tp in tps}
    return tuple(sorted(shapes))


def import_torch() -> ModuleType:
    """``torch``, or InputError saying how to install it."""
    try:
        import torch
    except ImportError:
        raise InputError("paraplan profile needs PyTorch: pip install 'paraplan[profile]'") from None
    return torch


def resolve_device(wanted: str) -> str:
    """``auto``, ``cuda`` or ``cpu`` as the device the profile will run on (imports PyTorch)."""
    return pick_device(import_torch(), wanted)


def calibration_flops_per_s(device: str, shape: tuple[int, int, int]) -> float:
    """bf16 FLOP/s of one GEMM of ``shape`` (one warm-up, the best of three): the rate the run-time estimate
    extrapolates from (on CPU bf16 runs at well under 1 GFLOP/s, three orders below a GPU)."""
    torch = import_torch()
    m, n, k = shape
    with torch.no_grad():
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
        seconds = min(median_seconds(torch, device, lambda: a @ b, 1, 1) for _ in range(3))
    return 2.0 * m * n * k / seconds


def estimated_seconds(settings: ProfileSettings, flops_per_s: float) -> float:
    """Run time of ``settings`` at ``flops_per_s``: every GEMM and attention pass, warm-up runs included
    (attention forward 4·b·h·s²·d FLOPs, backward 2.5x that; copies and collectives are small beside them)."""
    runs = settings.warmup + settings.repeats
    gemm = sum(2.0 * m * n * k for m, n, k in settings.gemm_shapes)
    attention = sum(4.0 * b * h * s * s * d * 3.5 for b, h, s, d in settings.attention_shapes)
    return (gemm + attention) * runs / flops_per_s


def pick_device(torch: ModuleType, wanted: str) -> str:
    """``cuda`` or ``cpu`` for ``wanted`` (``auto``, ``cuda``, ``cpu``); InputError for cuda without a GPU."""
    if wanted == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda asked for, but PyTorch sees no CUDA GPU; use --device cpu or auto")
    return "cuda" if wanted == "cuda" or (wanted == "auto" and torch.cuda.is_available()) else "cpu"


def median_seconds(torch: ModuleType, device: str, fn: Callable[[], object], warmup: int, repeats: int) -> float:
    """Median seconds of ``fn`` after ``warmup`` calls: CUDA events on a GPU, perf_counter on CPU."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)  # elapsed_time is in milliseconds
        else:
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
    return statistics.median(times)


def measured_row(kind: str, name: str, seconds: float, params: dict[str, Any]) -> Row:
    """One measurement in the paraplan-profile JSON form."""
    return {"kind": kind, "name": name, "model": "", "time_s": seconds, "params": params}


def _gemms(torch: ModuleType, device: str, settings: ProfileSettings,
           progress: Callable[[str], None] | None = None) -> list[Row]:
    rows: list[Row] = []
    for m, n, k in settings.gemm_shapes:
        if progress is not None:
            progress(f"GEMM {m}x{n}x{k}")
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
        # Timed at once, within this iteration: the closure sees this iteration's a and b.
        seconds = median_seconds(torch, device, lambda: a @ b, settings.warmup, settings.repeats)
        rows.append(measured_row("gemm", "matmul", seconds,
                                 {"m": m, "n": n, "k": k, "dtype": "bf16", "pass": "forward"}))
        rows += _fp8_gemm(torch, device, settings, a, b)
    return rows


def _fp8_gemm(torch: ModuleType, device: str, settings: ProfileSettings, a: Tensor, b: Tensor) -> list[Row]:
    """fp8 (e4m3) GEMM through torch._scaled_mm on GPUs with fp8 tensor cores (compute capability >= 8.9)."""
    if device != "cuda" or torch.cuda.get_device_capability() < (8, 9) or not hasattr(torch, "_scaled_mm"):
        return []
    a8, b8 = a.to(torch.float8_e4m3fn), b.t().contiguous().to(torch.float8_e4m3fn).t()
    one = torch.ones((), device=device)
    try:
        seconds = median_seconds(torch, device, lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16),
                                 settings.warmup, settings.repeats)
    except RuntimeError:  # a shape cuBLASLt's fp8 path refuses (dims not multiples of 16)
        return []
    m, k = a.shape
    return [measured_row("gemm", "scaled_mm", seconds, {"m": m, "n": b.shape[1], "k": k, "dtype": "fp8",
                                                               "pass": "forward"})]


def _attention(torch: ModuleType, device: str, settings: ProfileSettings,
               progress: Callable[[str], None] | None = None) -> list[Row]:
    rows: list[Row] = []
    for batch, heads, seq, dim in settings.attention_shapes:
        if progress is not None:
            progress(f"attention s={seq} h={heads}")
        params = {"batch": batch, "heads": heads, "kv_heads": heads, "seq_len": seq, "head_dim": dim, "causal": 1,
                  "backend": "default", "dtype": "bf16"}
        forward, backward = _attention_times(torch, device, settings, (batch, heads, seq, dim))
        rows += [measured_row("attention", "sdpa", forward, {**params, "pass": "forward"}),
                 measured_row("attention", "sdpa", backward, {**params, "pass": "backward"})]
    return rows


def _attention_times(torch: ModuleType, device: str, settings: ProfileSettings,
                     shape: tuple[int, ...]) -> tuple[float, float]:
    """(forward, backward) median seconds of causal scaled-dot-product attention (flash/SDPA backend)."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q, k, v = (torch.randn(*shape, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    forward = median_seconds(torch, device, lambda: sdpa(q, k, v, is_causal=True), settings.warmup, settings.repeats)
    out = sdpa(q, k, v, is_causal=True)
    grad = torch.ones_like(out)
    backward = median_seconds(torch, device, lambda: out.backward(grad, retain_graph=True), settings.warmup,
                              settings.repeats)
    return forward, backward


def _copies(torch: ModuleType, device: str, settings: ProfileSettings) -> list[Row]:
    rows: list[Row] = []
    for size in settings.copy_bytes:
        src = torch.empty(size, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        # Timed at once, within this iteration: the closure sees this iteration's buffers.
        seconds = median_seconds(torch, device, lambda: dst.copy_(src), settings.warmup, settings.repeats)
        rows.append(measured_row("memory", "copy", seconds, {"bytes": 2 * size}))  # read + write
    return rows


def collective_rows(torch: ModuleType, device: str, settings: ProfileSettings) -> list[Row]:
    """Every collective at every size of ``settings`` over the initialised process group (none with one rank)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return []
    world = dist.get_world_size()
    rows: list[Row] = []
    for size in settings.collective_bytes:
        x = torch.ones(max(size // 2, world), dtype=torch.bfloat16, device=device)
        params = {"size_bytes": float(x.numel() * 2), "group_size": world, "domain": "intra",
                  "devices_per_node": world}
        for name, fn in _collective_calls(dist, x).items():
            try:
                seconds = median_seconds(torch, device, fn, settings.warmup, settings.repeats)
            except RuntimeError:  # a backend without this collective (gloo has no reduce-scatter)
                continue
            rows.append(measured_row("collective", name, seconds, dict(params)))
    return rows


def _collective_calls(dist: ModuleType, x: Tensor) -> dict[str, Callable[[], object]]:
    """One call per collective on buffer ``x`` (sizes as NCCL's tests count them: the full buffer)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    shard = x[: x.numel() // world]
    incoming = x.clone()
    return {"all_reduce": lambda: dist.all_reduce(x),
            "all_gather": lambda: dist.all_gather_into_tensor(x[: shard.numel() * world], shard),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, x[: shard.numel() * world]),
            "all_to_all": lambda: dist.all_to_all_single(incoming[: shard.numel() * world],
                                                         x[: shard.numel() * world]),
            "send_recv": lambda: [w.wait() for w in dist.batch_isend_irecv(
                [dist.P2POp(dist.isend, x, (rank + 1) % world), dist.P2POp(dist.irecv, incoming, (rank - 1) % world)])]}


def software_description(torch: ModuleType, device: str) -> str:
    """Versions of torch, CUDA, cuDNN, NCCL and the driver (CPU: a note that the timings are not a GPU's)."""
    parts = [f"torch {torch.__version__}"]
    if device == "cuda":
        parts += [f"CUDA {torch.version.cuda}", f"cuDNN {torch.backends.cudnn.version()}",
                  f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}", f"driver {_driver_version()}"]
    return "; ".join(parts) + ("" if device == "cuda" else "; device: cpu (CPU timings, not a GPU)")


def stack_name(torch: ModuleType) -> str:
    """The ``stack`` param of every row: ``pytorch <torch.__version__>`` (e.g. ``pytorch 2.11.0+cu130``)."""
    return f"pytorch {torch.__version__}"


def _driver_version() -> str:
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as handle:
            return driver_version_of(handle.readline())
    except OSError:
        return "unknown"


def driver_version_of(line: str) -> str:
    """The driver version in the first line of ``/proc/driver/nvidia/version``, the first dotted number after
    "Kernel Module": ``NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  ...`` and the open module's
    ``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  ...`` (whose word after "Kernel
    Module" is "for") both give the number; ``unknown`` when there is none."""
    found = re.search(r"\b\d+\.\d+(?:\.\d+)?\b", line.split("Kernel Module")[-1])
    return found.group(0) if found else "unknown"


def run_profile(settings: ProfileSettings, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Time everything in ``settings``; a paraplan-profile JSON document (``ingest`` reads it). ``progress`` is
    called with a short label after each measured point."""
    torch = import_torch()
    device = pick_device(torch, settings.device)
    name = torch.cuda.get_device_name() if device == "cuda" else CPU
    hardware = catalog_name(name) if device == "cuda" else CPU
    with torch.no_grad():
        rows = _gemms(torch, device, settings, progress) + _copies(torch, device, settings)
    rows += _attention(torch, device, settings, progress) + collective_rows(torch, device, settings)
    stack = stack_name(torch)
    rows = [{**row, "params": {**row["params"], "stack": stack}} for row in rows]
    return {"format": FORMAT_NAME, "version": FORMAT_VERSION, "hardware": hardware, "device": device,
            "device_name": name, "software": software_description(torch, device), "measurements": rows}
