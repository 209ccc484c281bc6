"""Hardware names of ingested files: catalog GPUs, ``cpu`` or ``any``; product names as tools print them
(``NVIDIA H100 80GB HBM3``) map through hardware_profiles.device_names."""

from __future__ import annotations

from paraplan.errors import InputError
from paraplan.files import listed, shown
from paraplan.hardware_profiles import gpu_names
from paraplan.hardware_profiles.device_names import catalog_name, looks_like_device_name

CPU = "cpu"
ANY = "any"  # not tied to a GPU: MoE routing statistics depend on the model and data only
# Driver-reported product names map through the catalog's own table (hardware_profiles.device_names).
__all__ = ["ANY", "CPU", "catalog_name", "check_hardware"]


def check_hardware(name: str, path: object) -> str:
    """``name`` if the catalog knows it (or it is ``cpu``); InputError naming the file otherwise."""
    known = gpu_names()
    if name in (CPU, ANY) or name in known:
        return name
    product = catalog_name(name) if looks_like_device_name(name) else None  # 'NVIDIA H100 80GB HBM3'
    if product is not None and product in known:
        return product
    raise InputError(f"{path}: unknown hardware {shown(name, 40)}; use a GPU name from 'paraplan hardware list' "
                     f"({listed(known, 80)}), cpu or any")
