"""GPU product names as tools print them (``NVIDIA H100 80GB HBM3``) mapped to catalog names.

Patterns are tried in order, so the specific ones (PCIe, 40GB) come before the general ones.
Each maps the device name NVIDIA's driver reports (nvidia-smi, torch.cuda.get_device_name).
"""

from __future__ import annotations

import re

from paraplan.errors import InputError
from paraplan.hardware_profiles import gpu_names

CPU = "cpu"
ANY = "any"  # not tied to a GPU: MoE routing statistics depend on the model and data only
DEVICE_PATTERNS = (
    (r"H100.*PCIe", "h100-pcie"),
    (r"H100|H800 NVL", "h100-sxm"),
    (r"H800", "h800-sxm"),
    (r"H200|GH200", "h200-sxm"),
    (r"A100.*(40GB|PCIE-40)", "a100-sxm-40gb"),
    (r"A100", "a100-sxm-80gb"),
    (r"GB200", "gb200"),
    (r"B200", "b200"),
)


def catalog_name(device_name: str) -> str | None:
    """The catalog GPU for a driver-reported device name, or None when none matches."""
    for pattern, name in DEVICE_PATTERNS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return name
    return None


def check_hardware(name: str, path: object) -> str:
    """``name`` if the catalog knows it (or it is ``cpu``); InputError naming the file otherwise."""
    known = gpu_names()
    if name in (CPU, ANY) or name in known:
        return name
    raise InputError(f"{path}: unknown hardware {name!r}; use a GPU name from 'paraplan hardware list' "
                     f"({', '.join(known)}), cpu or any")
