"""MoE routing statistics (measurements/routing.py's CSV): loads and consecutive-layer co-activation.

Parsed by ``read_routing_csv`` (the one parser of that format) and stored as ``routing`` rows,
not tied to a GPU (hardware ``any`` unless --hardware says otherwise).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from paraplan.measurements.ingest.hardware_names import ANY
from paraplan.measurements.ingest.records import Measurement, Parsed
from paraplan.measurements.routing import read_routing_csv


def parse_routing(path: Path, text: str) -> Parsed:
    """Every load and co-activation count; ``line`` numbers the stored row (the CSV's order is not kept)."""
    del text  # read_routing_csv reads the file itself
    stats = read_routing_csv(path)
    out: list[Measurement] = []
    for (layer, expert), tokens in np.ndenumerate(stats.tokens_per_expert):
        out.append(Measurement(kind="routing", name="load", line=len(out) + 1, time_s=0.0,
                               params={"layer": layer, "expert": expert, "next_expert": -1, "tokens": float(tokens)}))
    if stats.coactivation is not None:
        for (layer, expert, following), tokens in np.ndenumerate(stats.coactivation):
            if tokens:
                out.append(Measurement(kind="routing", name="coactivation", line=len(out) + 1, time_s=0.0,
                                       params={"layer": layer, "expert": expert, "next_expert": following,
                                               "tokens": float(tokens)}))
    return Parsed(measurements=out, hardware=ANY, software="routing statistics (no software versions)")
