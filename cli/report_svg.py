"""SVG building blocks for the report's figures: escaped text, boxes, linear axes with round ticks, legends.

Everything is written as plain SVG 1.1 markup with the system's sans-serif font, so a figure needs no script,
font or stylesheet from anywhere: it shows the same inline in the HTML report, in a browser as a file, or in
an SVG viewer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

WIDTH_PX = 900.0  # every figure's width: fits a laptop browser window, and an A4 page at 96 dpi landscape
FONT = "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\""
"""A font every system has (the generic sans-serif last), so no font is fetched."""
TICK_STEPS = (1.0, 2.0, 2.5, 5.0)  # round tick spacings per decade (the 1-2-5 series with 2.5 for quarters)
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac")
"""Tableau 10: ten colours told apart in print and by most colour-blind readers (Tableau's published palette)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Frame:
    """Where a plot's data area sits in its SVG, in pixels."""

    width_px: float
    height_px: float
    left_px: float
    """Margin left of the data area (for the y axis labels)."""
    top_px: float
    right_px: float
    bottom_px: float

    @property
    def plot_width_px(self) -> float:
        """Width of the data area."""
        return self.width_px - self.left_px - self.right_px

    @property
    def plot_height_px(self) -> float:
        """Height of the data area."""
        return self.height_px - self.top_px - self.bottom_px


def num(value: float) -> str:
    """A coordinate with at most two decimals (enough for a pixel, short markup)."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def svg(frame: Frame, body: list[str], title: str, figure_id: str) -> str:
    """A whole SVG element: title (its accessible name), the body, a white background. Inline in HTML it needs no
    namespace; :func:`standalone` adds it for a file."""
    return (f'<svg class="figure" id="{escape(figure_id)}" '
            f'width="{num(frame.width_px)}" height="{num(frame.height_px)}" '
            f'viewBox="0 0 {num(frame.width_px)} {num(frame.height_px)}" {FONT} font-size="12">'
            f"<title>{escape(title)}</title>"
            f'<rect class="background" width="100%" height="100%" fill="white"/>' + "".join(body) + "</svg>")


def text(x_px: float, y_px: float, content: str, *, anchor: str = "start", size: int = 12, css: str = "label",
         weight: str = "normal", rotate: bool = False) -> str:
    """A text element; ``rotate`` turns it a quarter anticlockwise about its anchor (a y-axis title)."""
    turn = f' transform="rotate(-90 {num(x_px)} {num(y_px)})"' if rotate else ""
    return (f'<text class="{css}" x="{num(x_px)}" y="{num(y_px)}" text-anchor="{anchor}" font-size="{size}" '
            f'font-weight="{weight}"{turn}>{escape(content)}</text>')


CHARS_PER_LINE = 115  # about 7 px per character of 11 px text: 805 px from a caption's x (70-80 px) stays
# within the 900 px figure


def caption(x_px: float, y_px: float, content: str, size: int = 11) -> list[str]:
    """A caption as text lines 14 px apart, broken between words at CHARS_PER_LINE."""
    lines, current = [], ""
    for word in content.split(" "):
        if current and len(current) + 1 + len(word) > CHARS_PER_LINE:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    lines.append(current)
    return [text(x_px, y_px + 14 * i, part, css="caption", size=size) for i, part in enumerate(lines)]


def rect(x_px: float, y_px: float, width_px: float, height_px: float, fill: str, css: str,
         data: dict[str, object] | None = None, tip: str | None = None) -> str:
    """A filled box with ``data-*`` attributes (what tests and readers query) and a hover tip."""
    attributes = "".join(f' data-{key}="{escape(str(value))}"' for key, value in (data or {}).items())
    inner = f"<title>{escape(tip)}</title>" if tip else ""
    return (f'<rect class="{css}" x="{num(x_px)}" y="{num(y_px)}" width="{num(max(width_px, 0.0))}" '
            f'height="{num(max(height_px, 0.0))}" fill="{fill}"{attributes}>{inner}</rect>')


def line(x1_px: float, y1_px: float, x2_px: float, y2_px: float, css: str, stroke: str = "#333",
         dashed: bool = False, width_px: float = 1.0) -> str:
    """A straight line."""
    dash = ' stroke-dasharray="6 4"' if dashed else ""
    return (f'<line class="{css}" x1="{num(x1_px)}" y1="{num(y1_px)}" x2="{num(x2_px)}" y2="{num(y2_px)}" '
            f'stroke="{stroke}" stroke-width="{num(width_px)}"{dash}/>')


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``top``: about ``count`` steps of 1, 2, 2.5 or 5 times a power of 10."""
    if not top > 0 or not math.isfinite(top):
        return [0.0, 1.0]
    raw = top / count
    decade = 10.0 ** math.floor(math.log10(raw))
    step = next(s * decade for s in TICK_STEPS + (10.0,) if s * decade >= raw)
    return [i * step for i in range(math.ceil(top / step - 1e-9) + 1)]


def tick_text(value: float) -> str:
    """A tick label: no trailing zeros, thousands separated; from 100,000 up in k or M, so a label fits the
    60 px left of a panel's axis."""
    if abs(value) >= 1e6:
        return f"{value / 1e6:,.4g}M"
    if abs(value) >= 1e5:
        return f"{value / 1e3:,.4g}k"
    return f"{value:,.0f}" if value == int(value) else f"{value:,.3g}"


def y_axis(frame: Frame, ticks: list[float], title: str) -> list[str]:
    """Left axis with grid lines from 0 to ticks[-1]."""
    out = [line(frame.left_px, frame.top_px, frame.left_px, frame.top_px + frame.plot_height_px, "axis")]
    for value in ticks:
        y = frame.top_px + frame.plot_height_px * (1.0 - value / ticks[-1])
        out.append(line(frame.left_px, y, frame.left_px + frame.plot_width_px, y, "grid", stroke="#ddd"))
        out.append(text(frame.left_px - 6, y + 4, tick_text(value), anchor="end", css="tick"))
    out.append(text(14, frame.top_px + frame.plot_height_px / 2, title, anchor="middle", css="axis-title",
                    rotate=True))
    return out


def x_axis(frame: Frame, ticks: list[float], title: str) -> list[str]:
    """Bottom axis with grid lines from 0 to ticks[-1]."""
    base = frame.top_px + frame.plot_height_px
    out = [line(frame.left_px, base, frame.left_px + frame.plot_width_px, base, "axis")]
    for value in ticks:
        x = frame.left_px + frame.plot_width_px * value / ticks[-1]
        out.append(line(x, frame.top_px, x, base, "grid", stroke="#eee"))
        out.append(text(x, base + 16, tick_text(value), anchor="middle", css="tick"))
    out.append(text(frame.left_px + frame.plot_width_px / 2, base + 34, title, anchor="middle", css="axis-title"))
    return out


def legend(x_px: float, y_px: float, items: list[tuple[str, str]], width_px: float) -> list[str]:
    """Colour swatches with their labels, left to right, wrapping at ``width_px``."""
    out, x, y = [], x_px, y_px
    for label, colour in items:
        span = 18 + 7 * len(label)  # about 7 px per character at 12 px
        if x + span > x_px + width_px and x > x_px:
            x, y = x_px, y + 18
        out.append(rect(x, y - 10, 12, 12, colour, "swatch"))
        out.append(text(x + 16, y, label, css="legend-label"))
        x += span + 12
    return out


SVG_NAMESPACE = "http://www.w3.org/2000/svg"  # the namespace a standalone .svg file must declare (SVG 1.1)


def standalone(figure: str) -> str:
    """An inline figure as the text of an .svg file: XML declaration and namespace."""
    declared = figure.replace("<svg ", f'<svg xmlns="{SVG_NAMESPACE}" ', 1)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + declared + "\n"


def note(frame: Frame, message: str, figure_id: str, title: str) -> str:
    """A figure that says why it has nothing to draw."""
    return svg(frame, [text(frame.width_px / 2, frame.height_px / 2, message, anchor="middle", css="note")],
               title, figure_id)
