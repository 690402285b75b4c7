"""Writes docs/configuration.md from the pydantic config models, so the reference cannot drift from
them (tests/test_config_reference.py fails when the file is stale). Descriptions are each model's
docstring and the comments on (or just above) each field in its source.

    python scripts/config_reference.py            # rewrite docs/configuration.md
    python scripts/config_reference.py --check    # exit 1 if it is stale
"""

from __future__ import annotations

import inspect
import re
import sys
import types
import typing
from pathlib import Path

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "configuration.md"
sys.path.insert(0, str(ROOT))

from orchestrator.config import Config  # noqa: E402
from orchestrator.recipes import RECIPES  # noqa: E402
from orchestrator.settings import sections_of  # noqa: E402
from orchestrator.stages import STAGES  # noqa: E402

BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


def comments(model: type[BaseModel]) -> dict[str, str]:
    """Field name -> its trailing comment, or the comment block right above it."""
    out, block = {}, []
    for line in inspect.getsource(model).splitlines()[1:]:
        text = line.strip()
        if text.startswith("#"):
            block.append(text.lstrip("# ").strip())
            continue
        match = re.match(r"\s{4}(\w+)\s*:", line)
        if match and not text.startswith(("def ", "@")):
            trailing = line.split("  # ", 1)[1].strip() if "  # " in line else ""
            out[match.group(1)] = " ".join([*block, trailing]).strip()
        block = []
    return out


def type_name(ann) -> str:
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Annotated:  # a constrained member of a union, e.g. int >= 1 | section
        return type_name(args[0])
    if origin is typing.Union:
        names = [type_name(a) for a in args if a is not type(None)]
        return " \\| ".join(names) + (" \\| null" if type(None) in args else "")
    if origin is typing.Literal:
        return " \\| ".join(repr(a) if isinstance(a, str) else str(a) for a in args)
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]"
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "section"
    return getattr(ann, "__name__", str(ann))


def bounds(field) -> str:
    parts = []
    for meta in field.metadata:
        for attr, sign in BOUNDS.items():
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(f"{sign} {value}")
    return ", ".join(parts)


def default(field) -> str:
    if field.is_required():
        return "(required)"
    if field.default_factory is not None:
        value = field.default_factory()
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        return "`" + repr([v.model_dump(exclude_defaults=True) for v in value]) + "`"
    text = "null" if value is None else repr(value)
    return f"`{text}`".replace("|", "\\|")


def section(model: type[BaseModel], path: str, lines: list[str], skip: set[str] = frozenset()) -> None:
    """A table of `model`'s fields under the heading `path`, then its nested sections."""
    doc = inspect.cleandoc(model.__doc__) if model.__doc__ and model.__doc__ != BaseModel.__doc__ else ""
    notes = comments(model)
    rows, nested = [], []
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        ann = field.annotation
        inner = [a for a in typing.get_args(ann) if isinstance(a, type) and issubclass(a, BaseModel)]
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            nested.append((f"{path}.{name}" if path else name, ann))
        elif inner and typing.get_origin(ann) is list:
            nested.append((f"{path}.{name}[]" if path else f"{name}[]", inner[0]))
        elif inner and typing.get_origin(ann) is dict:
            nested.append((f"{path}.{name}.<name>" if path else f"{name}.<name>", inner[0]))
        elif inner and typing.get_origin(ann) in (typing.Union, types.UnionType):  # a value or a section
            nested.append((f"{path}.{name}" if path else name, inner[0]))
        key = f"{path}.{name}" if path else name
        rows.append(f"| `{key}` | {type_name(ann)} | {default(field)} | {bounds(field)} | "
                    f"{notes.get(name, '').replace('|', '/')} |")
    if path:
        lines += [f"### `{path}`", ""]
    if doc:
        lines += [" ".join(doc.split()), ""]
    lines += ["| key | type | default | bounds | meaning |", "|---|---|---|---|---|", *rows, ""]
    for sub_path, sub_model in nested:
        section(sub_model, sub_path, lines)


def owners() -> dict[str, list[str]]:
    """Section name -> who declares it (stages first, then recipes)."""
    out: dict[str, list[str]] = {}
    for name in sorted(STAGES.names()):
        for key in vars(STAGES.get(name)).get("settings") or {}:
            out.setdefault(key, []).append(f"stage `{name}`")
    for name in RECIPES.names():
        for key in vars(RECIPES.get(name)).get("settings") or {}:
            out.setdefault(key, []).append(f"recipe `{name}`")
    return out


def render() -> str:
    lines = ["# Configuration reference", "",
             "<!-- Generated by scripts/config_reference.py from the pydantic models: do not edit by hand. -->", "",
             "A run's config is a YAML file (`coevo run path.yaml`, or a recipe name) plus dotted overrides "
             "(`coevo run grpo_addition train.max_steps=50`). Every key is checked: an unknown key is an "
             "error that lists the accepted keys, a value out of bounds names the key and the value.", "",
             "A YAML file may state only how it differs from another: `base: NAME` (a recipe in pipelines/) or "
             "`base: other.yaml` (beside it). Sections merge key by key at any depth; a list or a value replaces "
             "the base's (`pipelines/dapo.yaml` is grpo_addition plus DAPO's settings).", "",
             "The sections below every run has. A recipe and its stages add their own sections "
             "(`Recipe.settings`, `Stage.settings`; see [extending](extending.md)); a config is checked "
             "against its recipe's sections, so a section another recipe owns is an error naming its owner.", "",
             "A stage's section is in a config only where the stage can run: `judge` with a `judge: true` reward "
             "source, `laser` with a `laser: true` one, `reward_model` with a `model:` one (`Stage.rewards`). "
             "Set without one, it is an error naming the key; `judge: null` (`judge=null` on the command line) "
             "drops a section, also one a `base:` brings, and a section holding only defaults, as a run's "
             "config.yaml saved before this rule has, is dropped quietly. A recipe that reads such a section "
             "without that reward source owns it (the table's second column: `spark`'s `judge`, `prime`'s "
             "`reward_model`, ...) and reads only the keys it needs of it.", "",
             "## Sections every run has", ""]
    section(Config, "", lines)
    lines += ["## Sections recipes and stages own", ""]
    lines += ["| recipe | its sections | with a learned reward source (its kind) |", "|---|---|---|"]
    for name in RECIPES.names():
        always = sorted(sections_of(RECIPES.get(name), Config.model_fields, frozenset()))
        learned = {key: kind for kind in ("judge", "laser", "model")
                   for key in sections_of(RECIPES.get(name), Config.model_fields, frozenset({kind})) if key not in always}
        lines.append(f"| `{name}` | {', '.join(f'`{s}`' for s in always)} | "
                     f"{', '.join(f'`{key}` ({kind})' for key, kind in sorted(learned.items()))} |")
    lines.append("")
    owned = owners()
    models = {}
    for name in RECIPES.names():
        models.update(sections_of(RECIPES.get(name), Config.model_fields))
    for key in sorted(models):
        lines += [f"## `{key}` (declared by {', '.join(owned.get(key, ['?']))})", ""]
        sub: list[str] = []
        section(models[key], key, sub)
        lines += sub[2:]  # the `##` heading above names it already
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv[1:]:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run python scripts/config_reference.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
