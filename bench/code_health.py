"""How the code reads, in numbers: the share of functions fully annotated, the longest functions, and the size of
each wing (docs/architecture.md), over the package's source folders (tests and bench scripts left out).

A function counts as fully annotated when every parameter but self/cls and its return carry a type.

Run: python bench/code_health.py [--longest N]
"""

from __future__ import annotations

import argparse
import ast
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def wings() -> dict[str, Path]:
    """Each installed package and its folder (pyproject's package-dir)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {package: ROOT / folder for package, folder in config["tool"]["setuptools"]["package-dir"].items()}


def functions(path: Path) -> list[tuple[str, int, int, bool]]:
    """(name, line, length in lines, fully annotated) of every function and method in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            params = [*args.posonlyargs, *args.args, *args.kwonlyargs, *filter(None, (args.vararg, args.kwarg))]
            typed = node.returns is not None and all(
                p.annotation is not None for p in params if p.arg not in ("self", "cls"))
            found.append((node.name, node.lineno, (node.end_lineno or node.lineno) - node.lineno + 1, typed))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--longest", type=int, default=5, help="how many of the longest functions to list")
    longest = parser.parse_args().longest
    total, typed, lines = Counter(), Counter(), Counter()
    every = []
    for package, folder in sorted(wings().items()):
        for path in sorted(folder.glob("*.py")):
            wing = package.split(".")[1] if "." in package else "paraplan"
            lines[wing] += len(path.read_text(encoding="utf-8").splitlines())
            for name, line, length, annotated in functions(path):
                total[wing] += 1
                typed[wing] += annotated
                every.append((length, f"{path.relative_to(ROOT)}:{line} {name}"))
    print(f"{'wing':18} {'lines':>7} {'functions':>9} {'annotated':>9}")
    for wing in sorted(total):
        print(f"{wing:18} {lines[wing]:7,} {total[wing]:9,} {typed[wing] / total[wing]:9.1%}")
    print(f"{'all':18} {sum(lines.values()):7,} {sum(total.values()):9,} "
          f"{sum(typed.values()) / sum(total.values()):9.1%}")
    print(f"longest functions ({sum(1 for length, _ in every if length > 60)} over 60 lines):")
    for length, where in sorted(every, reverse=True)[:longest]:
        print(f"  {length:4} lines  {where}")


if __name__ == "__main__":
    main()
