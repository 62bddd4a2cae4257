"""The house as docs/architecture.md draws it: every import in ``lazyllm/`` and ``tuner/`` points down its
floors (or stays on its floor), no circle (imports under ``if TYPE_CHECKING:`` count: a type-only
circle is a circle in the text), and every module has its line in the file map.

The floors are written once, in docs/architecture.md's ``floors`` blocks; this test reads them there.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support import find_cycle

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("lazyllm", "tuner")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(package: str) -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / package).rglob("*.py"))}


def import_graph(package: str) -> dict[str, set[str]]:
    """``module -> modules of package it names in an import``, every import statement counted (module
    level, in functions, under ``TYPE_CHECKING``)."""
    known = modules(package)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            graph[name] |= {t for t in targets if t in known and t != name}
    return graph


def floors(package: str, text: str | None = None) -> list[list[str]]:
    """The floors of ``package`` from the ```` ```floors ```` block that names it, top floor first. A
    line is one floor: module names, then ``#`` and what the floor is. ``a.b.*`` is the package ``a.b``
    and everything in it; a plain name is that module alone."""
    text = DOC.read_text() if text is None else text
    for block in re.findall(r"```floors\n(.*?)```", text, flags=re.S):
        rows = [line.split("#")[0].split() for line in block.splitlines()]
        rows = [row for row in rows if row]
        if rows and rows[0][0].split(".")[0] == package:
            return rows
    raise AssertionError(f"docs/architecture.md has no floors block for {package}")


def floor_of(module: str, levels: list[list[str]]) -> int | None:
    """The floor that names ``module`` most exactly (a module's own name beats its package's ``.*``)."""
    best: tuple[int, int] | None = None
    for index, level in enumerate(levels):
        for entry in level:
            prefix = entry.removesuffix(".*")
            hit = module == prefix or (entry.endswith(".*") and module.startswith(prefix + "."))
            if hit and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return None if best is None else best[0]


def upward(package: str, graph: dict[str, set[str]], levels: list[list[str]]) -> list[str]:
    out = []
    for module in sorted(graph):
        here = floor_of(module, levels)
        for target in sorted(graph[module]):
            there = floor_of(target, levels)
            if here is not None and there is not None and there < here:
                out.append(f"{module} (floor {here + 1}) imports {target} (floor {there + 1})")
    return out


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_sits_on_a_floor(package: str) -> None:
    levels = floors(package)
    missing = [m for m in modules(package) if floor_of(m, levels) is None]
    assert not missing, f"modules on no floor of docs/architecture.md: {missing}"


@pytest.mark.parametrize("package", PACKAGES)
def test_every_import_points_down(package: str) -> None:
    bad = upward(package, import_graph(package), floors(package))
    assert not bad, "imports that point up:\n" + "\n".join(bad)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_circle_not_even_for_types(package: str) -> None:
    cycle = find_cycle(import_graph(package))
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_has_its_line_in_the_file_map(package: str) -> None:
    text = DOC.read_text()
    missing = [
        str(p.relative_to(ROOT)) for p in modules(package).values() if f"`{p.relative_to(ROOT)}`" not in text
    ]
    assert not missing, f"docs/architecture.md's file map lacks: {missing}"


def test_the_checks_see_an_upward_import_and_an_unplaced_module() -> None:
    text = "```floors\npkg.top  # commands\npkg.low.*  # the bottom\n```\n"
    levels = floors("pkg", text)
    assert levels == [["pkg.top"], ["pkg.low.*"]]
    graph = {"pkg.low.a": {"pkg.top"}, "pkg.top": {"pkg.low.a"}, "pkg.other": set()}
    assert upward("pkg", graph, levels) == ["pkg.low.a (floor 2) imports pkg.top (floor 1)"]
    assert floor_of("pkg.other", levels) is None
    assert floor_of("pkg.low", levels) == 1 and floor_of("pkg.lowest", levels) is None
