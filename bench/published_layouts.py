"""Where the search ranks the layouts that published runs used (data/reference_runs.csv).

For each distinct published configuration: the predicted step of the published layout over the best
layout the search finds for the same job, with ZeRO, recompute, offload and expert overlap held at the
published plan's (planner.reference.published_layout_gap). A ratio of 1.00 means the search's best is the
published layout or ties it; 1.25 means the search believes a layout 25% faster exists. Dense and MoE runs
are summarised apart: MoE step time at scale is issue 16's open work.

Run: python bench/published_layouts.py [--all]   (--all prints every row, not only those beyond 10%)
"""

from __future__ import annotations

import sys
import time

import numpy as np

from paraplan.validation.reference import distinct_published, load_reference_runs, published_layout_gap


def main() -> None:
    show_all = "--all" in sys.argv
    start, cache, gaps = time.perf_counter(), {}, []
    for _, row in distinct_published(load_reference_runs()).iterrows():
        gap = published_layout_gap(row, cache)
        if gap is None:
            print(f"{row['id']:22} published configuration does not fit")
            continue
        gaps.append(gap)
        if show_all or gap.ratio > 1.10:
            print(f"{gap.run_id:22} {'MoE' if gap.moe else 'dense':5} published/best {gap.ratio:5.2f}  "
                  f"best: {gap.best}")
    for label, group in (("dense", [g for g in gaps if not g.moe]), ("MoE", [g for g in gaps if g.moe])):
        ratios = np.array([g.ratio for g in group])
        print(f"{label}: {len(ratios)} published layouts; published/best median {np.median(ratios):.3f}, "
              f"90th percentile {np.quantile(ratios, 0.9):.3f}, max {ratios.max():.2f}; within 10% of the best: "
              f"{np.mean(ratios <= 1.10):.0%}, within 25%: {np.mean(ratios <= 1.25):.0%}")
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
