"""Rich rendering of ``paraplan validate --serving``: the per engine × GPU × mode accuracy table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from paraplan.errors import InputError

if TYPE_CHECKING:
    from paraplan.planner.serving.problem import ServingProblem


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _slices_table(slices: list[dict]) -> Table:
    """Median |error| per engine, mode and dense/MoE, in sample and with each model left out."""
    table = Table(title="by slice: median |error| %, in sample and with each model left out")
    for column in ("slice", "rows", "TPOT", "TPOT model out", "TTFT", "TTFT model out"):
        table.add_column(column, justify="left" if column == "slice" else "right", no_wrap=True)
    for s in slices:
        table.add_row(s["slice"], str(s["rows"]), _pct(s["tpot_median_err"]), _pct(s["tpot_median_err_model_out"]),
                      _pct(s["ttft_median_err"]), _pct(s["ttft_median_err_model_out"]))
    return table


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
    if document.get("slices"):
        console.print(_slices_table(document["slices"]))
    for label, scores in document["held_out"].items():
        console.print(f"held out, {label}: TPOT median {_pct(scores['tpot_median_err'])} %, "
                      f"TTFT median {_pct(scores['ttft_median_err'])} %")
    c = document["constants"]
    console.print(f"fitted on {c['fitted_rows']} rows: step overhead ms "
                  + ", ".join(f"{k} {1e3 * v:.2f}" for k, v in c["step_overhead_s"].items())
                  + "; request overhead ms "
                  + ", ".join(f"{k} {1e3 * v:.0f}" for k, v in c["request_overhead_s"].items())
                  + "; first-token steps "
                  + ", ".join(f"{k} {v:g}" for k, v in c.get("first_token_steps", {}).items())
                  + f"; attention-DP sync ms a step {1e3 * c.get('dp_sync_s', 0.0):.2f}"
                  + f"; benchmark waves {c['benchmark_waves']}")
    for reason, count in document["uncovered"].items():
        console.print(f"not covered ({count} rows): {reason}")


# -- paraplan serve ----------------------------------------------------------------------------------------------

def _ms(seconds: float) -> str:
    return "inf" if seconds == float("inf") else f"{1e3 * seconds:,.1f}"


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:,.1f}"


def _pool_text(pool: dict, mixed: bool) -> str:
    axes = [f"tp{pool['tp']}"] + [f"dp{pool['dp_attention']}"] * (pool["dp_attention"] > 1) \
        + [f"pp{pool['pp']}"] * (pool["pp"] > 1) + [f"ep{pool['moe_ep']}"] * (pool["moe_ep"] > 1)
    role = "" if pool["role"] == "aggregated" else f"{pool['role']} "
    limits = f"batch {pool['max_batch']}, chunk {pool['max_batched_tokens']}"  # worker totals
    gpu = f"{pool['gpu']} " if mixed else ""
    share = f", {100 * pool['traffic_frac']:.0f}% of requests" if pool["traffic_frac"] < 1 else ""
    return f"{role}{pool['workers']}x {gpu}{' '.join(axes)} ({limits}{share})"


def serving_plans(console: Console, doc: dict, problem: ServingProblem) -> None:
    """The ranked deployments, why the best wins, and the throughput/interactivity front."""
    w = doc["workload"]
    q = f"p{w['percentile']}"
    load = f"concurrency {w['concurrency']}" if w["concurrency"] else f"{w['rate_per_s']:g} req/s ({w['arrival']})"
    gpus = " + ".join(f"{h['num_gpus']} {h['gpu']}" for h in doc["hardware"])
    table = Table(title=f"{doc['model']['name']} on {gpus}: "
                        f"isl {w['isl']}, osl {w['osl']}, {load}; best {len(doc['plans'])} by "
                        f"{doc['search']['objective']}")
    for column in ("#", "engine", "mode", "deployment", "GPUs", "KV", f"TTFT {q}", f"TPOT {q}", "tok/s/GPU",
                   "tok/s/user", "$/Mtok"):
        table.add_column(column, justify="left" if column in ("engine", "mode", "deployment", "KV") else "right",
                         no_wrap=column != "deployment", min_width=24 if column == "deployment" else None)
    for plan in doc["plans"]:
        e = plan["estimate"]
        price = e["usd_per_million_output_tokens"]
        deployment = " + ".join(_pool_text(p, len(doc["hardware"]) > 1) for p in plan["pools"])
        table.add_row(str(plan["rank"]), plan["engine"], plan["mode"], deployment,
                      str(plan["num_gpus"]), plan["quantization"]["kv_cache_dtype"], _ms(e["ttft_s"][q]) + " ms",
                      _ms(e["tpot_s"][q]) + " ms", f"{e['tokens_per_s_per_gpu']:,.0f}",
                      f"{e['tokens_per_s_per_user']:,.1f}", "-" if price is None else f"{price:,.3f}")
    console.print(table)
    _why(console, doc, q)
    console.print(f"searched {doc['search']['considered']:,} deployments, {doc['search']['feasible']:,} meet the "
                  f"targets; Pareto front: {len(doc['pareto'])} points (tokens/s/GPU vs tokens/s/user, in --json)")
    console.print(f"cost model: {doc['provenance']['cost_model']}")
    for line in _tables_lines(doc):
        console.print(line)
    console.print(f"queueing: {doc['provenance']['queueing']}")


def _tables_lines(doc: dict) -> list[str]:
    """``--cost-model measured``: which tables priced each shown plan's pools (engine, version, terms) and what share
    of their steps, or that a pool was priced analytically; nothing for an analytical document."""
    if "kernel_tables" not in doc["provenance"]:
        return []
    lines = [f"kernel tables from {doc['provenance']['kernel_tables']['store']} (other terms and shapes analytical):"]
    for plan in doc["plans"]:
        for pool in plan["kernel_tables"]:
            where = f"#{plan['rank']} {pool['role']}: {pool['engine']} on {pool['gpu']}, KV {pool['kv_cache_dtype']}"
            if not pool["versions"]:
                lines.append(f"  {where}: none stored, analytical")
                continue
            shares = [f"{100 * pool[key]:.0f}% of the {what}" for key, what in
                      (("decode_step_table_frac", "decode step"), ("prefill_table_frac", "prefill"))
                      if pool[key] is not None]
            lines.append(f"  {where}: {pool['engine']} {', '.join(pool['versions'])} tables priced "
                         f"{' and '.join(shares)} ({', '.join(pool['terms'])})")
    return lines

def _why(console: Console, doc: dict, q: str) -> None:
    best = doc["plans"][0]
    e = best["estimate"]
    quant = best["quantization"]
    experts = f", experts {quant['experts']}" if quant["experts"] != quant["weights"] else ""
    lines = [(f"best: {best['engine']} {best['mode']}, weights {quant['weights']}{experts}, "
             f"KV cache {quant['kv_cache_dtype']}; running batch {e['running_batch']:.1f} per rank, "
             f"{e['requests_per_s']:.2f} req/s, {e['tokens_per_s']:,.0f} output tok/s"),
             "TTFT ms  mean {mean} · p50 {p50} · p90 {p90} · p99 {p99}".format(
                 **{k: _ms(v) for k, v in e["ttft_s"].items()}),
             "TPOT ms  mean {mean} · p50 {p50} · p90 {p90} · p99 {p99}".format(
                 **{k: _ms(v) for k, v in e["tpot_s"].items()}),
             f"one prompt's prefill {_ms(e['prefill_s'])} ms"
             + (f", KV transfer {_ms(e['kv_transfer_s'])} ms" if best["mode"] == "disagg" else "")
             + (f"; engine host time a decode step {e['step_overhead_s'] * 1e3:.2f} ms" if "step_overhead_s" in e
                else "")
             + (f" (attention-DP sync {e['dp_sync_s'] * 1e3:.2f} ms of it)" if e.get("dp_sync_s") else "")
             + (f"; of the TTFT, engine request overhead {_ms(e['request_overhead_s'])} ms and first-token steps "
                f"{_ms(e['first_token_steps_s'])} ms" if "first_token_steps_s" in e else "")]
    for pool, mem in zip(best["pools"], e["memory"]):
        lines.append(f"{pool['role']} GPU ({pool['gpu']}, memory knob {pool['memory_frac']:.2f}): weights "
                     f"{_gib(mem['weights_bytes'])} GiB, activations {_gib(mem['activation_bytes'])}, fixed "
                     f"{_gib(mem['fixed_bytes'])}, KV pool {_gib(mem['kv_pool_bytes'])} of "
                     f"{_gib(mem['capacity_bytes'])} GiB: {mem['kv_capacity_tokens']:,.0f} tokens, "
                     f"{mem['max_sequences']:,.0f} sequences per rank")
    console.print("\n".join(lines))


def check_export(fmt: str | None, out: Path | None, force: bool) -> None:
    """Before the search: --export and -o come together and the format is one the serving exporter writes."""
    from paraplan.cli.export_cmd import export_requested

    if not export_requested(fmt, out):
        return
    assert fmt is not None and out is not None  # export_requested is True only when both are given
    from paraplan.exporters.serving import SERVING_FORMATS

    if fmt not in SERVING_FORMATS:
        raise InputError(f"--export {fmt[:40]!r}: choose {', '.join(SERVING_FORMATS)}")
    if out.exists() and not out.is_dir():
        raise InputError(f"-o {out} is not a folder")


def export(document: dict, fmt: str, out: Path, force: bool) -> None:
    """Write the best plan's launch files."""
    from paraplan.exporters.serving import export_serving

    for path in export_serving(document, 0, fmt, out, force):
        typer.echo(f"wrote {path}")
