"""The report's plan figures as SVG strings: the pipeline timeline, memory against capacity, the step breakdown.

Each function takes plan documents (what ``paraplan plan --json`` writes, one dict per plan) and returns one
``<svg>`` element; sizes in pixels, times in seconds and memory in GiB on the axes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from paraplan.cli.render import MEMORY_LABELS, STEP_LABELS, config_text, seconds
from paraplan.cli.report_svg import (
    PALETTE,
    WIDTH_PX,
    Frame,
    caption,
    legend,
    line,
    nice_ticks,
    note,
    rect,
    svg,
    text,
    x_axis,
    y_axis,
)
from paraplan.errors import InputError
from paraplan.hardware_profiles.units import BYTES_PER_GIB
from paraplan.planner.pipeline_timeline import PHASES, Timeline, lay_out
from paraplan.planner.stage_times import plan_chunk_times

PHASE_COLOURS = dict(zip(PHASES, (PALETTE[0], PALETTE[5], PALETTE[1], PALETTE[3]), strict=True))
PHASE_LABELS = {"forward": "forward", "recompute": "recompute", "backward": "backward",
                "comm": "TP/CP/EP comm (exposed)"}
ROW_PX = 24.0  # one pipeline stage's row when few stages; rows share 900 px beyond (6 px at least): 64 stages
# take about 1,450 px with their gaps and margins
ROW_GAP_PX = 6.0
LABEL_MIN_PX = 16.0  # a box narrower than this has no micro-batch number inside (two digits at 10 px)


def _schedule_name(document: dict[str, Any]) -> str:
    config = document["config"]
    if config["pp_schedule"] != "1f1b":
        return {"dualpipe": "DualPipe", "dualpipev": "DualPipeV"}.get(config["pp_schedule"], config["pp_schedule"])
    return f"interleaved 1F1B (vpp = {config['vpp']})" if config["vpp"] > 1 else "1F1B"


def pipeline_figure(document: dict[str, Any]) -> str:
    """Rows = pipeline ranks, boxes = forward / recompute / backward / exposed collectives of each drawn
    micro-batch and chunk, laid out under the plan's schedule (planner.pipeline_timeline)."""
    title = f"pipeline schedule: {_schedule_name(document)}, pp = {document['config']['pp']}"
    try:
        timeline = lay_out(plan_chunk_times(document))
    except InputError as exc:
        return note(Frame(width_px=WIDTH_PX, height_px=80, left_px=0, top_px=0, right_px=0, bottom_px=0),
                    f"no timeline: {exc}"[:160], "pipeline", title)
    row_px = max(6.0, min(ROW_PX, 900.0 / timeline.num_ranks))
    frame = Frame(width_px=WIDTH_PX, height_px=70 + timeline.num_ranks * (row_px + ROW_GAP_PX) + 100,
                  left_px=80, top_px=40, right_px=20, bottom_px=100)
    ticks = nice_ticks(timeline.makespan_s)
    px_per_s = frame.plot_width_px / ticks[-1]
    body = [text(frame.left_px, 22, title, css="figure-title", size=14, weight="bold")]
    body += x_axis(frame, ticks, "seconds from the first forward")
    for rank in range(timeline.num_ranks):
        y = frame.top_px + ROW_GAP_PX / 2 + rank * (row_px + ROW_GAP_PX)
        body.append(f'<g class="stage-row" data-rank="{rank}">')
        body.append(text(frame.left_px - 8, y + row_px / 2 + 4, f"stage {rank}", anchor="end", css="row-label"))
        body += _boxes(timeline, rank, y, row_px, frame.left_px, px_per_s)
        body.append("</g>")
    base = frame.top_px + frame.plot_height_px
    body += legend(frame.left_px, base + 58, [(PHASE_LABELS[p], PHASE_COLOURS[p]) for p in PHASES], frame.plot_width_px)
    body += caption(frame.left_px, base + 80, _pipeline_caption(document, timeline))
    return svg(frame, body, title, "pipeline")


def _boxes(timeline: Timeline, rank: int, y: float, row_px: float, left_px: float, px_per_s: float) -> list[str]:
    out = []
    for index in np.flatnonzero(timeline.rank == rank):
        phase = PHASES[timeline.phase[index]]
        x, width = left_px + timeline.start_s[index] * px_per_s, timeline.duration_s[index] * px_per_s
        mb, chunk = int(timeline.microbatch[index]), int(timeline.chunk[index])
        out.append(rect(x, y, width, row_px, PHASE_COLOURS[phase], f"box {phase}",
                        {"rank": rank, "microbatch": mb, "chunk": chunk, "phase": phase},
                        f"{phase} micro-batch {mb} chunk {chunk}: {seconds(timeline.duration_s[index])} s"))
        if phase in ("forward", "backward") and width >= LABEL_MIN_PX and row_px >= 12:
            out.append(text(x + width / 2, y + row_px / 2 + 4, str(mb), anchor="middle", size=10, css="box-label"))
    return out


def _pipeline_caption(document: dict[str, Any], timeline: Timeline) -> str:
    estimate = document["estimate"]
    busy = np.bincount(timeline.rank, weights=timeline.duration_s, minlength=timeline.num_ranks)
    drawn = timeline.num_drawn_microbatches
    return (f"{drawn} of {estimate['num_microbatches']} micro-batches drawn"
            + ("; the steady state repeats for the rest" if drawn < estimate["num_microbatches"] else "")
            + f"; idle on the busiest stage here {seconds(timeline.makespan_s - busy.max())} s; "
            f"the cost model's bubble for the whole step {seconds(estimate['step_time_breakdown_s']['bubble_s'])} s")


def _plan_label(document: dict[str, Any]) -> str:
    return f"#{document['rank']}"


def _capacity_line(frame: Frame, base_px: float, px_per_gib: float, capacity_bytes: float | None) -> list[str]:
    """The usable-capacity line across a bar chart and its label (nothing when the capacity is unknown)."""
    if not capacity_bytes:
        return []
    y = base_px - capacity_bytes / BYTES_PER_GIB * px_per_gib
    return [line(frame.left_px, y, frame.left_px + frame.plot_width_px, y, "capacity", "#c00", True, 2.0),
            text(frame.left_px + frame.plot_width_px - 4, y - 5,
                 f"usable capacity {capacity_bytes / BYTES_PER_GIB:.1f} GiB", anchor="end", css="capacity-label")]


def memory_figure(documents: list[dict[str, Any]], capacity_bytes: float | None) -> str:
    """One stacked bar per plan: its most loaded stage's bytes by item, against the usable capacity line."""
    frame = Frame(width_px=WIDTH_PX, height_px=420, left_px=70, top_px=40, right_px=20, bottom_px=110)
    peaks = [sum(d["estimate"]["memory_breakdown_bytes"].values()) for d in documents]
    ticks = nice_ticks(max(peaks + [capacity_bytes or 0.0]) / BYTES_PER_GIB)
    px_per_gib = frame.plot_height_px / ticks[-1]
    title = "memory per GPU of each plan's most loaded stage (GiB)"
    body = [text(frame.left_px, 22, title, css="figure-title", size=14, weight="bold")]
    body += y_axis(frame, ticks, "GiB per GPU")
    slot = frame.plot_width_px / len(documents)
    base = frame.top_px + frame.plot_height_px
    for i, document in enumerate(documents):
        x, y = frame.left_px + slot * (i + 0.2), base
        for j, (item, value) in enumerate(document["estimate"]["memory_breakdown_bytes"].items()):
            height = value / BYTES_PER_GIB * px_per_gib
            y -= height
            body.append(rect(x, y, slot * 0.6, height, PALETTE[j % len(PALETTE)], f"bar {item}",
                             {"plan": document["rank"], "item": item, "bytes": f"{value:.0f}"},
                             f"{MEMORY_LABELS.get(item, item)}: {value / BYTES_PER_GIB:.1f} GiB"))
        stage = document["estimate"].get("peak_memory_stage", "")
        body.append(text(x + slot * 0.3, base + 16, f"{_plan_label(document)} ({stage} stage)", anchor="middle",
                         css="tick"))
    body += _capacity_line(frame, base, px_per_gib, capacity_bytes)
    items = list(documents[0]["estimate"]["memory_breakdown_bytes"])
    body += legend(frame.left_px, base + 44, [(MEMORY_LABELS.get(k, k), PALETTE[j % len(PALETTE)])
                                             for j, k in enumerate(items)], frame.plot_width_px)
    return svg(frame, body, title, "memory")


STAGE_PARTS = (("activations_bytes", "saved activations", "#4e79a7"),
               ("rest_bytes", "weights, gradients, optimizer states, transient and logits", "#f28e2b"))


def stage_memory_figure(document: dict[str, Any], capacity_bytes: float | None) -> str:
    """The best plan's pipeline stages side by side (first, busiest middle, last): live tensors at each one's
    peak, saved activations apart from the rest, against the usable capacity line."""
    stages = document["estimate"].get("stage_memory_bytes")
    frame = Frame(width_px=WIDTH_PX, height_px=380, left_px=70, top_px=40, right_px=20, bottom_px=90)
    title = f"memory per pipeline stage of {_plan_label(document)} (GiB, live tensors at each stage's peak)"
    if not stages:
        return note(frame, "this plan file predates per-stage memory: plan again to draw it", "stages", title)
    top = max([s["allocated_bytes"] for s in stages] + [capacity_bytes or 0.0]) / BYTES_PER_GIB
    ticks = nice_ticks(top)
    px_per_gib = frame.plot_height_px / ticks[-1]
    body = [text(frame.left_px, 22, title, css="figure-title", size=14, weight="bold")]
    body += y_axis(frame, ticks, "GiB per GPU")
    slot = frame.plot_width_px / len(stages)
    base = frame.top_px + frame.plot_height_px
    for i, stage in enumerate(stages):
        parts = {"activations_bytes": stage["activations_bytes"],
                 "rest_bytes": max(stage["allocated_bytes"] - stage["activations_bytes"], 0.0)}
        x, y = frame.left_px + slot * (i + 0.25), base
        for key, label, colour in STAGE_PARTS:
            height = parts[key] / BYTES_PER_GIB * px_per_gib
            y -= height
            body.append(rect(x, y, slot * 0.5, height, colour, f"bar {key}",
                             {"stage": stage["stage"], "item": key, "bytes": f"{parts[key]:.0f}"},
                             f"{stage['stage']} stage, {label}: {parts[key] / BYTES_PER_GIB:.1f} GiB"))
        body.append(text(x + slot * 0.25, base + 16, f"{stage['stage']} stage "
                         f"({stage['allocated_bytes'] / BYTES_PER_GIB:.1f} GiB)", anchor="middle", css="tick"))
    body += _capacity_line(frame, base, px_per_gib, capacity_bytes)
    body += legend(frame.left_px, base + 40, [(label, colour) for _, label, colour in STAGE_PARTS],
                   frame.plot_width_px)
    return svg(frame, body, title, "stages")


def step_figure(documents: list[dict[str, Any]]) -> str:
    """One horizontal stacked bar per plan: the terms of its step time, in seconds."""
    rows = len(documents)
    frame = Frame(width_px=WIDTH_PX, height_px=150 + rows * 34, left_px=70, top_px=40, right_px=20, bottom_px=110)
    ticks = nice_ticks(max(d["estimate"]["step_time_s"] for d in documents))
    px_per_s = frame.plot_width_px / ticks[-1]
    title = "step time by term (s)"
    body = [text(frame.left_px, 22, title, css="figure-title", size=14, weight="bold")]
    body += x_axis(frame, ticks, "seconds per step")
    band = frame.plot_height_px / rows
    terms = list(documents[0]["estimate"]["step_time_breakdown_s"])
    for i, document in enumerate(documents):
        x, y = frame.left_px, frame.top_px + band * (i + 0.15)
        body.append(text(frame.left_px - 8, y + band * 0.35 + 4, _plan_label(document), anchor="end", css="row-label"))
        for j, term in enumerate(terms):
            width = document["estimate"]["step_time_breakdown_s"][term] * px_per_s
            body.append(rect(x, y, width, band * 0.7, PALETTE[j % len(PALETTE)], f"bar {term}",
                             {"plan": document["rank"], "term": term},
                             f"{STEP_LABELS.get(term, term)}: {seconds(width / px_per_s)} s"))
            x += width
    base = frame.top_px + frame.plot_height_px
    body += legend(frame.left_px, base + 56, [(STEP_LABELS.get(t, t), PALETTE[j % len(PALETTE)])
                                             for j, t in enumerate(terms)], frame.plot_width_px)
    body += caption(frame.left_px, base + 96, "#1: " + config_text(documents[0]["config"]))
    return svg(frame, body, title, "step")
