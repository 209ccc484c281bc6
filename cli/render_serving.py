"""Rich rendering of ``paraplan validate --serving``: the per engine × GPU × mode accuracy table."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def serving_validation(console: Console, document: dict) -> None:
    """Rows, coverage and median / p90 |error| of TPOT and TTFT per group, then held-out figures and reasons."""
    table = Table(title="serving: predicted vs measured TPOT and TTFT (|error| %)")
    for column in ("engine", "GPU", "mode", "rows", "covered %", "TPOT med", "TPOT p90", "TTFT med", "TTFT p90"):
        table.add_column(column, justify="left" if column in ("engine", "GPU", "mode") else "right", no_wrap=True)
    for g in document["groups"]:
        table.add_row(g["backend"], g["system"], g["mode"], str(g["rows"]), _pct(g["covered_frac"]),
                      _pct(g["tpot_median_err"]), _pct(g["tpot_p90_err"]), _pct(g["ttft_median_err"]),
                      _pct(g["ttft_p90_err"]))
    console.print(table)
    for label, scores in document["held_out"].items():
        console.print(f"held out, {label}: TPOT median {_pct(scores['tpot_median_err'])} %, "
                      f"TTFT median {_pct(scores['ttft_median_err'])} %")
    c = document["constants"]
    console.print(f"fitted on {c['fitted_rows']} rows: step overhead ms "
                  + ", ".join(f"{k} {1e3 * v:.1f}" for k, v in c["step_overhead_s"].items())
                  + "; request overhead ms " + ", ".join(f"{k} {1e3 * v:.0f}" for k, v in c["request_overhead_s"].items())
                  + f"; benchmark waves {c['benchmark_waves']}")
    for reason, count in document["uncovered"].items():
        console.print(f"not covered ({count} rows): {reason}")
