"""The report's sweep and placement figures as SVG strings: the scaling curve, the rank-to-node map, expert load.

The scaling curve reads a sweep document (``paraplan sweep --json``: ``{"kind": "sweep", "points": [{"num_gpus",
"gpu", "global_batch", "plan": {...}}]}``), each point's plan and its optional ``run`` block (wall_s,
wall_gpu_s, usd, goodput_frac). Placement reads the plan's ``placement`` block (``paraplan place``,
``paraplan experts --plan-out``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

from paraplan.cli.report_svg import (
    PALETTE,
    WIDTH_PX,
    Frame,
    legend,
    line,
    nice_ticks,
    note,
    rect,
    svg,
    text,
    tick_text,
    y_axis,
)
from paraplan.hardware_profiles.units import SECONDS_PER_DAY, SECONDS_PER_HOUR
from paraplan.planner.layout import rank_map

RUN_KEYS = {"days": ("wall_s", 1.0 / SECONDS_PER_DAY), "gpu_hours": ("wall_gpu_s", 1.0 / SECONDS_PER_HOUR),
            "cost_usd": ("usd", 1.0), "goodput_frac": ("goodput_frac", 1.0)}
"""Where a plan's run block (planner.run.cost) keeps each number shown: (key, factor to the shown unit)."""


def run_value(document: dict[str, Any], name: str) -> float | None:
    """``name`` (a RUN_KEYS entry) of a plan's run block in its shown unit; None without a run block or the number."""
    run = document.get("run") or {}
    key, factor = RUN_KEYS[name]
    value = run.get(key)
    return float(value) * factor if isinstance(value, (int, float)) and not isinstance(value, bool) else None


PANELS = (("tokens/s", "throughput (tokens/s)", lambda p: p["plan"]["estimate"]["tokens_per_s"]),
          ("days", "time to train (days)", lambda p: run_value(p["plan"], "days")),
          ("USD", "cost (USD)", lambda p: run_value(p["plan"], "cost_usd")),
          ("goodput", "goodput (fraction)", lambda p: run_value(p["plan"], "goodput_frac")))
"""Small multiples of the scaling figure: short unit, panel title, the value of one sweep point (None = absent)."""
PLACED_KEYS = ("host_order", "rank_placement", "stage_partition", "mixed_gpus", "expert_placement")
"""Placement entries only a placement step writes (a plain plan holds the default rank order alone)."""
MAX_NODES_DRAWN = 32  # rows of the rank map: 256 GPUs of 8-GPU nodes; larger maps say how many are left out
CELL_PX = 22.0


def _series(points: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Sweep points by GPU type, in GPU-count order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for point in sorted(points, key=lambda p: p["num_gpus"]):
        out.setdefault(str(point.get("gpu", "")), []).append(point)
    return out


def scaling_figure(sweep: dict[str, Any]) -> str:
    """Throughput, days, cost and goodput against GPU count (log2 axis), one line per GPU type, one panel each."""
    title = "scaling: the best plan at each GPU count"
    points = sweep.get("points") or []
    if not points:
        return note(Frame(width_px=WIDTH_PX, height_px=80, left_px=0, top_px=0, right_px=0, bottom_px=0),
                    "the sweep holds no points", "scaling", title)
    series = _series(points)
    gpus = [p["num_gpus"] for p in points]
    low, high = math.log2(min(gpus)), math.log2(max(gpus))
    span = max(high - low, 1.0)
    panel_px = WIDTH_PX / len(PANELS)
    body = [text(10, 22, title, css="figure-title", size=14, weight="bold")]
    for k, (unit, panel_title, value_of) in enumerate(PANELS):
        frame = Frame(width_px=WIDTH_PX, height_px=330, left_px=k * panel_px + 62, top_px=50,
                      right_px=WIDTH_PX - (k + 1) * panel_px + 12, bottom_px=70)
        body += _panel(frame, series, value_of, unit, panel_title, (low, span))
    body += legend(10, 320, [(name or "gpu", PALETTE[i % len(PALETTE)]) for i, name in enumerate(series)], WIDTH_PX)
    frame = Frame(width_px=WIDTH_PX, height_px=340, left_px=0, top_px=0, right_px=0, bottom_px=0)
    return svg(frame, body, title, "scaling")


def _panel(frame: Frame, series: dict[str, list[dict[str, Any]]], value_of: Callable[[dict[str, Any]], float | None],
           unit: str, title: str, x_range: tuple[float, float]) -> list[str]:
    values = [v for points in series.values() for p in points if (v := value_of(p)) is not None]
    out = [f'<g class="panel" data-quantity="{unit}">',
           text(frame.left_px, frame.top_px - 12, title, css="panel-title", weight="bold")]
    if not values:
        out += [text(frame.left_px, frame.top_px + 40, "not in the sweep", css="note"),
                text(frame.left_px, frame.top_px + 56, "(plan with --tokens, a price)", css="note"), "</g>"]
        return out
    ticks = nice_ticks(max(values))
    out += [part.replace(' class="axis-title"', ' class="axis-title" visibility="hidden"')
            for part in y_axis(frame, ticks, unit)]
    low, span = x_range
    base = frame.top_px + frame.plot_height_px

    def x_of(gpus: float) -> float:
        return frame.left_px + frame.plot_width_px * (0.05 + 0.9 * (math.log2(gpus) - low) / span)

    for gpus in sorted({p["num_gpus"] for points in series.values() for p in points}):
        out.append(text(x_of(gpus), base + 16, tick_text(gpus), anchor="middle", css="tick", size=10))
    out.append(text(frame.left_px + frame.plot_width_px / 2, base + 34, "GPUs", anchor="middle", css="axis-title"))
    for i, points in enumerate(series.values()):
        colour = PALETTE[i % len(PALETTE)]
        drawn = [(x_of(p["num_gpus"]), base - v / ticks[-1] * frame.plot_height_px, p["num_gpus"], v)
                 for p in points if (v := value_of(p)) is not None]
        out += [line(a[0], a[1], b[0], b[1], "curve", colour, width_px=2.0) for a, b in itertools.pairwise(drawn)]
        out += [f'<circle class="point" cx="{x:.2f}" cy="{y:.2f}" r="4" fill="{colour}" data-gpus="{g}" '
                f'data-value="{v:.6g}"><title>{g} GPUs: {v:,.4g} {unit}</title></circle>' for x, y, g, v in drawn]
    return out + ["</g>"]


def _is_placed(document: dict[str, Any]) -> bool:
    placement = document["placement"]
    return placement.get("rank_map") is not None or any(key in placement for key in PLACED_KEYS)


def placement_figure(document: dict[str, Any]) -> str:
    """The rank-to-node map (rows = nodes, cells = GPUs coloured by pipeline stage) and, with an expert map, the
    tokens each expert-parallel rank receives."""
    title = "placement: ranks on nodes"
    if not _is_placed(document):
        return note(Frame(width_px=WIDTH_PX, height_px=60, left_px=0, top_px=0, right_px=0, bottom_px=0),
                    "no placement in this plan (place it with 'paraplan place' or 'paraplan plan --place')",
                    "placement", title)
    body, height = _rank_grid(document, 40.0)
    experts = document["placement"].get("expert_placement")
    if experts:
        part, height = _expert_bars(experts, height + 20)
        body += part
    body.insert(0, text(10, 22, title, css="figure-title", size=14, weight="bold"))
    return svg(Frame(width_px=WIDTH_PX, height_px=height + 10, left_px=0, top_px=0, right_px=0, bottom_px=0), body,
               title, "placement")


def _rank_grid(document: dict[str, Any], top_px: float) -> tuple[list[str], float]:
    config, cluster = document["config"], document["cluster"]
    per_node = min(cluster["gpus_per_node"], cluster["num_gpus"])
    ranks = document["placement"].get("rank_map") or rank_map(tp=config["tp"], cp=config["cp"], dp=config["dp"],
                                                              pp=config["pp"], gpus_per_node=per_node)
    hosts = document["placement"].get("host_order") or []
    nodes = cluster["num_gpus"] // per_node
    out = []
    for entry in ranks:
        if entry["node"] >= MAX_NODES_DRAWN:
            continue
        x, y = 110 + entry["local_rank"] * CELL_PX, top_px + entry["node"] * CELL_PX
        out.append(rect(x, y, CELL_PX - 2, CELL_PX - 2, PALETTE[entry["pp"] % len(PALETTE)], "gpu-cell",
                        {k: entry[k] for k in ("rank", "node", "local_rank", "tp", "cp", "dp", "pp")},
                        f"rank {entry['rank']}: node {entry['node']} GPU {entry['local_rank']}, tp {entry['tp']} "
                        f"cp {entry['cp']} dp {entry['dp']} pp {entry['pp']}"))
    for node in range(min(nodes, MAX_NODES_DRAWN)):
        label = hosts[node] if node < len(hosts) else f"node {node}"
        out.append(text(104, top_px + node * CELL_PX + 15, label[:16], anchor="end", css="row-label", size=11))
    bottom = top_px + min(nodes, MAX_NODES_DRAWN) * CELL_PX + 16
    more = f"; {nodes - MAX_NODES_DRAWN} more nodes not drawn" if nodes > MAX_NODES_DRAWN else ""
    out.append(text(110, bottom, f"colour = pipeline stage (pp = {config['pp']}){more}", css="caption", size=11))
    out += legend(110, bottom + 20, [(f"stage {s}", PALETTE[s % len(PALETTE)]) for s in range(min(config["pp"], 10))],
                  WIDTH_PX - 120)
    return out, bottom + 30


def expert_loads(experts: dict[str, Any]) -> list[float]:
    """Share of the routed tokens each expert-parallel rank receives, the mean over MoE layers (1/ep when even)."""
    layers = experts["token_share"]
    per_rank = [[sum(shares) for shares in layer] for layer in layers]
    return [sum(layer[r] for layer in per_rank) / len(per_rank) for r in range(len(per_rank[0]))]


def _expert_bars(experts: dict[str, Any], top_px: float) -> tuple[list[str], float]:
    loads = expert_loads(experts)
    frame = Frame(width_px=WIDTH_PX, height_px=top_px + 240, left_px=70, top_px=top_px + 24, right_px=20,
                  bottom_px=40)
    ticks = nice_ticks(max(loads + [1.0 / len(loads)]))
    out = [text(frame.left_px, top_px + 10, f"expert load per EP rank (token share, mean of {len(experts['layers'])}"
                f" MoE layers; source: {experts.get('source', '')})"[:120], css="panel-title", weight="bold")]
    out += y_axis(frame, ticks, "token share")
    slot = frame.plot_width_px / len(loads)
    base = frame.top_px + frame.plot_height_px
    for r, load in enumerate(loads):
        height = load / ticks[-1] * frame.plot_height_px
        out.append(rect(frame.left_px + slot * (r + 0.15), base - height, slot * 0.7, height, PALETTE[0], "expert-bar",
                        {"ep_rank": r, "share": f"{load:.6f}"}, f"EP rank {r}: {load:.4f} of the tokens"))
        if len(loads) <= 32:
            out.append(text(frame.left_px + slot * (r + 0.5), base + 14, str(r), anchor="middle", css="tick", size=10))
    even = base - (1.0 / len(loads)) / ticks[-1] * frame.plot_height_px
    out.append(line(frame.left_px, even, frame.left_px + frame.plot_width_px, even, "even-load", "#c00", True, 2.0))
    out.append(text(frame.left_px + frame.plot_width_px - 4, even - 5, f"even share 1/{len(loads)}", anchor="end",
                    css="capacity-label"))
    return out, frame.height_px
