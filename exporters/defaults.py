"""The export formats' names and the defaults an export starts from: what the command line shows in its help before
any exporter loads (formats.py builds the files)."""

from __future__ import annotations

from paraplan.choices import ENGINES

FORMATS = (*ENGINES, "slurm", "k8s", "json", "all")
DEFAULT_IMAGE = "nvcr.io/nvidia/pytorch:25.01-py3"
