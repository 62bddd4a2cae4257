"""The import graph of ``tuner/``: no module imports itself back through others, and the engine
never imports the tuner, Optuna or MLflow."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support import find_cycle

ROOT = Path(__file__).resolve().parents[2]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _typing_only(tree: ast.Module) -> set[int]:
    """Ids of the import nodes under ``if TYPE_CHECKING:`` (annotations only: never run)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def import_graph(package: str) -> dict[str, set[str]]:
    """``module -> modules of package it imports`` (module-level and function-level imports alike;
    imports under ``if TYPE_CHECKING:`` are for annotations and never run, so they are left out)."""
    modules = {_module_name(p): p for p in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        typing_only = _typing_only(tree)
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            for target in targets:
                if target in modules and target != name:
                    graph[name].add(target)
    return graph


def test_find_cycle_sees_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


@pytest.mark.parametrize("package", ["tuner", "lazyllm"])
def test_no_import_cycle(package: str) -> None:
    cycle = find_cycle(import_graph(package))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_engine_never_imports_the_tuner() -> None:
    for path in (ROOT / "lazyllm").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                top = name.split(".")[0]
                assert top not in {"tuner", "optuna"}, f"{path.relative_to(ROOT)} imports {name}"
