"""PNG files of the report's figures: the figure's own SVG primitives replayed on a matplotlib canvas.

The figures are drawn once, as SVG (report_figures, report_scaling); a PNG is the same boxes, lines, circles and
text at the same pixel positions, rasterised by matplotlib (the optional ``plot`` extra). Only this module imports
matplotlib, and only when a .png is asked for.
"""

from __future__ import annotations

import io
import re
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree

from paraplan.errors import InputError

if TYPE_CHECKING:
    from matplotlib.axes import Axes

DPI = 100  # matplotlib's default: one SVG pixel is one PNG pixel at 100 dots per inch
POINTS_PER_PX = 72.0 / DPI  # font sizes are in SVG pixels, matplotlib's in points (1/72 inch)
_ROTATE = re.compile(r"rotate\((-?[\d.]+)")
_ANCHORS = {"start": "left", "middle": "center", "end": "right"}


def _matplotlib() -> tuple[Any, Any, Any]:
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: write files only
        from matplotlib import pyplot
        from matplotlib.patches import Circle, Rectangle
    except ImportError:
        raise InputError("a .png figure needs matplotlib: pip install 'paraplan[plot]', or write the figure as "
                         ".svg") from None
    return pyplot, Rectangle, Circle


def _f(element: ElementTree.Element, name: str, default: float = 0.0) -> float:
    value = element.get(name)
    return float(value.rstrip("%")) if value and not value.endswith("%") else default


def _draw(axes: Axes, element: ElementTree.Element, shapes: tuple, size: tuple[float, float]) -> None:
    """One SVG primitive on ``axes`` (pixel coordinates, y down)."""
    rectangle, circle = shapes
    tag = element.tag.rsplit("}", 1)[-1]
    if tag == "rect":
        width = size[0] if element.get("width") == "100%" else _f(element, "width")
        height = size[1] if element.get("height") == "100%" else _f(element, "height")
        axes.add_patch(rectangle((_f(element, "x"), _f(element, "y")), width, height, facecolor=element.get("fill"),
                                 linewidth=0))
    elif tag == "line":
        axes.plot([_f(element, "x1"), _f(element, "x2")], [_f(element, "y1"), _f(element, "y2")],
                  color=element.get("stroke"), linewidth=_f(element, "stroke-width", 1.0) * POINTS_PER_PX,
                  linestyle="--" if element.get("stroke-dasharray") else "-")
    elif tag == "circle":
        axes.add_patch(circle((_f(element, "cx"), _f(element, "cy")), _f(element, "r"), facecolor=element.get("fill")))
    elif tag == "text" and element.text:
        turn = _ROTATE.search(element.get("transform", ""))
        axes.text(_f(element, "x"), _f(element, "y"), element.text, ha=_ANCHORS[element.get("text-anchor", "start")],
                  va="baseline", fontsize=_f(element, "font-size", 12.0) * POINTS_PER_PX,
                  fontweight=element.get("font-weight", "normal"), rotation=-float(turn.group(1)) if turn else 0.0)


def png_bytes(figure: str) -> bytes:
    """The PNG image of one inline SVG figure of the report, at its own pixel size."""
    pyplot, rectangle, circle = _matplotlib()
    root = ElementTree.fromstring(figure)
    width, height = root.get("width"), root.get("height")
    assert width is not None and height is not None  # every figure report_svg draws states its pixel size
    size = (float(width), float(height))
    canvas = pyplot.figure(figsize=(size[0] / DPI, size[1] / DPI), dpi=DPI)
    axes = canvas.add_axes((0.0, 0.0, 1.0, 1.0))
    axes.set_xlim(0, size[0])
    axes.set_ylim(size[1], 0)
    axes.axis("off")
    for element in root.iter():
        if element is not root and element.tag.rsplit("}", 1)[-1] != "title":
            _draw(axes, element, (rectangle, circle), size)
    buffer = io.BytesIO()
    canvas.savefig(buffer, format="png", dpi=DPI)
    pyplot.close(canvas)
    return buffer.getvalue()
