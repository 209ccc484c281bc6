"""A model a job file names: a preset, a local config.json (or its folder) or a Hugging Face repo id.

Repo ids resolve to the preset whose shipped config.json names that repository in its ``_paraplan_source``
(``meta-llama/Llama-3.1-8B`` -> llama-3.1-8b); the last path component alone matches too, so torchtitan's
``./assets/hf/Llama-3.1-8B`` resolves. Nothing is downloaded.
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from pathlib import Path

from paraplan.model_specs.hf_config import preset_names

_REPO = re.compile(r"Hugging Face ([\w.-]+/[\w.-]+)")


@functools.cache
def repo_presets() -> dict[str, str]:
    """Lower-case repo id and repo name -> preset, from the presets' own source notes."""
    table: dict[str, str] = {}
    root = resources.files("paraplan.data") / "models"
    for name in preset_names():
        source = json.loads((root / name / "config.json").read_text()).get("_paraplan_source", "")
        match = _REPO.search(source)
        if match:
            table[match.group(1).lower()] = name
            table[match.group(1).split("/")[-1].lower()] = name
    return table


def resolve_model(reference: str, base: Path) -> str | None:
    """A preset name or config.json path for ``reference`` (relative paths against ``base``), or None."""
    text = reference.strip()
    if text in preset_names():
        return text
    for candidate in (Path(text), base / text):
        if _is_file(candidate) and candidate.name == "config.json":
            return str(candidate)
        if _is_file(candidate / "config.json"):
            return str(candidate / "config.json")
    table = repo_presets()
    key = text.rstrip("/").lower()
    return table.get(key) or table.get(key.split("/")[-1])


def _is_file(path: Path) -> bool:
    """Whether ``path`` is a file; a name the system cannot look up (too long, a NUL byte) names none."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False
