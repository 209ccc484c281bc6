"""Everything paraplan shows: rich tables and panels on a Console, and plain JSON files.

Functions here take plain data (specs, plans, dicts of SI numbers) and a Console; they convert
units for display only (seconds to 3 significant digits, GiB to 1 decimal, MFU in percent).
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Protocol

from rich import box
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.measure import Measurement
from rich.panel import Panel
from rich.table import Table

from paraplan.choices import Objective
from paraplan.cost_models.device_memory import MEASURED_LIVE_UNDER_FRAC, usable_capacity_bytes
from paraplan.errors import InputError
from paraplan.hardware_profiles import ClusterSpec, GPUSpec
from paraplan.hardware_profiles.specs import BUILTIN, Calibration
from paraplan.hardware_profiles.units import (
    BYTES_PER_GB,
    BYTES_PER_GIB,
    BYTES_PER_TB,
    FLOPS_PER_TFLOP,
    SECONDS_PER_US,
)
from paraplan.hardware_profiles.user_file import origin_text
from paraplan.model_specs.model_spec import ModelSpec
from paraplan.planner.job import ParallelConfig
from paraplan.planner.plan import Plan, memory_capacity

PARAMS_PER_BILLION = 1e9  # a count, not a unit: "8.03 B parameters"
# Tables wider than 80 columns read badly when folded; files and pipes get a wider page.
NON_TERMINAL_WIDTH = 120
UNBOUNDED_WIDTH = 10_000
STEP_LABELS = {
    "compute_s": "compute (fwd + bwd + recompute)", "tp_comm_s": "TP communication", "cp_comm_s": "CP communication",
    "ep_comm_s": "EP all-to-all",
    "pp_comm_s": "PP point-to-point", "bubble_s": "pipeline bubble", "dp_comm_s": "DP communication (exposed)",
    "offload_s": "activation offload (exposed)",
    "optimizer_s": "optimizer step",
}
MEMORY_LABELS = {
    "weights_bytes": "weights", "grads_bytes": "gradients", "optimizer_bytes": "optimizer states",
    "activations_bytes": "activations", "logits_bytes": "logits (fp32 loss)",
    "transient_bytes": "transient (gathered params, recompute, CP K/V)",
    "reserve_bytes": "allocator cache + CUDA context/NCCL",
}


# -- consoles and number formats --------------------------------------------------------------
STDOUT_PATH = "-"
"""``--json -``: the JSON document goes to standard output, and everything meant for people to stderr."""
_human_to_stderr = False


def is_stdout(path: Path | None) -> bool:
    """True for ``--json -``."""
    return path is not None and str(path) == STDOUT_PATH


def route_human_output(json_path: Path | None) -> None:
    """Send tables and messages to stderr while a command writes its JSON to stdout (``--json -``)."""
    global _human_to_stderr
    _human_to_stderr = is_stdout(json_path)


def make_console(stderr: bool = False) -> Console:
    """A console on stdout (or stderr, or stderr whenever stdout carries JSON); wider than 80 columns when not a
    terminal."""
    console = Console(stderr=stderr or _human_to_stderr, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = NON_TERMINAL_WIDTH
    return console


def working(console: Console, message: str) -> AbstractContextManager:
    """A spinner on a terminal; nothing at all when output is captured or piped."""
    return console.status(message) if console.is_terminal else nullcontext()


def _natural_width(console: Console, renderable: RenderableType) -> int:
    """Columns ``renderable`` takes when nothing is folded."""
    return Measurement.get(console, console.options.update_width(UNBOUNDED_WIDTH), renderable).maximum


def print_table(console: Console, table: Table) -> None:
    """Print ``table``; on a narrow console drop the borders, then the padding, before rich folds cells."""
    compact = ({"box": box.SIMPLE_HEAD, "show_edge": False, "collapse_padding": True}, {"padding": (0, 0)})
    for style in compact:
        if _natural_width(console, table) <= console.width:
            break
        for name, value in style.items():
            setattr(table, name, value)
    console.print(table)


def seconds(value: float) -> str:
    """Seconds with 3 significant digits, never in exponent form."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    decimals = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def gib(num_bytes: float) -> str:
    """Bytes as GiB with one decimal."""
    return f"{num_bytes / BYTES_PER_GIB:.1f}"


def percent(frac: float, signed: bool = False) -> str:
    """A 0-1 fraction as a percentage with one decimal."""
    return f"{100 * frac:+.1f}" if signed else f"{100 * frac:.1f}"


def count(value: float) -> str:
    """A count with thousands separators; NaN (a model feature paraplan does not price) as 'not priced'."""
    return "not priced" if math.isnan(value) else f"{round(value):,}"


def config_text(config: dict[str, Any]) -> str:
    """``tp=8 pp=2 ...`` for a config dict."""
    return " ".join(f"{k}={'on' if v is True else 'off' if v is False else v}" for k, v in config.items())


# -- plan and evaluate ------------------------------------------------------------------------
class _ModelView(Protocol):
    @property
    def is_moe(self) -> bool:
        """Whether the model has routed experts."""


class _JobView(Protocol):
    @property
    def model(self) -> _ModelView:
        """The model trained."""


class PlanView(Protocol):
    """What the runner-up sentence reads of a plan: a Plan, or the report's view of a plan document."""

    @property
    def estimate(self) -> Mapping[str, Any]:
        """Scalar predictions in SI units."""

    @property
    def config(self) -> ParallelConfig:
        """The parallel configuration."""

    @property
    def job(self) -> _JobView:
        """The job (only whether its model has experts is read)."""


def plan_table(console: Console, plans: list[Plan], capacity_bytes: float, title: str) -> None:
    """The ranked plans, one row each, with how the memory capacity is reached beneath."""
    caption = "\n".join(filter(None, (f"memory GiB: peak / {capacity_legend(plans[0])}", at_capacity_line(plans))))
    table = Table(title=escape(title), title_justify="left", caption=escape(caption), caption_justify="left")
    offloads = any(plan.config.offload for plan in plans)  # the column appears only when it says something
    schedules = any(plan.config.pp_schedule != "1f1b" for plan in plans)
    experts = ("ep", "etp") if plans[0].job.model.is_moe else ()
    axes = ("tp", "pp", "dp", "cp") + experts + ("vpp",) + ("pp_schedule",) * schedules + ("mbs", "zero")
    for header in ("#",) + tuple("schedule" if a == "pp_schedule" else a for a in axes) + ("recompute", "sp") \
            + ("offload",) * offloads:
        table.add_column(header, justify="left" if header == "recompute" else "right")
    for header in ("step s", "tokens/s/GPU", "MFU %", "memory GiB"):
        table.add_column(header, justify="right")
    for plan in plans:
        c, e = plan.config, plan.estimate
        table.add_row(str(plan.rank), *(_axis_cell(c, k) for k in axes),
                      c.recompute, "on" if c.sp else "off", *[str(c.offload)] * offloads, seconds(e["step_time_s"]),
                      count(e["tokens_per_s_per_gpu"]), percent(e["mfu"]),
                      f"{gib(e['peak_memory_bytes'])} / {gib(capacity_bytes)}")
    print_table(console, table)


def capacity_legend(plan: Plan) -> str:
    """How the capacity ``plan`` was checked against is reached: 'capacity 78.8 GiB: the 79.0 GiB the driver
    exposes less paraplan's 0.2% fit margin'."""
    cap = memory_capacity(plan.job, plan.cluster)
    headroom = f" and {percent(cap['headroom_frac'])}% --headroom" if cap["headroom_frac"] else ""
    return (f"capacity {gib(cap['capacity_bytes'])} GiB: the {gib(cap['driver_visible_bytes'])} GiB the driver "
            f"exposes less paraplan's {percent(cap['margin_frac'])}% fit margin{headroom}")


def at_capacity_line(plans: list[Plan]) -> str:
    """For plans whose allocator fills the GPU (it frees its cache and retries to run): a sentence naming them and
    the measured error that makes such a plan uncertain; '' when there is none."""
    full = [p.rank for p in plans
            if p.estimate["peak_memory_bytes"] >= float(usable_capacity_bytes(p.cluster.gpu.hbm_bytes)) * (1 - 1e-9)]
    if not full:
        return ""
    which = "this plan" if len(plans) == 1 else ", ".join(f"#{rank}" for rank in full)
    return (f"{which} at capacity: the allocator frees cached blocks and retries to run; live tensors have measured "
            f"up to {percent(MEASURED_LIVE_UNDER_FRAC)}% above prediction (docs/accuracy.md), which --headroom keeps "
            "free")


def calibration_note(console: Console, provenance: Mapping[str, Any]) -> None:
    """One line where the analytical cost model prices this job's GEMMs or attention on fractions not fitted to its
    GPU (``provenance`` of a plan document); nothing for calibrated GPUs or learned rates."""
    found = provenance.get("efficiency_calibration")
    if not found or found["status"] == "calibrated" or not str(provenance["cost_model"]).startswith("analytical"):
        return
    calibration = Calibration(**{k: v for k, v in found.items() if k != "status"})
    console.print(escape(f"note: {calibration.text()}: step times rest on efficiency.yaml's defaults or assumptions "
                         "where no run on this GPU was fitted (docs/hardware.md)"), soft_wrap=True)


def _axis_cell(config: ParallelConfig, axis: str) -> str:
    """One degree; context parallelism also names how it moves K and V (``4 a2a``)."""
    value = getattr(config, axis)
    return f"{value} {config.cp_comm}" if axis == "cp" and value > 1 else str(value)


def _step_table(estimate: dict[str, Any]) -> Table:
    step = estimate["step_time_s"]
    table = Table(title="step time", title_justify="left")
    table.add_column("term")
    table.add_column("s", justify="right")
    table.add_column("% of step", justify="right")
    for name, value in estimate["step_time_breakdown_s"].items():
        table.add_row(STEP_LABELS.get(name, name), seconds(value), percent(value / step))
    table.add_row("[bold]step[/bold]", f"[bold]{seconds(step)}[/bold]", "100.0")
    return table


def _memory_table(estimate: dict[str, Any], capacity_bytes: float) -> Table:
    table = Table(title=f"memory per GPU ({estimate['peak_memory_stage']} stage)", title_justify="left")
    table.add_column("item")
    table.add_column("GiB", justify="right")
    for name, value in estimate["memory_breakdown_bytes"].items():
        table.add_row(MEMORY_LABELS.get(name, name), gib(value))
    table.add_row("[bold]peak[/bold]", f"[bold]{gib(estimate['peak_memory_bytes'])}[/bold]")
    table.add_row("capacity", gib(capacity_bytes))
    return table


def _breakdowns(console: Console, estimate: dict[str, Any], capacity_bytes: float) -> RenderableType:
    """Step-time and memory tables, side by side when the console is wide enough."""
    step, memory = _step_table(estimate), _memory_table(estimate, capacity_bytes)
    grid = Table.grid(padding=(0, 4))
    grid.add_row(step, memory)
    panel_border = 4
    if _natural_width(console, grid) + panel_border <= console.width:
        return grid
    return Group(step, "", memory)


def _runner_up_line(best: PlanView, second: PlanView, objective: Objective) -> str:
    a, b = best.estimate, second.estimate
    metric = "peak_memory_bytes" if objective == "memory" else "step_time_s"
    shown = gib if metric == "peak_memory_bytes" else seconds
    unit = "GiB peak memory" if metric == "peak_memory_bytes" else "s per step"
    gap = b[metric] / a[metric] - 1.0
    head = f"#2 ({config_text(_axes(second))}): {shown(b[metric])} vs {shown(a[metric])} {unit}"
    if abs(gap) < 1e-3:
        return f"{head}, a tie within 0.1%; the search orders ties by the axes tp, pp, dp, cp, ..."
    terms, other = a["step_time_breakdown_s"], b["step_time_breakdown_s"]
    widest = max(terms, key=lambda k: abs(other[k] - terms[k]))
    return (f"{head} ({percent(gap, signed=True)}%); largest step-time difference: "
            f"{STEP_LABELS.get(widest, widest)} {seconds(other[widest])} s vs {seconds(terms[widest])} s")


def _axes(plan: PlanView) -> dict[str, Any]:
    config = plan.config.as_dict()
    experts = ("ep", "etp") if plan.job.model.is_moe else ()
    comm = ("cp_comm",) if plan.config.cp > 1 else ()
    schedule = ("pp_schedule",) if plan.config.pp_schedule != "1f1b" else ()
    overlap = ("tp_overlap",) if plan.config.tp_overlap else ()
    return {k: config[k] for k in ("tp", "pp", "dp", "cp") + comm + experts + ("vpp",) + schedule
            + ("mbs", "zero", "recompute", "sp") + overlap + ("offload",)}


def why_best(console: Console, plans: list[Plan], capacity_bytes: float, cost_model: str, objective: Objective) -> None:
    """The breakdown of plan #1 and what separates it from #2."""
    best = plans[0]
    lines = [_breakdowns(console, best.estimate, capacity_bytes), f"cost model: {escape(cost_model)}"]
    if len(plans) > 1:
        lines.append(escape(_runner_up_line(best, plans[1], objective)))
    title = f"why #1 wins: {config_text(_axes(best))}"
    console.print(Panel(Group(*lines), title=escape(title), title_align="left", expand=False))


def search_summary(console: Console, rejected: dict[str, int], considered: int, evaluated: int, fit: int) -> None:
    """Rejections per reason and the funnel counts."""
    if rejected:
        table = Table(title="rejected candidates", title_justify="left")
        table.add_column("reason")
        table.add_column("count", justify="right")
        for reason, hits in sorted(rejected.items(), key=lambda item: -item[1]):
            table.add_row(escape(reason), count(hits))
        print_table(console, table)
    console.print(f"{count(considered)} considered, {count(evaluated)} evaluated, {count(fit)} fit")


def _allocator_rows(e: dict) -> list[tuple[str, str]]:
    """Live tensors and what the caching allocator holds (plans written before they were reported lack them)."""
    if "allocated_memory_bytes" not in e:
        return []
    return [("  live tensors (max allocated) GiB", gib(e["allocated_memory_bytes"])),
            ("  allocator holds (max reserved) GiB", gib(e["reserved_memory_bytes"]))]


def cluster_size(cluster: ClusterSpec) -> str:
    """'8 nodes x 4 = 32 x gb200': what --nodes N resolves to, said in GPUs."""
    nodes = f"{cluster.num_nodes} node{'s' if cluster.num_nodes != 1 else ''} x {cluster.gpus_per_node}"
    return f"{nodes} = {cluster.num_gpus} x {cluster.gpu.name}"


def evaluation(console: Console, plan: Plan, capacity_bytes: float, cost_model: str) -> None:
    """Everything the cost model says about one configuration."""
    e = plan.estimate
    summary = Table.grid(padding=(0, 2))
    summary.add_column()
    summary.add_column(justify="right")
    rows = [
        ("step time s", seconds(e["step_time_s"])), ("micro-batches per step", str(e["num_microbatches"])),
        ("tokens/s", count(e["tokens_per_s"])), ("tokens/s per GPU", count(e["tokens_per_s_per_gpu"])),
        ("MFU %", percent(e["mfu"])), ("HFU %", percent(e["hfu"])),
        ("model TFLOP/s per GPU", f"{e['model_tflops_per_gpu']:.1f}"),
        ("peak memory GiB", f"{gib(e['peak_memory_bytes'])} of {gib(capacity_bytes)}"),
        *_allocator_rows(e),
        ("fits", "yes" if plan.fits else "[bold red]no[/bold red]"),
    ]
    host_capacity = plan.cluster.host_memory_per_gpu
    if plan.config.offload:
        rows.insert(-1, ("offloaded to host GiB", f"{gib(e['host_memory_bytes'])} of {gib(host_capacity)}"))
    for label, value in rows:
        summary.add_row(label, value)
    title = f"{plan.job.model.name} on {plan.cluster.name} ({cluster_size(plan.cluster)}): {config_text(_axes(plan))}"
    legend = "\n".join(filter(None, (capacity_legend(plan), at_capacity_line([plan]))))
    body = Group(summary, "", _breakdowns(console, e, capacity_bytes), f"cost model: {escape(cost_model)}",
                 escape(legend))
    console.print(Panel(body, title=escape(title), title_align="left", expand=False))
    if not plan.fits and e["peak_memory_bytes"] > capacity_bytes:
        console.print(f"does not fit: needs {gib(e['peak_memory_bytes'])} GiB per GPU, "
                      f"{gib(capacity_bytes)} GiB available")
    elif not plan.fits:
        console.print(f"does not fit: offloads {gib(e['host_memory_bytes'])} GiB per GPU to the host, "
                      f"{gib(host_capacity)} GiB available")


# -- models -----------------------------------------------------------------------------------
def model_list(console: Console, models: list[ModelSpec]) -> None:
    """One row per preset."""
    table = Table(title="model presets", title_justify="left")
    for header in ("preset", "model_type", "params B", "active B", "layers", "hidden", "heads/kv", "experts"):
        table.add_column(header, justify="left" if header in ("preset", "model_type") else "right", overflow="fold")
    for m in models:
        experts = f"{m.experts_per_token} of {m.num_experts}" if m.is_moe else "—"
        table.add_row(m.name, m.model_type, f"{m.total_params() / PARAMS_PER_BILLION:.2f}",
                      f"{m.active_params() / PARAMS_PER_BILLION:.2f}", str(m.num_layers), str(m.hidden_size),
                      f"{m.num_heads}/{m.num_kv_heads}", experts)
    console.print(table)


def model_types(console: Console, decoders: list[str], wrappers: dict[str, str], refused: dict[str, str]) -> None:
    """The model_types read (decoders, then multimodal wrappers and the decoder each reads) and those refused."""
    console.print(f"[bold]read ({len(decoders)}):[/] " + ", ".join(decoders))
    console.print(f"[bold]multimodal, text_config read ({len(wrappers)}):[/] "
                  + ", ".join(f"{outer} ({inner})" for outer, inner in wrappers.items()))
    console.print("Counted exactly but refused for planning, with the reason: linear-attention layers (Qwen3-Next, "
                  "Qwen3.5, MiniMax-01), the DSA indexer (DeepSeek-V3.2, GLM-5), a gated attention output.")
    table = Table(title=f"known, not read ({len(refused)})", title_justify="left")
    table.add_column("model_type")
    table.add_column("why", overflow="fold")
    for model_type, reason in sorted(refused.items()):
        table.add_row(model_type, escape(reason))
    console.print(table)


def _shape_rows(m: ModelSpec) -> list[tuple[str, object]]:
    rows: list[tuple[str, object]] = [
        ("layers", m.num_layers), ("hidden", m.hidden_size), ("heads / KV heads", f"{m.num_heads} / {m.num_kv_heads}"),
        ("head dim", m.head_dim), ("FFN (dense layers)", m.ffn_size), ("vocab", m.vocab_size),
        ("MLP", "gated (3 matrices)" if m.gated_mlp else "2 matrices"), ("norm", m.norm),
        ("position", m.position), ("tied embeddings", "yes" if m.tied_embeddings else "no"),
    ]
    if m.is_mla:
        mla = (f"q rank {m.q_lora_rank or '—'}, kv rank {m.kv_lora_rank}, qk {m.qk_nope_head_dim} + "
               f"rope {m.qk_rope_head_dim}, v {m.v_head_dim}")
        rows.append(("MLA", mla))
    if m.is_moe:
        rows += [("MoE layers", f"{m.num_moe_layers} of {m.num_layers}"),
                 ("routed experts", f"{m.experts_per_token} of {m.num_experts} per token, FFN {m.expert_ffn_size}"),
                 ("shared expert FFN", m.shared_expert_ffn_size or "—")]
    if m.mtp_layers:
        rows.append(("MTP modules", m.mtp_layers))
    if m.sliding_layers:
        rows.append(("sliding window", f"{m.sliding_window} on {m.sliding_layers} of {m.num_layers} layers"))
    return rows


def _param_rows(m: ModelSpec) -> list[tuple[str, int]]:
    rows = [("embedding", m.embedding_params())]
    if m.num_dense_layers:
        rows += [("per dense layer", m.layer_params()),
                 (f"all {m.num_dense_layers} dense layers", m.num_dense_layers * m.layer_params())]
    if m.is_moe:
        rows += [("per MoE layer", m.moe_layer_params()), ("  of which one routed expert", m.expert_params()),
                 (f"all {m.num_moe_layers} MoE layers", m.num_moe_layers * m.moe_layer_params())]
    rows += [("output (final norm + projection)", m.output_params()), ("total", m.total_params())]
    if m.is_moe:
        rows += [("active per token", m.active_params()),
                 ("active per token, without embedding", m.active_params() - m.embedding_params())]
    if m.mtp_layers:
        rows.append(("MTP modules (not in total)", m.mtp_params()))
    return rows


def model_detail(console: Console, m: ModelSpec, seq_len: int) -> None:
    """Shape, exact parameter counts and model FLOPs per token of one model."""
    shape = Table(title=f"{escape(m.name)} ({m.model_type})", title_justify="left", show_header=False)
    for label, value in _shape_rows(m):
        shape.add_row(label, str(value))
    params = Table(title="parameters", title_justify="left")
    params.add_column("part")
    params.add_column("count", justify="right")
    for label, value in _param_rows(m):
        params.add_row(label, count(value))
    flops = Table(title=f"training FLOPs per token at seq len {seq_len:,} (fwd + bwd, no recompute)",
                  title_justify="left")
    flops.add_column("attention convention")
    flops.add_column("FLOPs", justify="right")
    for convention in ("full", "causal"):
        flops.add_row(convention, count(m.model_flops_per_token(seq_len, convention)))
    for table in (shape, params, flops):
        print_table(console, table)
    if m.unpriced_features:
        console.print(escape(f"not priced, so not planned: {'; '.join(m.unpriced_features)}"), soft_wrap=True)


# -- hardware ---------------------------------------------------------------------------------
def _tflops(gpu: GPUSpec, dtype: str) -> str:
    peak = gpu.peak_flops_per_s.get(dtype)
    return "—" if peak is None else f"{peak / FLOPS_PER_TFLOP:g}"


def _origin_cell(origin: str) -> str:
    return origin if origin == BUILTIN else f"user: {origin}"


def hardware_lists(console: Console, gpus: list[GPUSpec], clusters: list[ClusterSpec],
                   cluster_origins: dict[str, str] | None = None) -> None:
    """The GPU catalog, then the cluster types; user entries say which file they come from."""
    table = Table(title="GPUs: dense tensor-core TFLOP/s per dtype, HBM, links (one direction)",
                  title_justify="left")
    for header in ("name", "bf16", "fp8", "fp4", "HBM GiB", "HBM TB/s", "NVLink GB/s", "NIC GB/s", "from"):
        table.add_column(header, justify="left" if header in ("name", "from") else "right", overflow="fold")
    for g in gpus:
        table.add_row(g.name, _tflops(g, "bf16"), _tflops(g, "fp8"), _tflops(g, "fp4"),
                      f"{g.hbm_bytes / BYTES_PER_GIB:g}", f"{g.hbm_bytes_per_s / BYTES_PER_TB:g}",
                      f"{g.nvlink_bytes_per_s / BYTES_PER_GB:g}", f"{g.nic_bytes_per_s / BYTES_PER_GB:g}",
                      escape(_origin_cell(g.origin)))
    print_table(console, table)
    nodes = Table(title="cluster types (size them with --nodes or --gpus)", title_justify="left")
    for header in ("name", "GPU", "GPUs/node", "NVLink domain", "NIC GB/s per GPU", "latency µs inter/intra", "from"):
        nodes.add_column(header, justify="left" if header in ("name", "GPU", "from") else "right", overflow="fold")
    origins = cluster_origins or {}
    for c in clusters:
        nodes.add_row(c.name, c.gpu.name, str(c.gpus_per_node), str(c.nvlink_domain_gpus),
                      f"{c.nic_bytes_per_s_per_gpu / BYTES_PER_GB:g}",
                      f"{c.inter_node_latency_s / SECONDS_PER_US:g} / {c.intra_domain_latency_s / SECONDS_PER_US:g}",
                      escape(_origin_cell(origins.get(c.name, BUILTIN))))
    print_table(console, nodes)


def hardware_origin(console: Console, gpu: GPUSpec) -> None:
    """For a GPU from a user hardware file: one line saying so and whose efficiency constants it borrows."""
    if gpu.origin != BUILTIN:
        console.print(escape(origin_text(gpu)), soft_wrap=True)


def _sourced_table(title: str) -> Table:
    table = Table(title=escape(title), title_justify="left", show_lines=True)
    table.add_column("quantity")
    table.add_column("value")
    table.add_column("source", ratio=1, overflow="fold")
    return table


def gpu_detail(console: Console, g: GPUSpec) -> None:
    """Every datasheet number of one GPU with its citation, then the calibrated efficiencies."""
    table = _sourced_table(f"{g.name}: {g.display_name} ({g.vendor} {g.architecture})"
                           + ("" if g.origin == BUILTIN else f" — user entry from {g.origin}"))
    peaks = "\n".join(f"{d} {p / FLOPS_PER_TFLOP:g}" for d, p in g.peak_flops_per_s.items())
    table.add_row("dense TFLOP/s", peaks, escape(g.sources.get("dense_tflops", "")))
    table.add_row("HBM", f"{g.hbm_bytes / BYTES_PER_GIB:g} GiB\n{g.hbm_bytes_per_s / BYTES_PER_TB:g} TB/s",
                  escape(g.sources.get("hbm", "")))
    table.add_row("NVLink GB/s (one direction)", f"{g.nvlink_bytes_per_s / BYTES_PER_GB:g}",
                  escape(g.sources.get("nvlink", "")))
    table.add_row("NIC GB/s (one direction)", f"{g.nic_bytes_per_s / BYTES_PER_GB:g}", escape(g.sources.get("nic", "")))
    table.add_row("host link and memory", f"{g.host_link_bytes_per_s / BYTES_PER_GB:g} GB/s (one direction)\n"
                  f"{g.host_memory_bytes / BYTES_PER_GIB:g} GiB per GPU", escape(g.sources.get("host", "")))
    if g.price_usd_per_gpu_hour is not None:
        table.add_row("price USD/GPU-hour", f"{g.price_usd_per_gpu_hour:g}", escape(g.sources.get("price", "")))
    if g.board_power_w is not None:
        table.add_row("board power W", f"{g.board_power_w:g}", escape(g.sources.get("power", "")))
    eff = g.efficiency
    # Each GEMM and attention fraction with its origin: fitted, assumed, default or borrowed:GPU.
    fractions = "\n".join([f"GEMM {d} {f:g}: {eff.origin(f'gemm_peak_frac.{d}')}"
                           for d, f in eff.gemm_peak_frac.items()] + [
        f"GEMM {d} {f:g} ({stack} stack): {eff.origin(f'stack_gemm_peak_frac.{stack}.{d}')}"
        for stack, table in eff.stack_gemm_peak_frac.items() for d, f in table.items()] + [
        f"attention {k} {f:g}: {eff.origin(f'attention_peak_frac.{k}')}"
        for k, f in eff.attention_peak_frac.items()] + [
        f"GEMM half-rate dim {eff.gemm_half_dim:g}",
        f"HBM {eff.hbm_frac:g}", f"NVLink {eff.nvlink_frac:g}", f"NIC {eff.nic_frac:g}",
        f"host link {eff.host_link_frac:g}", f"kernel overhead {eff.kernel_overhead_s / SECONDS_PER_US:g} µs"])
    borrowed = "" if g.origin == BUILTIN else f"{origin_text(g)}. "
    table.add_row("achieved fraction of peak", fractions, escape(borrowed + eff.source))
    console.print(table)


def cluster_detail(console: Console, c: ClusterSpec, origin_file: str = BUILTIN) -> None:
    """The node and fabric numbers of one cluster type, then its GPU."""
    origin = f"clusters.yaml:{c.name}" if origin_file == BUILTIN else f"user entry: {origin_file} clusters.{c.name}"
    table = _sourced_table(f"{c.name}: {c.gpus_per_node} x {c.gpu.name} per node (size it with --nodes or --gpus)"
                           + ("" if origin_file == BUILTIN else f" — user entry from {origin_file}"))
    for label, value in (
        ("GPUs per node", str(c.gpus_per_node)), ("NVLink domain GPUs", str(c.nvlink_domain_gpus)),
        ("NIC GB/s per GPU (one direction)", f"{c.nic_bytes_per_s_per_gpu / BYTES_PER_GB:g}"),
        ("inter-node latency µs", f"{c.inter_node_latency_s / SECONDS_PER_US:g}"),
        ("intra-domain latency µs", f"{c.intra_domain_latency_s / SECONDS_PER_US:g}"),
        ("oversubscription", f"{c.oversubscription:g}"),
        ("host memory GiB per GPU", f"{c.host_memory_per_gpu / BYTES_PER_GIB:g}"),
    ):
        table.add_row(label, value, origin)
    console.print(table)
    gpu_detail(console, c.gpu)


# -- validate ---------------------------------------------------------------------------------
def validation(console: Console, rows: list[dict[str, Any]], summaries: dict[str, dict[str, float]]) -> None:
    """Predicted vs measured throughput per reference run, then error summaries per source."""
    table = Table(title="reference runs: tokens/s per GPU, predicted vs measured", title_justify="left")
    for header in ("id", "model", "GPU", "GPUs", "measured", "predicted", "error %", "chosen by search"):
        numeric = header in ("GPUs", "measured", "predicted", "error %")
        table.add_column(header, justify="right" if numeric else "left", overflow="fold",
                         min_width=12 if header == "chosen by search" else None)
    for r in rows:
        feasible = r["predicted_tokens_per_s_per_gpu"] is not None
        table.add_row(r["id"], r["model"], r["gpu"], str(r["num_gpus"]), count(r["measured_tokens_per_s_per_gpu"]),
                      count(r["predicted_tokens_per_s_per_gpu"]) if feasible else "—",
                      percent(r["error_frac"], signed=True) if feasible else "—", escape(r["chosen"]))
    print_table(console, table)
    summary = Table(title="error summary (|predicted / measured - 1|)", title_justify="left")
    for header in ("source", "rows", "median |error| %", "max |error| %", "infeasible"):
        summary.add_column(header, justify="left" if header == "source" else "right", overflow="fold")
    for source, s in summaries.items():
        summary.add_row(escape(source), str(s["rows"]), percent(s["median_abs_error_frac"]),
                        percent(s["max_abs_error_frac"]), str(s["infeasible"]))
    print_table(console, summary)


def cross_source_validation(console: Console, report: dict[str, Any]) -> None:
    """In-sample beside left-out error for each source and each table of one, then the totals."""
    table = Table(title=f"cross-source validation: {report['rows']} dense rows, efficiency fractions refitted "
                        "without the rows left out", title_justify="left")
    for header in ("left out", "rows", "in-sample median %", "in-sample max %", "left-out median %",
                   "left-out max %", "fractions that moved (shipped->fold)"):
        table.add_column(header, justify="left" if header.startswith(("left out", "fractions")) else "right",
                         overflow="fold")
    for level in ("source", "table"):
        for fold in (f for f in report["folds"] if f["level"] == level):
            moved = ", ".join(f"{m['constant']} {m['shipped']:.2f}->{m['fold']:.2f}" for m in fold["moved"])
            moved = moved.replace(" gemm ", " ").replace(" attention ", " attn ")
            table.add_row(escape(f"{level}: {fold['label']}"), str(fold["rows"]),
                          percent(fold["in_sample"]["median_abs_error_frac"]),
                          percent(fold["in_sample"]["max_abs_error_frac"]),
                          percent(fold["left_out_error"]["median_abs_error_frac"]),
                          percent(fold["left_out_error"]["max_abs_error_frac"]), escape(moved or "-"))
        table.add_section()
    inside, refit = report["in_sample"], report["in_sample_refit"]
    table.add_row("all dense rows, fractions refitted here on every row", str(refit["rows"]),
                  percent(refit["median_abs_error_frac"]), percent(refit["max_abs_error_frac"]), "-", "-",
                  "the shipped hand fit: " + percent(inside["median_abs_error_frac"]) + " / "
                  + percent(inside["max_abs_error_frac"]))
    for level, out in report["left_out"].items():
        table.add_row(f"all dense rows, each left out with its {level}", str(out["rows"]),
                      percent(inside["median_abs_error_frac"]), percent(inside["max_abs_error_frac"]),
                      percent(out["median_abs_error_frac"]), percent(out["max_abs_error_frac"]), "")
    print_table(console, table)


# -- JSON files -------------------------------------------------------------------------------
def prepare_json(json_path: Path | None, force: bool) -> None:
    """Before a command's work: its tables go to stderr when its JSON goes to stdout, and the --json file can be
    written (not there yet, or --force)."""
    route_human_output(json_path)
    if json_path is not None:
        check_writable(json_path, force)


def check_writable(path: Path, force: bool) -> None:
    """InputError unless ``path`` can be (over)written; checked before any long computation. ``-`` is stdout."""
    if is_stdout(path):
        return
    if path.exists() and not force:
        raise InputError(f"{path} already exists; pass --force to overwrite it or choose another --json path")
    if path.is_dir():
        raise InputError(f"{path} is a directory; --json needs a file path")
    if not path.parent.is_dir():
        raise InputError(f"cannot write {path}: folder {path.parent} does not exist")


def write_json(path: Path, document: dict[str, Any], force: bool) -> None:
    """Write ``document`` as stable JSON, atomically (temp file in the same folder, then rename), or to
    standard output for ``-``."""
    check_writable(path, force)
    text = json.dumps(document, indent=2, allow_nan=False) + "\n"
    if is_stdout(path):
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    write_atomic(path, text.encode("utf-8"))


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` atomically: a temporary file beside it, then a rename (nothing half-written)."""
    handle, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        umask = os.umask(0)  # mkstemp makes the file 0600; give it the permissions open() would
        os.umask(umask)
        os.chmod(temp_name, 0o666 & ~umask)
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise


def memory_validation(console: Console, memory: dict) -> None:
    """Measured memory beside predicted, the metric compared, per-source summaries and the fit/OOM table."""
    table = Table(title="memory: predicted vs measured (GiB)", show_lines=False)
    for column in ("id", "metric", "measured", "predicted", "error %"):
        table.add_column(column, justify="left" if column in ("id", "metric") else "right", no_wrap=True)
    for row in memory["runs"]:
        if row["out_of_scope"]:
            continue
        measured = "" if row["measured_bytes"] is None else gib(row["measured_bytes"])
        error = ("right" if row["predicted_fits"] == (row["metric"] == "fits") else "WRONG") \
            if row["error_frac"] is None else f"{100 * row['error_frac']:+.1f}"
        table.add_row(row["id"], row["metric"], measured, gib(row["predicted_bytes"]), error)
    console.print(table)
    for name, summary in memory["summary"].items():
        if "labels_right" in summary:
            console.print(f"{name}: {summary['labels_right']} of {summary['rows']} fit/OOM labels right")
        else:
            console.print(f"{name}: {summary['rows']} rows, median |error| "
                          f"{percent(summary['median_abs_error_frac'])} %, "
                          f"max {percent(summary['max_abs_error_frac'])} %")
    console.print(f"fit/OOM confusion: {memory['fit_oom']}")
    skipped = [row for row in memory["runs"] if row["out_of_scope"]]
    console.print(f"out of scope, not scored ({len(skipped)} rows): "
                  + "; ".join(f"{row['id']}: {row['out_of_scope']}" for row in skipped[:6])
                  + (" ..." if len(skipped) > 6 else ""))


def kernel_table_validation(console: Console, summary: dict[str, dict[str, float]], store: str) -> None:
    """Per source: median and worst |error| analytically and with the store's measured kernel tables."""
    table = Table(title=f"with measured kernel tables ({store}) and without: |error| %", show_lines=False)
    for column in ("source", "rows", "analytical med", "analytical max", "tables med", "tables max"):
        table.add_column(column, justify="left" if column == "source" else "right", no_wrap=column != "source")
    for source, s in summary.items():
        table.add_row(source, f"{s['rows']:.0f}", percent(s["analytical_median"]), percent(s["analytical_max"]),
                      percent(s["tables_median"]), percent(s["tables_max"]))
    console.print(table)
    if not summary:
        console.print(f"no 16-bit GEMM table in {store} for any reference run's GPU: nothing to compare")
