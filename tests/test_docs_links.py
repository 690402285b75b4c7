"""README.md and docs/*.md: every relative link and image resolves, to a file and, with a #fragment,
to a heading there (GitHub's anchors); the README keeps CI's commands and lists every recipe.

Markdown is parsed with markdown-it-py (rich depends on it), so links inside code are not links.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # https:, mailto:, ...


def _parse(text: str) -> list:
    return MarkdownIt("commonmark").enable("table").parse(text)


def github_anchor(heading: str) -> str:
    """GitHub's heading id: lower case, punctuation dropped (`_` and `-` kept), spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    tokens = _parse(text)
    for opening, inline in zip(tokens, tokens[1:]):
        if opening.type != "heading_open":
            continue
        words = "".join(c.content for c in inline.children if c.type in ("text", "code_inline"))
        base = github_anchor(words)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")  # GitHub numbers repeated headings
    return out


def links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every link and image outside code."""
    found = []
    for block in _parse(text):
        line = block.map[0] + 1 if block.map else 0
        for child in block.children or ():
            line += child.type in ("softbreak", "hardbreak")
            target = child.attrs.get("href") if child.type == "link_open" else (
                child.attrs.get("src") if child.type == "image" else None)
            if target is not None:
                found.append((line, str(target)))
    return found


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for line, target in links(page.read_text(encoding="utf-8")):
        if EXTERNAL.match(target):
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(root)}:{line}: link {target!r}"
        if not dest.exists():
            problems.append(f"{where}: {dest.relative_to(root) if dest.is_relative_to(root) else dest} does not exist")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest.read_text(encoding="utf-8")):
            problems.append(f"{where}: no heading with anchor #{fragment} in {dest.relative_to(root)}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    problems = broken_links(page)
    assert not problems, "\n".join(problems)


def test_a_broken_link_is_named_with_its_file_line_and_target(tmp_path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Top part\n\nSee [b](b.md),\n[top](#top-part), [x](#nope).\n\n"
                                            "```\n[not a link](missing.md)\n```\n\n![img](../img/gone.png)\n")
    (tmp_path / "docs" / "b.md").write_text("# B\n")
    assert broken_links(tmp_path / "docs" / "a.md", tmp_path) == [
        "docs/a.md:4: link '#nope': no heading with anchor #nope in docs/a.md",
        "docs/a.md:10: link '../img/gone.png': img/gone.png does not exist",
    ]


def test_github_anchors() -> None:
    assert github_anchor("What `coevo run` does") == "what-coevo-run-does"
    assert github_anchor("Reward hacking by a naive process reward, and Clipping / Delta "
                         "(`benchmarks/process_hacking.py`)") == \
        "reward-hacking-by-a-naive-process-reward-and-clipping--delta-benchmarksprocess_hackingpy"
    assert anchors("# A\n## A\n") == {"a", "a-1"}


def _words(command: str) -> str | None:
    try:  # quoting aside, so `pip install -e ".[test]"` equals `pip install -e .[test]`
        return " ".join(shlex.split(command))
    except ValueError:  # a code line that is no shell (an unmatched quote)
        return None


def test_readme_keeps_the_commands_ci_runs() -> None:
    """.ci/run runs the README's install and test commands: each one it chains must be in the README."""
    readme = ROOT / "README.md"
    code = "\n".join(t.content for t in _parse(readme.read_text(encoding="utf-8")) if t.type == "fence")
    lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    chain = next(line for line in lines if "pytest" in line)  # the main stage (.ci/vllm follows it)
    commands = [_words(c) for c in chain.split("&&")]
    shown = {_words(part) for line in code.splitlines() for part in line.split("#")[0].split("&&")}
    assert commands and [c for c in commands if c not in shown] == []


def test_readme_recipe_table_names_every_recipe_file_and_its_recipe() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| (?:\(default\) )?`([a-z_]+)` \| `([a-z_]+)` \|", readme, re.M))
    from orchestrator.config import read_config_file  # a file may name its recipe through its base

    files = {p.stem: read_config_file(p).get("recipe", "grpo") for p in (ROOT / "pipelines").glob("*.yaml")}
    assert rows == files


def test_recipes_page_counts_and_names_every_recipe() -> None:
    """docs/recipes.md: its count of shipped files, its list of recipe classes and its table of where
    each file is described agree with pipelines/ and the recipe registry."""
    from pipelines import BUILT_IN

    page = (ROOT / "docs" / "recipes.md").read_text(encoding="utf-8")
    files = sorted(p.stem for p in (ROOT / "pipelines").glob("*.yaml"))
    assert f"table of the {len(files)} shipped files" in page
    classes = re.search(r"names the recipe class \(([^)]*)\)", page.replace("\n", " ")).group(1)
    assert sorted(re.findall(r"`([a-z_]+)`", classes)) == sorted(BUILT_IN)
    table = page.split("## Where each recipe is described", 1)[1].split("\n## ", 1)[0]
    described = {name for row in table.splitlines() if row.startswith("| `")
                 for name in re.findall(r"`([a-z_]+)`", row.split(" | ")[0])}
    assert sorted(described) == files


@pytest.mark.parametrize("page", ["README.md", "docs/recipes.md"])
def test_the_recipe_tables_say_what_a_first_run_costs(page) -> None:
    """Each shipped file's row names the warm-ups a first run pays for, as `coevo run --help` does."""
    from orchestrator.recipe_list import shipped

    FIRST_RUN = {name: about["first_run"] for name, about in shipped().items()}

    text = (ROOT / page).read_text(encoding="utf-8")
    rows = {m.group(1): line for line in text.splitlines()
            if (m := re.match(r"^\| (?:\(default\) )?`([a-z_]+)` \|", line)) and "SFT warm-up" in line}
    assert sorted(rows) == sorted(FIRST_RUN)
    assert all(f"| {FIRST_RUN[name]} |" in line for name, line in rows.items())
