"""The HTML report of a plan file: one self-contained page (no script, font or stylesheet fetched from anywhere).

Title and job, the ranked plans, why #1 wins (the step and memory breakdowns ``paraplan plan`` prints), the run
block when the plan has one, the figures (inline SVG from report_figures and report_scaling) and provenance.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from paraplan.cli import render
from paraplan.cli.report_figures import memory_figure, pipeline_figure, stage_memory_figure, step_figure
from paraplan.cli.report_scaling import placement_figure, run_value, scaling_figure
from paraplan.cost_models.device_memory import usable_capacity_bytes
from paraplan.errors import InputError
from paraplan.exporters.program import OutputFile
from paraplan.exporters.writer import write_files
from paraplan.hardware_profiles import load_gpu
from paraplan.planner.job import ParallelConfig

REPORT_NAME = "report.html"
"""The file ``write_report`` writes into its folder."""
FIGURES = ("pipeline", "memory", "stages", "step", "scaling", "placement")
"""Figure names, for ``--plot``; scaling needs a sweep."""
STYLE = """body{font-family:DejaVu Sans,Helvetica,Arial,sans-serif;margin:24px;max-width:960px;color:#222}
table{border-collapse:collapse;margin:8px 0 16px}td,th{border:1px solid #ccc;padding:3px 8px}
td.num,th.num{text-align:right}figure{margin:16px 0}figcaption{font-size:13px;color:#555}
.breakdowns{display:flex;gap:32px;flex-wrap:wrap}"""


def capacity_of(document: dict[str, Any]) -> float | None:
    """Usable bytes per GPU of the plan's GPU (the capacity plans are checked against); None when the GPU is not in
    the built-in catalog (a user hardware file's GPU)."""
    try:
        return float(usable_capacity_bytes(load_gpu(document["cluster"]["gpu"]).hbm_bytes))
    except InputError:
        return None


def figures(documents: list[dict[str, Any]], sweep: dict[str, Any] | None) -> dict[str, str]:
    """Every figure of the report by name (FIGURES), as inline SVG; scaling only with a sweep."""
    best = documents[0]
    out = {"pipeline": pipeline_figure(best), "memory": memory_figure(documents, capacity_of(best)),
           "stages": stage_memory_figure(best, capacity_of(best)), "step": step_figure(documents)}
    if sweep is not None:
        out["scaling"] = scaling_figure(sweep)
    out["placement"] = placement_figure(best)
    return out


def _cell(value: str, numeric: bool = True) -> str:
    return f'<td class="num">{escape(value)}</td>' if numeric else f"<td>{escape(value)}</td>"


def _table(headers: list[str], rows: list[list[str]], css: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_cell(v, i > 0 or v.replace(".", "").isdigit()) for i, v in enumerate(row))
                   + "</tr>" for row in rows)
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def plans_table(documents: list[dict[str, Any]], capacity_bytes: float | None) -> str:
    """The ranked plans, one row each, the columns of ``paraplan plan``'s table."""
    experts = ["ep", "etp"] if any(d["config"]["ep"] > 1 for d in documents) else []
    schedule = ["pp_schedule"] if any(d["config"]["pp_schedule"] != "1f1b" for d in documents) else []
    axes = ["tp", "pp", "dp", "cp", *experts, "vpp", *schedule, "mbs", "zero", "recompute", "sp"]
    capacity = f" / {render.gib(capacity_bytes)}" if capacity_bytes else ""
    rows = [[str(d["rank"])] + [render.config_text({a: d["config"][a]}).split("=", 1)[1] for a in axes]
            + [render.seconds(d["estimate"]["step_time_s"]), render.count(d["estimate"]["tokens_per_s_per_gpu"]),
               render.percent(d["estimate"]["mfu"]), render.gib(d["estimate"]["peak_memory_bytes"]) + capacity]
            for d in documents]
    return _table(["#"] + axes + ["step s", "tokens/s/GPU", "MFU %", "memory GiB"], rows, "plans")


def _as_plan(document: dict[str, Any]) -> render.PlanView:
    """What render's runner-up sentence reads of a Plan: estimate, config, whether the model has experts."""
    experts = document["model"].get("shape", {}).get("num_experts", 0) > 0
    return SimpleNamespace(estimate=document["estimate"], config=ParallelConfig(**document["config"]),
                           job=SimpleNamespace(model=SimpleNamespace(is_moe=experts)))


def why_section(documents: list[dict[str, Any]], capacity_bytes: float | None) -> str:
    """Plan #1's step-time and memory breakdowns and what separates it from #2 (render's own sentence)."""
    best = documents[0]["estimate"]
    step = best["step_time_s"]
    steps = [[render.STEP_LABELS.get(k, k), render.seconds(v), render.percent(v / step)]
             for k, v in best["step_time_breakdown_s"].items()] + [["step", render.seconds(step), "100.0"]]
    memory = [[render.MEMORY_LABELS.get(k, k), render.gib(v)] for k, v in best["memory_breakdown_bytes"].items()]
    memory += [["peak", render.gib(best["peak_memory_bytes"])]]
    memory += [["capacity", render.gib(capacity_bytes)]] if capacity_bytes else []
    parts = [f"<h2>Why #1 wins: {escape(render.config_text(render._axes(_as_plan(documents[0]))))}</h2>",
             '<div class="breakdowns">', _table(["term", "s", "% of step"], steps, "step-breakdown"),
             _table([f"item ({best.get('peak_memory_stage', '')} stage)", "GiB"], memory, "memory-breakdown"),
             "</div>"]
    if len(documents) > 1:
        line = render._runner_up_line(_as_plan(documents[0]), _as_plan(documents[1]), "throughput")
        parts.append(f'<p class="runner-up">{escape(line)}</p>')
    return "\n".join(parts)


def run_section(document: dict[str, Any]) -> str:
    """Days, GPU-hours, dollars and goodput of the plan's run block; empty without one."""
    if not document.get("run"):
        return ""
    shown = {"days": "{:,.1f}", "gpu_hours": "{:,.0f}", "cost_usd": "${:,.0f}", "goodput_frac": "{:.3f}"}
    rows = [[name.replace("_", " "), fmt.format(value) if (value := run_value(document, name)) is not None else "—"]
            for name, fmt in shown.items()]
    return '<section id="run"><h2>The whole run</h2>' + _table(["quantity", "value"], rows, "run") + "</section>"


def provenance_section(document: dict[str, Any]) -> str:
    """Which cost model, calibration and hardware produced the numbers."""
    prov = document["provenance"]
    hardware = prov.get("hardware", {})
    rows = [["paraplan version", str(prov.get("paraplan_version", ""))],
            ["cost model", str(prov.get("cost_model", ""))],
            ["calibration", str(prov.get("calibration", ""))],
            ["hardware", (f"{hardware.get('gpu', '')} ({hardware.get('origin', '')}; efficiency from "
                         f"{hardware.get('efficiency_from', '')})")]]
    return '<section id="provenance"><h2>Provenance</h2>' + _table(["", ""], rows, "provenance") + "</section>"


def report_html(documents: list[dict[str, Any]], sweep: dict[str, Any] | None = None) -> str:
    """The whole report page of ``documents`` (plans best first) and an optional sweep document."""
    best = documents[0]
    capacity = capacity_of(best)
    job, cluster = best["job"], best["cluster"]
    title = f"paraplan report: {best['model']['name']} on {cluster['num_gpus']} x {cluster['gpu']}"
    figure_html = "".join(f'<figure data-name="{name}">{svg}<figcaption>{escape(name)}</figcaption></figure>'
                          for name, svg in figures(documents, sweep).items())
    return "\n".join([
        (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{STYLE}</style></head><body>"), f"<h1>{escape(title)}</h1>",
        (f'<p class="job">sequence {job["seq_len"]:,} tokens, global batch {job["global_batch"]:,}, '
        f'{escape(job["precision"])}, {escape(job["engine"])}, cluster {escape(cluster["name"])}</p>'),
        '<section id="plans"><h2>Ranked plans</h2>', plans_table(documents, capacity), "</section>",
        f'<section id="why">{why_section(documents, capacity)}</section>', run_section(best),
        f'<section id="figures"><h2>Figures</h2>{figure_html}</section>', provenance_section(best),
        "</body></html>\n"])


def write_text_file(path: Path, content: str | bytes, force: bool) -> None:
    """Write ``path`` atomically (a temporary file beside it, then a rename); never over a file without force."""
    if path.is_dir():
        raise InputError(f"{path} is a folder; give a file path")
    if path.exists() and not force:
        raise InputError(f"{path} already exists; pass --force to overwrite it or choose another path")
    if not path.parent.is_dir():
        raise InputError(f"cannot write {path}: folder {path.parent} does not exist")
    render.write_atomic(path, content.encode("utf-8") if isinstance(content, str) else content)


def write_report(plan_documents: list[dict], out_dir: Path, force: bool, sweep: dict | None = None) -> Path:
    """Write ``out_dir/report.html`` (the folder is created if missing, nothing else in it is touched)."""
    ranked = sorted(plan_documents, key=lambda d: d["rank"])
    return write_files(out_dir, [OutputFile(name=REPORT_NAME, text=report_html(ranked, sweep))], force)[0]
