"""A user hardware file: GPUs and cluster types the built-in catalog lacks, in the catalog's own schema.

    schema_version: 1                   # optional
    gpus:
      h100-sxm-site:                    # a new name: a user entry never replaces a built-in one
        efficiency_from: h100-sxm       # optional; see below
        <every key of a gpus.yaml entry: display_name, vendor, architecture, dense_tflops, hbm_gib, ...,
         sources (one citation per number)>
    clusters:
      site-h100:                        # the keys of a clusters.yaml entry; gpu may name a GPU above
        gpu: h100-sxm-site
        ...

Efficiency (how close kernels get to the datasheet) cannot be read off a datasheet, so a user GPU borrows
the constants of a built-in GPU: the one ``efficiency_from`` names, else the built-in GPU efficiency.yaml's
``architecture_bases`` lists for the entry's ``architecture`` (hopper -> h100-sxm, ...), else
efficiency.yaml's defaults. The GPUSpec records whose constants it uses; plans and ``hardware show`` say so.

Everything is validated as the built-in files are (unknown or missing keys, types, units, ranges) and
every problem is one InputError naming the file and the key.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from paraplan.errors import InputError
from paraplan.files import MAX_YAML_BYTES, listed, one_line, read_user_yaml, shown
from paraplan.hardware_profiles.catalog import (
    DEFAULT_EFFICIENCY,
    Catalog,
    architecture_bases,
    builtin_catalog,
    cluster_from_entry,
    default_efficiency,
    fitted,
    gpu_from_entry,
)
from paraplan.hardware_profiles.specs import BUILTIN, EfficiencySpec, GPUSpec
from paraplan.hardware_profiles.yaml_schema import check_keys, text

HARDWARE_ENV = "PARAPLAN_HARDWARE"
"""Environment variable holding the path of a default user hardware file (used when --hardware is absent)."""
MAX_FILE_BYTES = MAX_YAML_BYTES
"""A hardware file describes a few parts; 256 KiB (9x the whole built-in gpus.yaml) is far beyond any real one
and bounds what a typo (pointing at a model checkpoint, say) can cost."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
_TOP_KEYS = ("schema_version", "gpus", "clusters")


def hardware_path(option: Path | None, environ: dict[str, str] | None = None) -> Path | None:
    """The user hardware file to use: ``option`` (--hardware), else ``$PARAPLAN_HARDWARE``, else none."""
    if option is not None:
        return option
    value = (os.environ if environ is None else environ).get(HARDWARE_ENV, "").strip()
    return Path(value) if value else None


def resolve_catalog(option: Path | None, environ: dict[str, str] | None = None) -> Catalog:
    """The built-in catalog with the user hardware file of ``hardware_path`` merged in, if any."""
    path = hardware_path(option, environ)
    if path is None:
        return builtin_catalog()
    via_env = option is None
    try:
        return load_user_catalog(path)
    except InputError as exc:
        if via_env:
            raise InputError(f"{exc} (file from ${HARDWARE_ENV})") from None
        raise


def load_user_catalog(path: Path) -> Catalog:
    """The built-in catalog plus the GPUs and clusters of the user hardware file at ``path``; InputError of at most
    MAX_MESSAGE_CHARS (the file, an entry's name and a key can fill a line before the problem)."""
    try:
        return _load_user_catalog(path)
    except InputError as exc:
        raise fitted(exc) from None


def _load_user_catalog(path: Path) -> Catalog:
    data = read_user_yaml(path, "hardware file", MAX_FILE_BYTES)
    check_keys(data, str(path), (), _TOP_KEYS)
    if data.get("schema_version", 1) != 1:
        raise InputError(f"{path}: schema_version: expected 1, got {shown(data['schema_version'])}")
    gpus_in = _section(data, "gpus", path)
    clusters_in = _section(data, "clusters", path)
    if not gpus_in and not clusters_in:
        raise InputError(f"{path}: holds no entries; add a 'gpus:' or 'clusters:' mapping (see "
                         "docs/hardware.md)")
    builtin = builtin_catalog()
    for section, names in (("gpus", gpus_in), ("clusters", clusters_in)):
        for name in names:
            _check_name(name, f"{path}: {section}", builtin)
    clash = sorted(set(gpus_in) & set(clusters_in), key=str)
    if clash:
        raise InputError(f"{path}: {shown(clash[0])} names both a GPU and a cluster; give them distinct names")
    gpus = dict(builtin.gpus)
    for name, entry in gpus_in.items():
        gpus[name] = user_gpu(name, entry, path)
    merged = Catalog(gpus=gpus, clusters={**builtin.clusters, **clusters_in},
                     cluster_origins={**builtin.cluster_origins, **dict.fromkeys(clusters_in, str(path))},
                     user_file=str(path))
    for name, entry in clusters_in.items():
        cluster_from_entry(name, entry, f"{path}: clusters.{one_line(name, 32)}", 1, merged)  # validate now
    return merged


def user_gpu(name: str, entry: Any, path: Path) -> GPUSpec:
    """One user GPU entry as a GPUSpec whose efficiency is borrowed as the module docstring says."""
    where = f"{path}: gpus.{one_line(name, 32)}"
    if not isinstance(entry, dict):
        raise InputError(f"{where}: expected a mapping of the gpus.yaml keys, got {type(entry).__name__}")
    efficiency, efficiency_from = _borrowed_efficiency(entry, where)
    return gpu_from_entry(name, entry, where, efficiency=efficiency, efficiency_from=efficiency_from,
                          origin=str(path), extra_keys=("efficiency_from",))


def _borrowed_efficiency(entry: dict[str, Any], where: str) -> tuple[EfficiencySpec, str]:
    builtin = builtin_catalog()
    if "efficiency_from" in entry:
        base = text(entry["efficiency_from"], f"{where}.efficiency_from")
        if base == DEFAULT_EFFICIENCY:
            return default_efficiency(), DEFAULT_EFFICIENCY
        if base not in builtin.gpus:
            raise InputError(f"{where}.efficiency_from: {shown(base, 40)} is not a built-in GPU; name one of "
                             f"{listed(sorted(builtin.gpus), 80)} ('paraplan hardware list') or '{DEFAULT_EFFICIENCY}'")
        return _lent(builtin.gpus[base])
    architecture = entry.get("architecture")
    family = architecture_bases().get(architecture.lower()) if isinstance(architecture, str) else None
    if family is None:
        return default_efficiency(), DEFAULT_EFFICIENCY
    return _lent(builtin.gpus[family])


def _lent(base: GPUSpec) -> tuple[EfficiencySpec, str]:
    """``base``'s efficiency constants as a user GPU uses them (what was fitted to ``base`` is borrowed from it), and
    whose they are."""
    return base.efficiency.borrowed_as(base.efficiency_from), base.efficiency_from


def _section(data: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    section = data.get(key)
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise InputError(f"{path}: {key}: expected a mapping of name -> entry, got {type(section).__name__}")
    return section


def _check_name(name: Any, where: str, builtin: Catalog) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InputError(f"{where}: {shown(name, 40)} is not a usable name (letters, digits, '.', '_', '+', '-'; "
                         "at most 64 characters, starting with a letter or digit)")
    if name in builtin.gpus or name in builtin.clusters:
        kind = "GPU" if name in builtin.gpus else "cluster"
        raise InputError(f"{where}.{name}: {name!r} is a built-in {kind}; a user entry never replaces a built-in "
                         f"one, so give yours a distinct name (e.g. {name}-site)")


def origin_text(gpu: GPUSpec) -> str:
    """One line for plans and tables: where ``gpu`` comes from and whose efficiency constants it uses."""
    borrowed = "efficiency.yaml defaults" if gpu.efficiency_from == DEFAULT_EFFICIENCY else \
        f"{gpu.efficiency_from}'s efficiency constants"
    if gpu.origin == BUILTIN:
        return f"GPU {gpu.name}: built-in catalog, {borrowed}"
    return f"GPU {gpu.name}: user hardware file {gpu.origin}, {borrowed} (borrowed; not fitted to this GPU)"
