"""``paraplan report``: read a plan file (and a sweep), write the HTML report and any one figure as SVG or PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, cast

import typer

from paraplan.cli.report import FIGURES, REPORT_NAME, figures, report_html, write_report, write_text_file
from paraplan.cli.report_svg import standalone
from paraplan.errors import InputError
from paraplan.exporters.plan_input import MAX_PLAN_BYTES, select_plan
from paraplan.files import parse_user_json, read_user_text, shown
from paraplan.limits import MAX_GPUS

MAX_SWEEP_POINTS = 4_096
"""Points of a sweep file: a GPU-count list times GPU types times batch sizes; 4,096 is far beyond a readable
curve (and each point holds a whole plan: 4,096 x a few KB stays under MAX_PLAN_BYTES)."""
PLOT_SUFFIXES = (".svg", ".png")

_REPORT = "Report"
SweepOpt = Annotated[Path | None, typer.Option("--sweep", help="A sweep file from 'paraplan sweep --json': adds the "
                                               "scaling curve.", rich_help_panel=_REPORT)]
OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="The HTML file to write.", rich_help_panel=_REPORT)]
PlotOpt = Annotated[str | None, typer.Option("--plot", help=f"One figure to write alone: {', '.join(FIGURES)}.",
                                             rich_help_panel=_REPORT)]
PlotOutOpt = Annotated[Path | None, typer.Option(
    "--plot-out", help="The figure's file: .svg, or .png (needs matplotlib, the plot extra).", rich_help_panel=_REPORT)]


def check_report_folder(out_dir: Path, force: bool) -> None:
    """``plan --report DIR``: before the search, DIR can take report.html (not there yet, or --force)."""
    from paraplan.exporters.writer import check_destination

    try:
        check_destination(out_dir, [REPORT_NAME], force)
    except InputError as exc:
        raise InputError(str(exc).replace("-o folder", "--report folder").replace("-o ", "--report ")) from None


__all__ = ["check_report_folder", "read_plans", "read_sweep", "report", "write_report"]


def read_plans(path: Path) -> list[dict[str, Any]]:
    """Every plan of a plan file, schema-checked, best first."""
    if not path.is_file():
        raise InputError(f"plan file {path} does not exist (write one with 'paraplan plan ... --json {path}')")
    document = parse_user_json(read_user_text(path, MAX_PLAN_BYTES, "plan file"), str(path), top=None)
    select_plan(document, None, str(path))  # checks the wrapper and every plan against the plan schema
    assert isinstance(document, dict)  # select_plan refused anything but the {"schema_version", "plans"} object
    return sorted(document["plans"], key=lambda plan: plan["rank"])


def read_sweep(path: Path) -> dict[str, Any]:
    """A sweep document with the fields the scaling figure reads checked: num_gpus, gpu, plan.estimate."""
    if not path.is_file():
        raise InputError(f"sweep file {path} does not exist (write one with 'paraplan sweep ... --json {path}')")
    document = cast(dict[str, Any], parse_user_json(read_user_text(path, MAX_PLAN_BYTES, "sweep file"),
                                                    str(path)))  # top=dict: an object
    points = document.get("points")
    if document.get("kind") != "sweep" or not isinstance(points, list) or not 0 < len(points) <= MAX_SWEEP_POINTS:
        raise InputError(f"{path}: expected {{\"kind\": \"sweep\", \"points\": [...]}} with 1 to {MAX_SWEEP_POINTS:,} "
                         "points, as 'paraplan sweep --json' writes")
    for index, point in enumerate(points):
        problem = _point_problem(point)
        if problem:
            raise InputError(f"{path}: points[{index}] {problem}")
    return document


def _point_problem(point: Any) -> str | None:
    """What is wrong with one sweep point (None: nothing)."""
    if not isinstance(point, dict):
        return f"is {shown(point, 30)}, not an object"
    gpus, plan = point.get("num_gpus"), point.get("plan")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 < gpus <= MAX_GPUS:
        return f"num_gpus {shown(gpus, 30)} is not a GPU count from 1 to {MAX_GPUS:,}"
    if not isinstance(point.get("gpu", ""), str) or not isinstance(plan, dict):
        return "needs a gpu name and a plan object"
    rate = (plan.get("estimate") or {}).get("tokens_per_s") if isinstance(plan.get("estimate"), dict) else None
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate >= 0:
        return f"plan.estimate.tokens_per_s {shown(rate, 30)} is not a non-negative number"
    if plan.get("run") is not None and not isinstance(plan["run"], dict):
        return "plan.run must be an object"
    return None


def _check_request(out: Path | None, plot: str | None, plot_out: Path | None, sweep: Path | None) -> None:
    if out is None and plot is None:
        raise InputError("say what to write: -o report.html, or --plot FIGURE --plot-out FILE.svg|.png")
    if (plot is None) != (plot_out is None):
        raise InputError("--plot FIGURE and --plot-out FILE go together")
    if plot is not None and plot not in FIGURES:
        raise InputError(f"--plot {shown(plot, 30)} is not a figure; choose one of {', '.join(FIGURES)}")
    if plot == "scaling" and sweep is None:
        raise InputError("--plot scaling needs --sweep SWEEP.json (from 'paraplan sweep --json')")
    if plot_out is not None and plot_out.suffix.lower() not in PLOT_SUFFIXES:
        raise InputError(f"--plot-out {plot_out.name} must end in .svg or .png")
    if out is not None and plot_out is not None and out.resolve() == plot_out.resolve():
        raise InputError("-o and --plot-out name the same file; give two paths")


def report(
    plan_file: Annotated[Path, typer.Argument(help="A plan file from 'paraplan plan --json'.")],
    out: OutOpt = None, sweep: SweepOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite the files named by -o and --plot-out.")] = False,
    plot: PlotOpt = None, plot_out: PlotOutOpt = None,
) -> None:
    """Write one self-contained HTML report of a plan file (ranked plans, why #1 wins, figures), or one figure."""
    _check_request(out, plot, plot_out, sweep)
    for path in (out, plot_out):
        if path is not None and path.exists() and not force:
            raise InputError(f"{path} already exists; pass --force to overwrite it or choose another path")
    plans = read_plans(plan_file)
    sweep_document = read_sweep(sweep) if sweep is not None else None
    if out is not None:
        write_text_file(out, report_html(plans, sweep_document), force)
        typer.echo(f"wrote {out}")
    if plot is not None and plot_out is not None:
        figure = figures(plans, sweep_document)[plot]
        if plot_out.suffix.lower() == ".png":
            from paraplan.cli.report_png import png_bytes  # matplotlib, only on this path

            write_text_file(plot_out, png_bytes(figure), force)
        else:
            write_text_file(plot_out, standalone(figure), force)
        typer.echo(f"wrote {plot_out}")
