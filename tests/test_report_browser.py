"""The report as a person sees it: rendered by headless Chromium, measured in the laid-out page.

The test copies the report with a measuring script appended (the report itself has none), lets Chromium lay it out
(``--dump-dom`` after the script ran) and asserts on what is drawn: every figure on the page with a non-zero box
inside the viewport's width, one pipeline row per stage, the boxes on top where they are drawn (hit-tested), the
axis labels laid out with a size. A screenshot of the pipeline figure alone must colour at least the area of its
boxes. Skipped without Chromium, except under PARAPLAN_REQUIRE_BROWSER=1 (CI), where that is a failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import zlib
from functools import cache
from pathlib import Path
from xml.etree import ElementTree

import pytest

import paraplan
from paraplan.cli.report import figures, report_html
from paraplan.cli.report_svg import standalone

VIEWPORT = (1000, 1000)  # CSS px: the report's 900 px figures plus its 24 px margins fit across
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
TIMEOUT_S = 120  # a cold Chromium start on a loaded 2-core machine takes a few seconds; this is a hang guard
MEASURE = """<script>
const box = e => { const r = e.getBoundingClientRect(); return {x: r.x, y: r.y + scrollY, w: r.width, h: r.height}; };
const out = {viewport: [innerWidth, innerHeight], figures: [], labels: [], hits: []};
for (const f of document.querySelectorAll("svg.figure")) out.figures.push({id: f.id, ...box(f)});
out.rows = document.querySelectorAll("#pipeline g.stage-row").length;
out.boxes = document.querySelectorAll("#pipeline rect.box").length;
for (const t of document.querySelectorAll("svg text.axis-title, svg text.row-label, svg text.figure-title"))
  out.labels.push({text: t.textContent, ...box(t)});
for (const g of document.querySelectorAll("#pipeline g.stage-row")) {
  const first = g.querySelector("rect.box.forward");
  first.scrollIntoView({block: "center"});
  const r = first.getBoundingClientRect();
  const hit = document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2);
  out.hits.push(hit === first ? "box" : hit.getAttribute("class"));
}
const pre = document.createElement("pre"); pre.id = "measure"; pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


def browser() -> str:
    """The Chromium binary, or a skip (a failure under PARAPLAN_REQUIRE_BROWSER=1)."""
    found = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    if found is None:
        reason = "headless Chromium not found (apt-get install chromium); the report's browser checks did not run"
        if os.environ.get("PARAPLAN_REQUIRE_BROWSER") == "1":
            pytest.fail(reason + " but PARAPLAN_REQUIRE_BROWSER=1")
        pytest.skip(reason)
    return found


def chromium(*args: str, home: Path) -> str:
    """Run headless Chromium (no sandbox: CI runs as root) with its profile in ``home``; its stdout."""
    command = [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={home / 'profile'}", f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}", *args]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=TIMEOUT_S,
                          env={**os.environ, "HOME": str(home)})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@cache
def documents() -> tuple[dict, ...]:
    """Two plans of llama-3.1-8b on 8 H100s: a 4-stage 1F1B pipeline first, then tp = 8."""
    job = {"seq_len": 4096, "global_batch": 16, "gpu": "h100-sxm", "gpus": 8}
    first = paraplan.evaluate("llama-3.1-8b", tp=2, pp=4, recompute="full", **job)
    second = paraplan.evaluate("llama-3.1-8b", tp=8, pp=1, **job)
    plans = paraplan.plan_document(first)["plans"] + paraplan.plan_document(second)["plans"]
    plans[1]["rank"] = 2
    return tuple(plans)


def sweep() -> dict:
    points = [{"num_gpus": n, "gpu": "h100-sxm", "global_batch": 16,
               "plan": {"estimate": {"tokens_per_s": 1e4 * n ** 0.9}, "run": {"wall_s": 1e7 / n, "usd": 50.0 * n,
                                                                            "goodput_frac": 0.95 - n / 1e4}}}
              for n in (8, 16, 32, 64)]
    return {"schema_version": 1, "kind": "sweep", "points": points}


def test_the_report_draws_every_figure_inside_the_page(tmp_path):
    page = tmp_path / "report.html"
    page.write_text(report_html(list(documents()), sweep()).replace("</body>", MEASURE + "</body>"))
    dom = chromium("--virtual-time-budget=5000", "--dump-dom", page.as_uri(), home=tmp_path)
    found = re.search(r"<pre id=\"measure\">(.*?)</pre>", dom, re.DOTALL)
    assert found, dom[-1000:]
    drawn = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert [f["id"] for f in drawn["figures"]] == ["pipeline", "memory", "stages", "step", "scaling", "placement"]
    for figure in drawn["figures"]:
        assert figure["w"] > 0 and figure["h"] > 0 and 0 <= figure["x"] and figure["x"] + figure["w"] <= VIEWPORT[0]
    pipeline = ElementTree.fromstring(figures(list(documents()), None)["pipeline"])
    assert drawn["rows"] == 4 and drawn["boxes"] == sum(1 for r in pipeline.iter("rect")
                                                        if r.get("class", "").startswith("box "))
    # what the page shows at the centre of each stage's first forward box: the box, or the micro-batch number on it
    assert len(drawn["hits"]) == 4 and set(drawn["hits"]) <= {"box", "box-label"}
    labels = {label["text"]: label for label in drawn["labels"]}
    for text in ("stage 0", "stage 3", "seconds from the first forward", "GiB per GPU", "seconds per step", "GPUs"):
        assert labels[text]["w"] > 0 and labels[text]["h"] > 0, text
        assert 0 <= labels[text]["x"] and labels[text]["x"] + labels[text]["w"] <= VIEWPORT[0], text


def _png_pixels(data: bytes) -> tuple[int, int, int, list[bytes]]:
    """Width, height, bytes per pixel and unfiltered rows of an 8-bit, non-interlaced RGB(A) PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, position = {}, 8
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position:position + 8])
        chunks.setdefault(kind, b"")
        chunks[kind] += data[position + 8:position + 8 + length]
        position += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert depth == 8 and colour in (2, 6) and interlace == 0
    step = 3 if colour == 2 else 4
    raw, rows, previous = zlib.decompress(chunks[b"IDAT"]), [], bytearray(width * step)
    for y in range(height):
        start = y * (width * step + 1)
        kind, line = raw[start], bytearray(raw[start + 1:(y + 1) * (width * step + 1)])
        for i in range(len(line)):
            left = line[i - step] if i >= step else 0
            up, corner = previous[i], previous[i - step] if i >= step else 0
            guess = left + up - corner
            paeth = min((abs(guess - left), 0, left), (abs(guess - up), 1, up), (abs(guess - corner), 2, corner))[2]
            line[i] = (line[i] + (0, left, up, (left + up) // 2, paeth)[kind]) & 0xFF
        rows.append(bytes(line))
        previous = line
    return width, height, step, rows


def test_a_screenshot_of_the_pipeline_colours_at_least_its_boxes(tmp_path):
    figure = figures(list(documents()), None)["pipeline"]
    svg_file, shot = tmp_path / "pipeline.svg", tmp_path / "pipeline.png"
    svg_file.write_text(standalone(figure))
    chromium(f"--screenshot={shot}", svg_file.as_uri(), home=tmp_path)
    width, height, step, rows = _png_pixels(shot.read_bytes())
    coloured = sum(1 for row in rows for x in range(width) if min(row[x * step:x * step + 3]) < 235)
    root = ElementTree.fromstring(figure)
    boxes = [r for r in root.iter("rect") if r.get("class", "").startswith("box ")]
    area = sum(float(r.get("width")) * float(r.get("height")) for r in boxes)
    # every box is coloured (anti-aliased edges may lighten a pixel of each side), the page is not all ink
    assert 0.95 * area <= coloured < 0.6 * width * height, (coloured, area)
