"""The house's shape: every import points down the layers (docs/architecture.md), no import cycle hides anywhere
(function-level imports included), and no function outside the tests runs past 60 lines. Beside the source tree the
modules are read where pyproject's package-dir lays them out (so the check needs no install); an installed copy of the
tests reads them where the import system finds them."""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

LAYERS: tuple[tuple[tuple[str, ...], ...], ...] = (
    (("paraplan.cli", "paraplan.__main__"),),
    (("paraplan.exporters",),),
    (("paraplan", "paraplan.api", "paraplan.serving_api", "paraplan.request"),),
    (("paraplan.validation",),),
    (("paraplan.planner",),),
    (("paraplan.cost_models",),),
    (("paraplan.measurements",), ("paraplan.job_files",)),
    (("paraplan.model_specs",), ("paraplan.hardware_profiles",)),
    (("paraplan.files", "paraplan.errors", "paraplan.limits", "paraplan.version", "paraplan.choices",
      "paraplan.arrays", "paraplan.data"),),
)
"""Layers top to bottom, each a tuple of wings, each wing the modules (and packages) it holds. A module imports its
own wing and the wings of lower layers; wings that share a layer do not import each other. ``paraplan`` names the
package's own ``__init__`` only (the library face), not everything below it."""
MAX_FUNCTION_LINES = 60
"""CONVENTIONS.md: 'a 60-line function is a question to ask'; here it is a rule, tests aside."""


PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


@cache
def modules() -> dict[str, Path]:
    """Every module of the package and its source file."""
    source = _source_modules()
    return source if source is not None else _installed_modules()


def _source_modules() -> dict[str, Path] | None:
    """The modules pyproject installs, from their folders in the source tree; None without one (or without
    tomllib, Python 3.11+)."""
    if not PYPROJECT.is_file():
        return None
    try:
        import tomllib
    except ModuleNotFoundError:
        return None
    folders = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["package-dir"]
    found = {}
    for package, folder in folders.items():
        for path in sorted((PYPROJECT.parent / folder).glob("*.py")):
            found[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return found


def _installed_modules() -> dict[str, Path]:
    """The installed package's modules, each wing found through the import system and walked."""
    import paraplan

    found = {"paraplan": Path(paraplan.__file__)}
    roots = [name for layer in LAYERS for wing in layer for name in wing if name != "paraplan"]
    for root in roots:
        spec = importlib.util.find_spec(root)
        assert spec is not None and spec.origin is not None, root
        found[root] = Path(spec.origin)
        if spec.submodule_search_locations:
            for info in pkgutil.walk_packages(spec.submodule_search_locations, root + "."):
                sub = importlib.util.find_spec(info.name)
                assert sub is not None and sub.origin is not None, info.name
                found[info.name] = Path(sub.origin)
    return found


def _holds(prefix: str, module: str) -> bool:
    return module == prefix or (prefix != "paraplan" and module.startswith(prefix + "."))


def wing_of(module: str) -> tuple[str, ...]:
    """The wing holding a module (the one whose longest prefix matches)."""
    matches = [(len(prefix), wing) for layer in LAYERS for wing in layer for prefix in wing if _holds(prefix, module)]
    assert matches, f"{module} is in no wing of LAYERS"
    return max(matches)[1]


def layer_of(wing: tuple[str, ...]) -> int:
    return next(i for i, layer in enumerate(LAYERS) if wing in layer)


def imports_of(module: str) -> Iterator[tuple[str, int]]:
    """(imported paraplan module, line) for every import in the module's source, at any depth."""
    path = modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return imports_in(path.read_text(encoding="utf-8"), package, set(modules()))


def imports_in(source: str, package: str, known: set[str]) -> Iterator[tuple[str, int]]:
    """(imported paraplan module, line) of ``source`` in ``package``: ``from X import y`` names module X.y where
    ``known`` holds it, else X; relative imports resolved against ``package``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names if alias.name.startswith("paraplan"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            if not base.startswith("paraplan"):
                continue
            for alias in node.names:
                target = f"{base}.{alias.name}"
                yield (target if target in known else base), node.lineno


@cache
def graph() -> dict[str, set[str]]:
    return {module: {target for target, _ in imports_of(module) if target != module} for module in modules()}


def test_the_layers_name_every_module():
    assert len(modules()) > 150
    for module in modules():
        wing_of(module)  # raises for a module in no wing


def test_the_layers_name_every_package_pyproject_installs():
    if not PYPROJECT.is_file():
        pytest.skip("no source tree beside the tests (an installed copy)")
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    packages = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["packages"]
    placed = [name for layer in LAYERS for wing in layer for name in wing]
    assert [p for p in packages if not any(_holds(name, p) for name in placed)] == []


def test_every_import_points_down():
    upward = []
    for module in modules():
        wing = wing_of(module)
        for target, line in imports_of(module):
            other = wing_of(target)
            if other != wing and layer_of(other) <= layer_of(wing):
                upward.append(f"{modules()[module].name}:{line} {module} -> {target}")
    assert upward == []


def test_no_import_cycle():
    """Tarjan's strongly connected components of the module graph: every one must be a single module."""
    edges, index, low, stack, on_stack, cycles = graph(), {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in edges:
        if node not in index:
            visit(node)
    assert cycles == []


def test_the_checks_catch_what_they_guard():
    """The import reader sees function-level and relative imports, and the rule refuses an upward one."""
    source = ("import os\ndef f():\n    from paraplan.cli import app\n    from . import choices\n"
              "    from ..request import make_request\n    import paraplan.errors\n")
    known = {"paraplan.cli.app", "paraplan.cost_models.choices"}
    assert list(imports_in(source, "paraplan.cost_models", known)) == [
        ("paraplan.cli.app", 3), ("paraplan.cost_models.choices", 4), ("paraplan.request", 5),
        ("paraplan.errors", 6)]
    assert layer_of(wing_of("paraplan.cli.app")) < layer_of(wing_of("paraplan.planner.search"))
    assert wing_of("paraplan.planner.serving.rank") == ("paraplan.planner",)
    assert wing_of("paraplan.errors") == wing_of("paraplan.version") == LAYERS[-1][0]
    assert wing_of("paraplan.request") == wing_of("paraplan") == LAYERS[2][0]
    assert layer_of(wing_of("paraplan.job_files.shell")) == layer_of(wing_of("paraplan.measurements.store"))
    assert wing_of("paraplan.job_files.shell") != wing_of("paraplan.measurements.store")


def _functions(module: str) -> Iterator[tuple[str, int, int]]:
    tree = ast.parse(modules()[module].read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, (node.end_lineno or node.lineno) - node.lineno + 1


def test_no_function_runs_past_sixty_lines():
    long = [f"{modules()[m]}:{line} {name} ({length} lines)" for m in modules() for name, line, length in _functions(m)
            if length > MAX_FUNCTION_LINES]
    assert long == []


@pytest.mark.parametrize("module", ["paraplan.cli.app", "paraplan.planner.search", "paraplan.api"])
def test_the_reader_finds_known_imports(module):
    assert graph()[module], module
