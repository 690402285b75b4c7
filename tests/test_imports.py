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
            # `a.b` importing its own package `a` counts: a package whose __init__ imported its plug-ins
            # (which import it back for its registry) would be a circle (a registry imports its
            # built-ins on first lookup instead: actors.registry.Registry's plugins)
            if name and name != me:
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


# ---- the actors know no recipe: they get their options as typed arguments -------------------------
LEARNER_MODULES = ("actors/objectives/*.py", "actors/learner.py", "actors/trainable.py")


def recipe_sections() -> set[str]:
    """Config sections that belong to a recipe or one of its stages (ppo, prime, laser, judge, ...),
    not to every run (orchestrator.config.Config)."""
    from orchestrator.config import Config
    from orchestrator.recipes import RECIPES
    from orchestrator.settings import sections_of

    return {key for name in RECIPES.names() for key in sections_of(RECIPES.get(name), Config.model_fields)}


def _names_config(node: ast.expr) -> bool:
    """`config`, `cfg`, `self.config`, `learner.config`, `lrn.config` ..."""
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return "config" in name.lower() or name == "cfg"


def section_reads(path: Path, sections: set[str]) -> list[str]:
    """Where `path` reads a recipe section off a config: `config.ppo`, `getattr(lrn.config, "prime")`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in sections and _names_config(node.value):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and node.args[1].value in sections and _names_config(node.args[0])):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return sorted(found)


def test_no_objective_or_learner_module_reads_a_recipe_section() -> None:
    sections = recipe_sections()
    assert {"ppo", "prime", "laser", "judge", "spark", "dph", "spc"} <= sections  # the check sees them
    files = sorted({p for pattern in LEARNER_MODULES for p in ROOT.glob(pattern)})
    assert len(files) > 5
    assert [hit for p in files for hit in section_reads(p, sections)] == []


def test_no_actor_module_reads_a_recipe_section() -> None:
    """Generators get their judging and LaSeR settings as role arguments (JudgingSpec, LaserSpec),
    PRIME's PRM its beta and labels, a reward model's learner its RewardModelSpec and its scorer the
    template; no module under actors/ reads config.judge, .spark, .laser, .prime, .reward_model ..."""
    sections = recipe_sections()
    files = sorted((ROOT / "actors").rglob("*.py"))
    assert {"generator.py", "prm_learner.py", "reward_learner.py", "reward_model.py"} <= {p.name for p in files}
    assert [hit for p in files for hit in section_reads(p, sections)] == []


def test_the_section_check_sees_a_read(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("def f(lrn, config, model):\n"
                                   "    a = lrn.config.ppo.gamma\n"
                                   "    b = getattr(lrn.config, 'prime', None)\n"
                                   "    c = config.label_source(config.laser)\n"
                                   "    return config.algorithm.lr + model.config.hidden_size + config.seed\n")
    assert sorted(section_reads(tmp_path / "m.py", {"ppo", "prime", "laser"})) == [
        "m.py:2: lrn.config.ppo", "m.py:3: getattr(lrn.config, 'prime', None)", "m.py:4: config.laser"]


def recipe_name_lists(path: Path, names: set[str]) -> list[str]:
    """Literal collections (a dict's keys, a list, tuple or set) in `path` that name two or more recipes."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        items = node.keys if isinstance(node, ast.Dict) else node.elts if isinstance(node, (ast.List, ast.Tuple, ast.Set)) else []
        named = [i.value for i in items if isinstance(i, ast.Constant) and i.value in names]
        if len(named) >= 2:
            found.append(f"{path.name}:{node.lineno}: {', '.join(named)}")
    return found


def recipe_names() -> set[str]:
    from pipelines import BUILT_IN

    return set(BUILT_IN) | {p.stem for p in (ROOT / "pipelines").glob("*.yaml")}


def test_no_list_of_recipe_names_outside_pipelines() -> None:
    """Recipes register themselves in pipelines/; the control plane and the actors list none (a new
    recipe is one file in pipelines/, never an edit elsewhere)."""
    names = recipe_names()
    assert {"grpo", "ppo", "grpo_addition", "dapo"} <= names
    files = [p for pkg in ("actors", "orchestrator") for p in (ROOT / pkg).rglob("*.py")]
    assert [hit for p in files for hit in recipe_name_lists(p, names)] == []


def test_the_recipe_list_check_sees_a_list(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("A = {'grpo': 1, 'ppo': 2}\nB = ('grpo', 'x')\nC = ['spark', 'laser']\n")
    assert recipe_name_lists(tmp_path / "m.py", {"grpo", "ppo", "spark", "laser"}) == ["m.py:1: grpo, ppo", "m.py:3: spark, laser"]


def test_the_sandbox_is_reached_through_its_interface() -> None:
    """The kernel-confined runner is a package of its own (actors/sandbox/): the code verifier, the
    Python tool and the verifier import its interface (actors/sandbox/__init__.py), never a module
    behind it, and every name of that interface resolves."""
    import actors.sandbox

    edges = graph()
    assert "actors.sandbox.pool" in edges and "actors.sandbox.child" in edges
    assert crossing_into(edges, "actors.sandbox") == []
    assert all(getattr(actors.sandbox, name) is not None for name in actors.sandbox.__all__)
    with pytest.raises(AttributeError, match="its interface"):
        actors.sandbox.nothing_here  # noqa: B018


def crossing_into(edges: dict[str, set[str]], package: str) -> list[str]:
    """Imports of a module inside `package` from a module outside it."""
    inside = package + "."
    return sorted(f"{a} -> {b}" for a, deps in edges.items() if not (a == package or a.startswith(inside))
                  for b in deps if b.startswith(inside))
