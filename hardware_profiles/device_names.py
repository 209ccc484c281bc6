"""GPU names as drivers print them (``nvidia-smi``, ``torch.cuda.get_device_name``, ``rocm-smi``) mapped
to catalog names: "NVIDIA H100 80GB HBM3" is h100-sxm.

Patterns are tried in order, the specific ones (form factor, memory size) before the general ones. A name
that matches a family but not one product ("NVIDIA H100") is ambiguous: :func:`device_candidates` lists
the catalog GPUs it could be, and callers refuse it naming them. A product the catalog lacks (an A100
PCIe, a 144 GB GH200) matches nothing rather than a neighbour with other numbers.
"""

from __future__ import annotations

import re

# (pattern, catalog name); None = a known product the catalog does not hold.
DEVICE_PATTERNS: tuple[tuple[str, str | None], ...] = (
    (r"\bGH200\b.*\b96\s*GB", "gh200-96gb"),
    (r"\bGH200\b", None),
    (r"\bGB300\b", "gb300"),
    (r"\bGB200\b", "gb200"),
    (r"\bB300\b", "b300"),
    (r"\bB200\b", "b200"),
    (r"\bH200\b.*\bNVL\b", None),
    (r"\bH200\b", "h200-sxm"),
    (r"\bH100\b.*\bPCIe\b", "h100-pcie"),
    (r"\bH100\b.*\bNVL\b", "h100-nvl"),
    (r"\bH800\b.*\bNVL\b", "h100-nvl"),
    (r"\bH100\b.*\b96\s*GB", "h100-sxm-96gb"),
    (r"\bH100\b.*\b(80\s*GB|SXM)", "h100-sxm"),
    (r"\bH800\b.*\bPCIe\b", None),
    (r"\bH800\b", "h800-sxm"),
    (r"\bH20\b", "h20"),
    (r"\bA100\b.*PCIE", None),
    (r"\bA100\b.*40\s*GB", "a100-sxm-40gb"),
    (r"\bA100\b.*80\s*GB", "a100-sxm-80gb"),
    (r"\bL40S\b", "l40s"),
    (r"\bMI325X\b", "mi325x"),
    (r"\bMI300X\b", "mi300x"),
    (r"\bMI250X?\b", "mi250x-gcd"),
)
# A family named without the product detail that tells its catalog entries apart.
FAMILIES = {r"\bH100\b": ("h100-sxm", "h100-sxm-96gb", "h100-pcie", "h100-nvl"),
            r"\bA100\b": ("a100-sxm-40gb", "a100-sxm-80gb")}


def looks_like_device_name(name: str) -> bool:
    """A driver's product string rather than a catalog name (those are lower-case, without spaces)."""
    return bool(re.search(r"\s", name.strip())) or name.strip().upper().startswith(("NVIDIA", "AMD"))


def device_match(device_name: str) -> tuple[bool, str | None]:
    """(whether a product pattern matched, its catalog name: None where the catalog lacks that product)."""
    for pattern, name in DEVICE_PATTERNS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return True, name
    return False, None


def catalog_name(device_name: str) -> str | None:
    """The catalog GPU of a driver-reported product name, or None (unknown, not in the catalog, or ambiguous)."""
    return device_match(device_name)[1]


def device_candidates(device_name: str) -> tuple[str, ...]:
    """Catalog GPUs an ambiguous product name could be ("NVIDIA H100": the four H100s); () if none."""
    for pattern, names in FAMILIES.items():
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return names
    return ()
