"""The shipped configs (pipelines/NAME.yaml), for `coevo run --help`: each file says what it does and
what a first run of it costs in two comment lines of its own, `# summary: ...` and `# first run: ...`
(the warm-up stages a first run pays for, cached after; docs/recipes.md#what-a-first-run-costs has
the measurements). No list of recipes lives here: a new file in pipelines/ is listed as it is."""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.config import DEFAULT_RECIPE, PIPELINES_DIR

_LINE = re.compile(r"^# (summary|first run): (.+)$", re.M)


def describe(path: Path) -> dict[str, str]:
    """A config file's own `summary` and `first run` lines (empty where it has none)."""
    return {key.replace(" ", "_"): text.strip() for key, text in _LINE.findall(path.read_text(encoding="utf-8"))}


def shipped() -> dict[str, dict[str, str]]:
    """Every file in pipelines/, the default first, with its summary and first-run lines."""
    files = sorted(PIPELINES_DIR.glob("*.yaml"), key=lambda p: (p.stem != DEFAULT_RECIPE, p.stem))
    return {p.stem: describe(p) for p in files}


def recipes_help() -> str:
    recipes = shipped()
    width = max(map(len, recipes))
    return ("recipes (coevo run NAME loads pipelines/NAME.yaml); a first run also pays for the warm-ups after\n"
            "'first run:' (times on 2 idle CPU cores; cached, later runs skip them):\n" + "\n".join(
                f"  {name:{width}}  {about.get('summary', '')}\n  {'':{width}}    first run: {about.get('first_run', '-')}"
                for name, about in recipes.items()))
