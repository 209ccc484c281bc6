"""What the whole run looks like on screen: the run breakdown under a plan, and the sweep table.
Units appear only here (days, GPU-hours, MWh, GB); the numbers arrive in SI from planner/run/cost.py."""

from __future__ import annotations

import math

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from paraplan.cli.render import count, percent, print_table, seconds
from paraplan.hardware_profiles.units import BYTES_PER_GB, JOULES_PER_MWH, SECONDS_PER_DAY, SECONDS_PER_HOUR
from paraplan.planner.run.cost import RunCost
from paraplan.planner.run.sweep import SweepPoint


def days(value_s: float) -> str:
    """Seconds as days with 3 significant digits; 'never' for a run that does not finish."""
    return seconds(value_s / SECONDS_PER_DAY) if math.isfinite(value_s) else "never"


def dollars(value: float | None) -> str:
    """US dollars with thousands separators; '—' when unpriced, 'unbounded' when infinite."""
    if value is None:
        return "—"
    return f"${value:,.0f}" if math.isfinite(value) else "unbounded"


def _interval(run: RunCost) -> str:
    if not math.isfinite(run.interval_s):
        return "none needed (no failures)"
    return f"every {seconds(run.interval_s / 60)} min of training (Young {seconds(run.young_interval_s / 60)}, " \
           f"Daly {seconds(run.daly_interval_s / 60)})"


def run_rows(run: RunCost) -> list[tuple[str, str]]:
    """(label, value) lines of the run breakdown."""
    ckpt = run.checkpoint
    energy = "—" if run.energy_j is None else (
        f"{run.energy_j / JOULES_PER_MWH:,.1f} MWh" if math.isfinite(run.energy_j) else "unbounded")
    return [
        ("steps / tokens", f"{count(run.num_steps)} / {run.num_tokens:.4g}"),
        ("days: training alone / with failures", f"{days(run.useful_s)} / {days(run.wall_s)}"),
        ("GPU-hours (wall)",
         count(run.wall_gpu_s / SECONDS_PER_HOUR) if math.isfinite(run.wall_gpu_s) else "unbounded"),
        ("cost", dollars(run.usd)),
        ("GPU energy", energy),
        ("goodput", f"{percent(run.goodput_frac)}% of wall time is training"),
        ("checkpoint", (f"{ckpt.mode}, {run.checkpoint_bytes_per_gpu / BYTES_PER_GB:.2f} GB per GPU: write "
                        f"{seconds(ckpt.write_s)} s, stall {seconds(ckpt.stall_s)} s, load {seconds(ckpt.load_s)} s")),
        ("checkpoint interval", _interval(run)),
        ("failures", (f"{run.expected_failures:,.0f} expected, one per {seconds(run.job_mtbf_s / 60)} min; each "
                      f"costs {seconds(run.lost_per_failure_s)} s")
         if math.isfinite(run.job_mtbf_s) else "none modelled"),
    ]


def run_breakdown(console: Console, run: RunCost) -> None:
    """The whole run of the best plan, with where the price and the power come from."""
    table = Table(title="whole run of #1", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("value")
    for label, value in run_rows(run):
        table.add_row(label, escape(value))
    print_table(console, table)
    console.print(escape(f"price: {run.usd_reason}"), soft_wrap=True)
    console.print(escape(f"energy: {run.energy_reason}"), soft_wrap=True)


def sweep_table(console: Console, points: list[SweepPoint], scaling: list[tuple[float, float] | None],
                best: dict[int, SweepPoint], title: str) -> None:
    """One row per point: layout, speed, the whole run, and what the step from the previous GPU count bought."""
    table = Table(title=escape(title), title_justify="left")
    for header in ("GPUs", "GPU", "batch", "layout", "step s", "tokens/s", "MFU %", "days", "cost", "goodput %",
                   "speedup", "efficiency %", "best"):
        table.add_column(header, justify="left" if header in ("GPU", "layout") else "right")
    for point, scaled in zip(points, scaling):
        c, e, run = point.plan.config, point.plan.estimate, point.run
        layout = f"tp{c.tp} pp{c.pp} dp{c.dp}" + (f" cp{c.cp}" if c.cp > 1 else "") + (f" ep{c.ep}" if c.ep > 1 else "")
        mark = "*" if best.get(point.num_gpus) is point else ""
        table.add_row(count(point.num_gpus), point.gpu, count(point.global_batch),
                      layout + (f" (#{point.plan.rank})" if point.plan.rank > 1 else ""),
                      seconds(e["step_time_s"]), count(e["tokens_per_s"]), percent(e["mfu"]), days(run.wall_s),
                      dollars(run.usd), percent(run.goodput_frac),
                      "—" if scaled is None else f"{scaled[0]:.2f}x", "—" if scaled is None else percent(scaled[1]),
                      mark)
    print_table(console, table)
