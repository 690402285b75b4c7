"""The package layering, read from the source with ast (nothing imported): the control plane
(orchestrator/) never imports the recipes (pipelines/), the actors import neither, and no modules
import each other, directly or round a longer circle. Imports inside functions count too: a lazy
import is still a dependency."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("actors", "orchestrator", "pipelines")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules `path` imports (`from a import b` names a.b where that is a module)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:  # a.b.func -> a.b
                name = name.rpartition(".")[0]
            # `a.b` importing its own package `a` is no circle: importing a.b runs a/__init__ first
            # anyway (a package that registers its submodules' plug-ins, e.g. actors.rewards)
            if name and name != me and not me.startswith(name + "."):
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {module_name(p) for p in files}
    return {module_name(p): imports(p, modules) for p in files}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def crossing(edges: dict[str, set[str]], src: str, dst: str) -> list[str]:
    return sorted(f"{a} -> {b}" for a, deps in edges.items() if a.split(".")[0] == src
                  for b in deps if b.split(".")[0] == dst)


@pytest.mark.parametrize("src,dst", [("orchestrator", "pipelines"), ("actors", "orchestrator"), ("actors", "pipelines")])
def test_no_import_against_the_layering(src: str, dst: str) -> None:
    assert crossing(graph(), src, dst) == []


def test_no_modules_import_each_other() -> None:
    assert cycles(graph()) == []


def test_the_checks_see_a_circle_and_a_lazy_import(tmp_path: Path) -> None:
    """The walker itself: an import inside a function is found, and a circle of three is reported."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    (tmp_path / "m.py").write_text("def f():\n    from orchestrator.run import Run\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert imports(tmp_path / "m.py", {"orchestrator.run", "orchestrator"}) == {"orchestrator.run"}
    finally:
        ROOT = saved
