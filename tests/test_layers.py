"""Layers point one way: hardware_profiles -> cost_models -> planner -> exporters -> cli (CONVENTIONS rule 1).

Parses every module with ``ast`` (nothing is imported), resolves relative imports, and checks
that no layer imports a higher one and that only cli/ touches typer or rich.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
LAYERS = ("hardware_profiles", "cost_models", "planner", "exporters", "cli")
UI_LIBRARIES = ("typer", "rich", "click")


def _module_name(layer: str, path: Path) -> str:
    parts = list(path.relative_to(ROOT / layer).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["paraplan", layer, *parts])


def _imports(layer: str, path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports (``from a import b`` counts a and a.b)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(layer, path)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _files(layer: str) -> list[Path]:
    return sorted((ROOT / layer).rglob("*.py"))


def _layer_of(name: str) -> str | None:
    parts = name.split(".")
    if len(parts) >= 2 and parts[0] == "paraplan" and parts[1] in LAYERS:
        return parts[1]
    return None


def test_every_layer_has_modules():
    for layer in LAYERS:
        assert _files(layer), f"no modules under {layer}/"
    assert len(_files("cost_models")) > 5 and len(_files("planner")) > 5


def test_relative_import_resolution():
    assert _module_name("planner", ROOT / "planner" / "search.py") == "paraplan.planner.search"
    assert _module_name("planner", ROOT / "planner" / "__init__.py") == "paraplan.planner"


@pytest.mark.parametrize("index, layer", list(enumerate(LAYERS)))
def test_no_layer_imports_a_higher_one(index, layer):
    higher = set(LAYERS[index + 1 :])
    offences = []
    for path in _files(layer):
        for name in sorted(_imports(layer, path)):
            target = _layer_of(name)
            if target in higher:
                offences.append(f"{path.relative_to(ROOT)} imports {name}")
            # Importing the top package's cli through an attribute (from paraplan import cli) counts too.
            if name in {f"paraplan.{h}" for h in higher}:
                offences.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offences, "\n".join(sorted(set(offences)))


@pytest.mark.parametrize("layer", LAYERS[:-1])
def test_only_cli_imports_ui_libraries(layer):
    offences = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _files(layer)
        for name in _imports(layer, path)
        if name.split(".")[0] in UI_LIBRARIES
    ]
    assert not offences, "\n".join(offences)


@pytest.mark.parametrize("layer", LAYERS[:-1])
def test_only_cli_prints(layer):
    offences = []
    for path in _files(layer):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                offences.append(f"{path.relative_to(ROOT)}:{node.lineno} calls print()")
    assert not offences, "\n".join(offences)


def test_the_checker_sees_a_violation(tmp_path):
    """The import collector is not vacuous: it finds absolute, relative and from-package imports."""
    layer_dir = tmp_path / "cost_models"
    layer_dir.mkdir()
    module = layer_dir / "bad.py"
    module.write_text(
        "import rich\nfrom paraplan.planner.search import search\nfrom ..cli import app\nfrom paraplan import planner\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        names = _imports("cost_models", module)
    finally:
        ROOT = saved
    assert "rich" in names
    assert "paraplan.planner.search" in names
    assert "paraplan.cli.app" in names
    assert "paraplan.planner" in names
