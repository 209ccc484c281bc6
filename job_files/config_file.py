"""``--config job.yaml``: a YAML mapping whose keys are the command's options.

``seq-len: 4096`` and ``seq_len: 4096`` both name ``--seq-len``; ``model:`` is the MODEL argument and
``from:`` a job file (relative to the YAML). An unknown key is refused with the closest option.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from paraplan.errors import InputError
from paraplan.files import read_user_text, shown
from paraplan.hardware_profiles.yaml_schema import parse_yaml
from paraplan.job_files.bridge import yaml_lines

MAX_CONFIG_BYTES = 1024 * 1024
"""A job.yaml holds a few dozen options."""


def read_option_file(path: Path, options: Iterable[str], aliases: dict[str, str] | None = None
                     ) -> dict[str, tuple[Any, str]]:
    """Parameter name -> (YAML value, ``file:line``). ``options`` are the parameter names the command takes
    (underscores); ``aliases`` map option spellings that differ from them (``json`` -> ``json_path``)."""
    path = Path(path)
    text = read_user_text(path, MAX_CONFIG_BYTES, "job options file")
    data = parse_yaml(text, str(path))
    lines = yaml_lines(text)
    known = set(options)
    aliases = aliases or {}
    out: dict[str, tuple[Any, str]] = {}
    for key, value in data.items():
        name = str(key).lstrip("-").replace("-", "_")
        name = aliases.get(name, name)
        where = f"{path}:{lines.get(str(key), 0)}"
        if name not in known:
            spelled = sorted({o.replace("_", "-") for o in known} | {a.replace("_", "-") for a in aliases})
            close = difflib.get_close_matches(str(key).replace("_", "-"), spelled, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]}?" if close else " (the keys are the command's options: see --help)"
            raise InputError(f"{where}: unknown option {shown(key)}{hint}")
        if isinstance(value, str) and not Path(value).is_absolute() and _exists(path.parent / value):
            value = str(path.parent / value)  # a file named relative to the YAML
        out[name] = (value, where)
    return out


def _exists(path: Path) -> bool:
    """Whether ``path`` names an existing file or folder; a name the system cannot even look up (too long,
    a NUL byte) names none."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False
