"""``paraplan calibrate`` and the ``--stack-profile`` option of plan/evaluate: parse, call the library, render."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import numpy as np
import typer
from rich.markup import escape
from rich.table import Table

from paraplan.cli import render
from paraplan.errors import InputError

if TYPE_CHECKING:
    from rich.console import Console

    from paraplan.validation import stack_profile as sp
StackProfileOpt = Annotated[str | None, typer.Option(
    "--stack-profile", help="A stack profile from 'paraplan calibrate' (its name, or a .json file): every step "
                            "time scaled by the factor your own measured runs gave. Analytical cost model only.")]


def calibrate(
    runs: Annotated[list[Path], typer.Argument(
        help="Measured runs: CSV files in the columns of data/reference_runs.csv (at least id, model, gpu, num_gpus, "
             "seq_len, global_batch, precision, engine, tp, pp and measured_tokens_per_s_per_gpu or "
             "measured_step_time_s; empty knobs are chosen by the search), or Megatron-LM logs with their "
             "arguments block (one run per log; pass --hardware).")],
    name: Annotated[str, typer.Option("--name", help="The profile's name (plan/evaluate --stack-profile NAME).")],
    hardware: Annotated[str | None, typer.Option(help="The GPU the Megatron logs ran on (catalog name).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a saved profile of the same name.")] = False,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the profile's report here.")] = None,
) -> None:
    """Fit a stack profile to your own measured runs: one step-time factor for your software stack."""
    from paraplan.validation import stack_profile as sp
    sp.check_name(name)
    target = sp.profile_path(name)
    if target.parent.is_dir():
        render.check_writable(target, force)
    if json_path is not None:
        render.check_writable(json_path, force)
    tables = [path for path in runs if path.suffix.lower() == ".csv"]
    logs = [path for path in runs if path.suffix.lower() != ".csv"]
    frames = [sp.read_runs(path) for path in tables]
    with render.working(render.make_console(stderr=True), f"predicting the runs of {len(runs)} file(s)"):
        predictions = [p for frame in frames for p in sp.predict_runs(frame)]
        predictions += sp.predict_megatron_logs(logs, hardware)
    duplicated = sorted(run_id for run_id, n in Counter(p.run_id for p in predictions).items() if n > 1)
    if duplicated:
        raise InputError(f"run id {duplicated[0]!r} appears in more than one file; give each run its own id")
    profile = sp.fit_profile(name, predictions)
    document = sp.profile_document(profile)
    target.parent.mkdir(parents=True, exist_ok=True)
    render.write_json(target, document, force)
    _show(render.make_console(), profile, target)
    if json_path is not None:
        render.write_json(json_path, document, force)


def _show(console: Console, profile: sp.StackProfile, target: Path) -> None:
    held = profile.held_out_errors
    table = Table(title=f"stack profile {profile.name}: tokens/s per GPU, measured vs paraplan", title_justify="left")
    for header in ("run", "model", "GPU", "GPUs", "measured", "analytical", "error %", "calibrated error %",
                   "held out error %"):
        table.add_column(header, justify="left" if header in ("run", "model", "GPU") else "right", overflow="fold")
    for i, p in enumerate(profile.runs):
        table.add_row(escape(p.run_id), escape(p.model), p.gpu, str(p.num_gpus),
                      render.count(p.measured_tokens_per_s_per_gpu), render.count(p.predicted_tokens_per_s_per_gpu),
                      render.percent(profile.analytical_errors[i], signed=True),
                      render.percent(profile.calibrated_errors[i], signed=True),
                      render.percent(held[i], signed=True) if held is not None else "-")
    render.print_table(console, table)
    analytical = float(np.median(np.abs(profile.analytical_errors)))
    line = (f"step time x {profile.step_time_factor:.3f}: median |error| {100 * analytical:.1f}% analytical, "
            f"{100 * float(np.median(np.abs(profile.calibrated_errors))):.1f}% calibrated in sample")
    if held is not None:
        line += f", {100 * float(np.median(np.abs(held))):.1f}% with each run held out"
    console.print(line)
    console.print(f"saved {escape(str(target))}; use it with: paraplan plan ... --stack-profile {profile.name} "
                  "--cost-model analytical")
