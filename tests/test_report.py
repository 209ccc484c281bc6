"""paraplan report: the pipeline timeline against closed forms, the figures' geometry against the plan's numbers,
the HTML's content, and the command's file rules (CliRunner)."""

from __future__ import annotations

import importlib.util
import json
import re
from functools import cache
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
import pytest
from typer.testing import CliRunner

import paraplan
from paraplan.cli.app import app
from paraplan.cli.report import REPORT_NAME, capacity_of, figures, report_html, write_report
from paraplan.cli.report_figures import memory_figure, pipeline_figure, stage_memory_figure, step_figure
from paraplan.cli.report_scaling import expert_loads, placement_figure, scaling_figure
from paraplan.cli.report_svg import nice_ticks, standalone
from paraplan.cost_models.device_memory import usable_capacity_bytes
from paraplan.errors import InputError
from paraplan.hardware_profiles import load_gpu
from paraplan.planner.layout import rank_map
from paraplan.planner.pipeline_timeline import PHASES, lay_out
from paraplan.planner.stage_times import ChunkTimes, chunk_ranks, rank_totals_s, repriced_chunk_times

runner = CliRunner(env={"COLUMNS": "160"})
GIB = 2**30
JOB = {"seq_len": 4096, "global_batch": 16, "gpu": "h100-sxm", "gpus": 8}  # dp = 1 at tp·pp = 8: 16 micro-batches
PLAN_ARGS = ["plan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096", "--global-batch", "64",
             "--top", "3"]


@cache
def evaluated(**axes) -> dict:
    """The plan document of one configuration of llama-3.1-8b (on 8 H100s unless ``axes`` changes the JOB)."""
    job = {**JOB, **{key: value for key, value in axes.items() if key in JOB}}
    layout = {key: value for key, value in axes.items() if key not in JOB}
    return paraplan.plan_document(paraplan.evaluate("llama-3.1-8b", **job, **layout))["plans"][0]


def uniform(pp: int, vpp: int, m: int, schedule: str = "1f1b", forward_s: float = 1.0, backward_s: float = 2.0,
            hop_s: float = 0.0) -> ChunkTimes:
    """pp·vpp equal chunks whose rank does F and B seconds per micro-batch in all."""
    chunks = pp * vpp
    return ChunkTimes(forward_s=np.full(chunks, forward_s / vpp), backward_s=np.full(chunks, backward_s / vpp),
                      recompute_s=np.zeros(chunks), comm_s=np.zeros(chunks),
                      rank_of_chunk=chunk_ranks(schedule, pp, chunks), hop_s=hop_s, num_microbatches=m,
                      schedule=schedule, scale_frac=1.0)


def rects(svg: str, css: str) -> list[dict[str, str]]:
    """Attributes of every rect whose class starts with ``css``."""
    return [element.attrib for element in ElementTree.fromstring(svg).iter("rect")
            if element.get("class", "").startswith(css)]


# -- the timeline ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("pp", "vpp", "m"), [(1, 1, 5), (4, 1, 8), (8, 1, 16), (4, 2, 8), (4, 4, 8), (2, 2, 6)])
def test_uniform_stages_take_the_closed_form_of_1f1b_and_interleaving(pp, vpp, m):
    # Narayanan et al. 2021: (m + (pp - 1)/vpp)·(F + B) with F + B = 3 s per micro-batch and rank.
    timeline = lay_out(uniform(pp, vpp, m), m)
    assert timeline.makespan_s == pytest.approx((m + (pp - 1) / vpp) * 3.0, rel=1e-12)
    assert len(timeline.rank) == 2 * m * pp * vpp  # one forward and one backward box per micro-batch and chunk


def test_1f1b_runs_pp_minus_rank_warmup_forwards_then_alternates():
    timeline = lay_out(uniform(4, 1, 8), 8)
    for rank in range(4):
        order = np.argsort(timeline.start_s[timeline.rank == rank], kind="stable")
        phases = [PHASES[p] for p in timeline.phase[timeline.rank == rank][order]]
        warmup = 4 - rank - 1
        assert phases[:warmup + 1] == ["forward"] * (warmup + 1) and phases[warmup + 1] == "backward"


@pytest.mark.parametrize("schedule", ["dualpipev", "dualpipe"])
def test_bidirectional_layouts_run_every_chunk_once_after_its_input(schedule):
    pp, m = 4, 8
    times = uniform(pp, 2 if schedule == "dualpipev" else 1, m, schedule, hop_s=0.1)
    timeline = lay_out(times, m)
    chunks = len(times.rank_of_chunk)
    assert len(timeline.rank) == 2 * m * chunks
    for rank in range(pp):  # one box at a time per rank
        starts = np.sort(timeline.start_s[timeline.rank == rank])
        ends = np.sort((timeline.start_s + timeline.duration_s)[timeline.rank == rank])
        assert np.all(starts[1:] >= ends[:-1] - 1e-12)
    forward = timeline.phase == PHASES.index("forward")
    for mb in range(m):  # each micro-batch's forwards in model order (its own path order for DualPipe's mirror)
        own = forward & (timeline.microbatch == mb)
        assert len(np.unique(timeline.chunk[own])) == chunks
    # Every rank is busy (F + B)·m = 24 s; the layout adds idle time but never beats that.
    assert timeline.makespan_s >= 24.0


def test_dualpipev_bubble_lies_between_the_closed_form_and_1f1b():
    pp, m = 4, 16
    bubble = lay_out(uniform(pp, 2, m, "dualpipev"), m).makespan_s - 3.0 * m
    # schedules.py: (pp - 1)(F + 2B - 3W)/2 = 3 s with W = F = 1 (weight gradients split off, not drawn);
    # 1F1B: (pp - 1)(F + B) = 9 s. Drawn without the split, between the two.
    assert 3.0 <= bubble < 9.0


@pytest.mark.parametrize("axes", [{"tp": 2, "pp": 4, "recompute": "full"},
                                  {"tp": 2, "pp": 4, "vpp": 2, "recompute": "selective"},
                                  {"tp": 2, "pp": 4, "vpp": 2, "pp_schedule": "dualpipev", "engine": "torchtitan",
                                   "sp": True},
                                  {"tp": 1, "pp": 1, "offload": 8, "gpus": 1, "global_batch": 2}])
def test_repriced_chunks_add_up_to_the_plans_own_terms(axes):
    document = evaluated(**axes)
    times = repriced_chunk_times(document)
    terms = document["estimate"]["step_time_breakdown_s"]
    own = sum(terms[k] for k in ("compute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "offload_s"))
    assert rank_totals_s(times).max() * times.num_microbatches == pytest.approx(own, rel=1e-12)


# -- figures --------------------------------------------------------------------------------------------------
def test_pipeline_figure_has_a_row_per_stage_and_a_box_per_microbatch_stage_and_phase():
    document = evaluated(tp=2, pp=4, recompute="full")  # 16 micro-batches, 8 drawn (2·pp)
    svg = pipeline_figure(document)
    root = ElementTree.fromstring(svg)
    rows = [g for g in root.iter("g") if g.get("class") == "stage-row"]
    assert len(rows) == 4
    boxes = rects(svg, "box ")
    counts = {phase: sum(1 for b in boxes if b["data-phase"] == phase) for phase in PHASES}
    # forward, recompute and backward once per micro-batch and stage; the collectives twice (after each pass)
    assert counts == {"forward": 8 * 4, "recompute": 8 * 4, "backward": 8 * 4, "comm": 2 * 8 * 4}
    assert "8 of 16 micro-batches drawn" in svg and "seconds from the first forward" in svg


def test_interleaved_pipeline_draws_every_chunk():
    svg = pipeline_figure(evaluated(tp=2, pp=4, vpp=2))
    boxes = rects(svg, "box forward")
    assert len(boxes) == 8 * 4 * 2 and {int(b["data-chunk"]) for b in boxes} == set(range(8))
    assert "interleaved 1F1B (vpp = 2)" in svg


def test_memory_bars_are_proportional_to_bytes_and_capacity_sits_at_its_height():
    document = evaluated(tp=2, pp=4, recompute="full")
    capacity = float(usable_capacity_bytes(load_gpu("h100-sxm").hbm_bytes))
    svg = memory_figure([document], capacity)
    # data area: 420 px tall figure less 40 above and 110 below = 270 px; the axis tops at the round tick above
    # max(peak, capacity)
    top_gib = nice_ticks(max(capacity, document["estimate"]["peak_memory_bytes"]) / GIB)[-1]
    px_per_byte = 270.0 / (top_gib * GIB)
    bars = rects(svg, "bar ")
    assert len(bars) == 7
    for bar in bars:
        assert float(bar["height"]) == pytest.approx(float(bar["data-bytes"]) * px_per_byte, abs=1.0)
    assert sum(float(b["height"]) for b in bars) == pytest.approx(
        document["estimate"]["peak_memory_bytes"] * px_per_byte, abs=1.0)
    line = next(e for e in ElementTree.fromstring(svg).iter("line") if e.get("class") == "capacity")
    assert float(line.get("y1")) == pytest.approx(40 + 270 - capacity * px_per_byte, abs=0.01)
    assert "GiB per GPU" in svg and "usable capacity" in svg


@pytest.mark.parametrize("pp, stages", [(1, ["first"]), (2, ["first", "last"]), (4, ["first", "middle", "last"])])
def test_stage_memory_names_each_stage_and_the_peak_one_is_the_largest(pp, stages):
    estimate = evaluated(tp=2, pp=pp)["estimate"]
    entries = estimate["stage_memory_bytes"]
    assert [e["stage"] for e in entries] == stages
    largest = max(entries, key=lambda e: e["allocated_bytes"])
    assert largest["stage"] == estimate["peak_memory_stage"]
    # The device peak holds the larger of the activation peak and the optimizer step's: never below a stage's.
    assert largest["allocated_bytes"] <= estimate["allocated_memory_bytes"] * (1 + 1e-12)
    assert all(0 < e["activations_bytes"] < e["allocated_bytes"] for e in entries)
    if pp > 1:  # 1F1B: the first stage holds pp micro-batches in flight, the last one
        first, last = entries[0], entries[-1]
        assert first["activations_bytes"] > last["activations_bytes"]


def test_stage_bars_are_proportional_to_bytes():
    document = evaluated(tp=2, pp=4)
    capacity = float(usable_capacity_bytes(load_gpu("h100-sxm").hbm_bytes))
    svg = stage_memory_figure(document, capacity)
    entries = document["estimate"]["stage_memory_bytes"]
    top_gib = nice_ticks(max([e["allocated_bytes"] for e in entries] + [capacity]) / GIB)[-1]
    px_per_byte = (380 - 40 - 90) / (top_gib * GIB)
    bars = rects(svg, "bar ")
    assert len(bars) == 2 * len(entries)
    for entry in entries:
        mine = [b for b in bars if b["data-stage"] == entry["stage"]]
        assert sum(float(b["height"]) for b in mine) == pytest.approx(entry["allocated_bytes"] * px_per_byte, abs=1.0)
    old = {**document, "estimate": {k: v for k, v in document["estimate"].items() if k != "stage_memory_bytes"}}
    assert "predates per-stage memory" in stage_memory_figure(old, capacity)


def test_step_bars_add_up_to_each_plans_step_time():
    # copies with their ranks: evaluated() is cached, and its documents are shared with the other tests
    documents = [{**evaluated(tp=2, pp=4), "rank": 1}, {**evaluated(tp=8, pp=1), "rank": 2}]
    top_s = nice_ticks(max(d["estimate"]["step_time_s"] for d in documents))[-1]
    px_per_s = (900 - 70 - 20) / top_s
    svg = step_figure(documents)
    for rank, document in enumerate(documents, start=1):
        widths = [float(b["width"]) for b in rects(svg, "bar ") if b["data-plan"] == str(rank)]
        assert sum(widths) == pytest.approx(document["estimate"]["step_time_s"] * px_per_s, abs=1.0)
    assert "seconds per step" in svg


def test_nice_ticks_are_round():
    assert nice_ticks(79.0) == [0.0, 20.0, 40.0, 60.0, 80.0]
    assert nice_ticks(1.6) == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert nice_ticks(0.0) == [0.0, 1.0]


def _sweep(with_run: bool) -> dict:
    points = []
    for gpus, rate in ((64, 1.0e5), (128, 1.9e5), (256, 3.4e5)):
        plan = {"estimate": {"tokens_per_s": rate}}
        if with_run:
            plan["run"] = {"wall_s": 86_400.0 * 1e6 / rate, "usd": 2.0 * gpus * 24 * 1e6 / rate, "goodput_frac": 0.9}
        points.append({"num_gpus": gpus, "gpu": "h100-sxm", "global_batch": 512, "plan": plan})
    return {"schema_version": 1, "kind": "sweep", "points": points}


def test_scaling_figure_puts_each_point_at_its_value():
    svg = scaling_figure(_sweep(with_run=True))
    panels = {g.get("data-quantity"): [c.attrib for c in g.iter("circle")]
              for g in ElementTree.fromstring(svg).iter("g") if g.get("class") == "panel"}
    assert list(panels) == ["tokens/s", "days", "USD", "goodput"] and all(len(c) == 3 for c in panels.values())
    days = [float(c["data-value"]) for c in panels["days"]]
    assert days == pytest.approx([1e6 / 1e5, 1e6 / 1.9e5, 1e6 / 3.4e5], rel=1e-5)  # 86,400·1e6/rate s in days
    assert [int(c["data-gpus"]) for c in panels["USD"]] == [64, 128, 256]
    # the throughput panel: cy falls linearly with tokens/s from the axis (y = 50 + 210 px) to the top tick
    top = nice_ticks(3.4e5)[-1]
    for circle in panels["tokens/s"]:
        assert float(circle["cy"]) == pytest.approx(260 - float(circle["data-value"]) / top * 210, abs=0.01)


def test_scaling_without_run_blocks_says_so():
    svg = scaling_figure(_sweep(with_run=False))
    assert len(list(ElementTree.fromstring(svg).iter("circle"))) == 3 and svg.count("not in the sweep") == 3


def test_placement_figure_maps_every_rank_and_expert_load():
    document = json.loads(json.dumps(evaluated(tp=2, pp=4)))
    assert "no placement in this plan" in placement_figure(document)
    document["placement"]["rank_map"] = rank_map(tp=2, cp=1, dp=1, pp=4, gpus_per_node=8)
    document["placement"]["host_order"] = ["gpu-host-a"]
    document["placement"]["expert_placement"] = {"source": "test", "ep": 2, "replicas": 0, "layers": [[[0], [1]]],
                                                 "token_share": [[[0.75], [0.25]]]}
    svg = placement_figure(document)
    cells = rects(svg, "gpu-cell")
    assert len(cells) == 8 and [int(c["data-pp"]) for c in cells] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert "gpu-host-a" in svg
    bars = rects(svg, "expert-bar")
    assert [float(b["data-share"]) for b in bars] == [0.75, 0.25]
    assert float(bars[0]["height"]) == pytest.approx(3 * float(bars[1]["height"]), abs=1.0)


def test_expert_load_is_the_mean_share_over_layers():
    experts = {"token_share": [[[0.5, 0.1], [0.4]], [[0.2], [0.3, 0.5]]]}
    assert expert_loads(experts) == pytest.approx([0.4, 0.6])


# -- the page ---------------------------------------------------------------------------------------------------
def test_report_html_is_self_contained_and_says_what_plan_prints():
    documents = [evaluated(tp=2, pp=4), evaluated(tp=8, pp=1)]
    documents[1] = {**documents[1], "rank": 2}
    html = report_html(documents, _sweep(with_run=True))
    assert not re.search(r"https?://", html) and "<script" not in html and "<link" not in html
    assert html.count("<svg ") == 6 and html.count("<figure ") == 6
    for needle in ("Ranked plans", "Why #1 wins", "pipeline bubble", "optimizer states", "Provenance",
                   "hardware_profiles/efficiency.yaml", "analytical", "#2 (tp=8 pp=1"):
        assert needle in html


def test_run_block_is_shown_when_present():
    document = {**evaluated(tp=2, pp=4), "run": {"wall_s": 86_400.0 * 12.5, "wall_gpu_s": 3600.0 * 2400,
                                                 "usd": 7200.0, "goodput_frac": 0.912}}
    html = report_html([document])
    assert "The whole run" in html and "12.5" in html and "2,400" in html and "$7,200" in html and "0.912" in html
    assert "The whole run" not in report_html([evaluated(tp=2, pp=4)])


def test_capacity_is_none_for_a_gpu_outside_the_catalog():
    document = json.loads(json.dumps(evaluated(tp=2, pp=4)))
    assert capacity_of(document) == pytest.approx(float(usable_capacity_bytes(load_gpu("h100-sxm").hbm_bytes)))
    document["cluster"]["gpu"] = "my-own-gpu"
    assert capacity_of(document) is None
    assert "no timeline" in pipeline_figure(document) and 'class="capacity"' not in memory_figure([document], None)


def test_write_report_writes_one_file_and_never_overwrites_without_force(tmp_path):
    out = tmp_path / "reports"
    path = write_report([evaluated(tp=2, pp=4)], out, force=False)
    assert path == out / REPORT_NAME and sorted(p.name for p in out.iterdir()) == [REPORT_NAME]
    with pytest.raises(InputError, match="--force"):
        write_report([evaluated(tp=2, pp=4)], out, force=False)
    assert write_report([evaluated(tp=2, pp=4)], out, force=True) == path


# -- the command ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    result = runner.invoke(app, [*PLAN_ARGS, "--json", str(path)])
    assert result.exit_code == 0, result.output
    return path


def test_plan_then_report_end_to_end(plan_file, tmp_path):
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["report", str(plan_file), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]  # nothing else written
    html = out.read_text()
    plans = json.loads(plan_file.read_text())["plans"]
    assert html.count("<tr><td") >= len(plans) and html.count("<svg ") == 5  # no sweep: no scaling figure
    assert f"{plans[0]['estimate']['tokens_per_s_per_gpu']:,.0f}" in html
    again = runner.invoke(app, ["report", str(plan_file), "-o", str(out)])
    assert again.exit_code == 2 and "--force" in again.output and out.read_text() == html
    assert runner.invoke(app, ["report", str(plan_file), "-o", str(out), "--force"]).exit_code == 0


@pytest.mark.parametrize(("content", "needle"), [("{not json", "plan.json"), ('{"plans": 3}', "schema_version"),
                                                  ("[]", "expected")])
def test_bad_plan_file_is_one_line_and_exit_2(tmp_path, content, needle):
    bad = tmp_path / "plan.json"
    bad.write_text(content)
    result = runner.invoke(app, ["report", str(bad), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 2 and needle in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "r.html").exists()


def test_bad_sweep_file_is_one_line_and_exit_2(plan_file, tmp_path):
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"kind": "sweep", "points": [{"num_gpus": 0, "plan": {}}]}))
    result = runner.invoke(app, ["report", str(plan_file), "--sweep", str(sweep), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 2 and "num_gpus" in result.output and len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize(("args", "needle"), [([], "say what to write"), (["--plot", "pipeline"], "go together"),
                                              (["--plot", "pie", "--plot-out", "x.svg"], "not a figure"),
                                              (["--plot", "scaling", "--plot-out", "x.svg"], "--sweep"),
                                              (["--plot", "step", "--plot-out", "x.pdf"], ".svg or .png")])
def test_bad_requests_are_one_line(plan_file, args, needle):
    result = runner.invoke(app, ["report", str(plan_file), *args])
    assert result.exit_code == 2 and needle in result.output


def test_plot_svg_is_a_standalone_svg_file(plan_file, tmp_path):
    out = tmp_path / "step.svg"
    result = runner.invoke(app, ["report", str(plan_file), "--plot", "step", "--plot-out", str(out)])
    assert result.exit_code == 0, result.output
    root = ElementTree.fromstring(out.read_text().split("\n", 1)[1])
    assert root.tag == "{http://www.w3.org/2000/svg}svg" and root.get("id") == "step"
    assert out.read_text() == standalone(figures(json.loads(plan_file.read_text())["plans"], None)["step"])


def test_plot_png_with_matplotlib_or_a_one_line_hint_without(plan_file, tmp_path):
    out = tmp_path / "memory.png"
    result = runner.invoke(app, ["report", str(plan_file), "--plot", "memory", "--plot-out", str(out)])
    if importlib.util.find_spec("matplotlib") is None:
        assert result.exit_code == 2 and "paraplan[plot]" in result.output and not out.exists()
        pytest.skip("matplotlib is not installed (pip install 'paraplan[plot]'): checked the one-line hint only")
    assert result.exit_code == 0, result.output
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (900, 420)  # the SVG's own pixel size


def test_sweep_then_report_draws_the_scaling_curve(plan_file, tmp_path):
    sweep = tmp_path / "sweep.json"
    made = runner.invoke(app, ["sweep", "llama-3.1-8b", "--seq-len", "4096", "--global-batch", "64", "--gpus",
                               "8,16", "--gpu", "h100-sxm", "--tokens", "1e9", "--price-per-gpu-hour", "2",
                               "--json", str(sweep)])
    assert made.exit_code == 0, made.output
    out = tmp_path / "scaling.svg"
    result = runner.invoke(app, ["report", str(plan_file), "--sweep", str(sweep), "--plot", "scaling",
                                 "--plot-out", str(out)])
    assert result.exit_code == 0, result.output
    points = json.loads(sweep.read_text())["points"]
    root = ElementTree.fromstring(out.read_text().split("\n", 1)[1])
    panels = {g.get("data-quantity"): [c.attrib for c in g.iter("{http://www.w3.org/2000/svg}circle")]
              for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "panel"}
    assert [float(c["data-value"]) for c in panels["tokens/s"]] == pytest.approx(
        [p["plan"]["estimate"]["tokens_per_s"] for p in sorted(points, key=lambda p: p["num_gpus"])], rel=1e-5)
    assert [float(c["data-value"]) for c in panels["USD"]] == pytest.approx(
        [p["plan"]["run"]["usd"] for p in sorted(points, key=lambda p: p["num_gpus"])], rel=1e-5)
