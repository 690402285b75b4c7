"""Where benchmark results go. Raw results (per-run JSON, logs, plots) are written under
benchmarks/results/raw/, which git ignores; each benchmark keeps one small summary in git,
benchmarks/results/<benchmark>.md, with a section per measurement: the command, the commit, the
machine, the date, the raw files other than raw/<section>.json, the protocol and the table. `write`
replaces a measurement's section when it is measured again and appends a new one otherwise; a
superseded section is deleted by hand."""

from __future__ import annotations

import os
import platform
import re
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RAW = RESULTS / "raw"


def raw_path(name: str) -> Path:
    """benchmarks/results/raw/<name>, its folder made."""
    path = RAW / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def cpu() -> str:
    """CPU model, its widest vector units, logical CPUs and memory, e.g. `AMD EPYC (AVX-512), 2 CPUs, 23.5 GiB`."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    isa = next((name for flag, name in (("amx_tile", "AVX-512, AMX"), ("avx512f", "AVX-512"), ("avx2", "AVX2"))
                if flag in flags), None)
    try:
        mem = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.1f} GiB"
    except (ValueError, OSError, AttributeError):
        mem = ""
    return f"{model}{f' ({isa})' if isa else ''}, {os.cpu_count()} CPUs{mem}"


def provenance() -> dict[str, str]:
    """Commit, machine, date and command of the measurement running in this process."""
    # a copy of the tree without .git (a lent device machine) is told its commit by COEVO_COMMIT
    commit = _git("rev-parse", "--short", "HEAD") or os.environ.get("COEVO_COMMIT", "unknown")
    changed = [name for line in _git("status", "--porcelain", "--untracked-files=no").splitlines()
               if not (name := line.split(None, 1)[-1]).startswith("benchmarks/results/")]
    if changed:
        commit += f" with uncommitted changes to {', '.join(changed[:8])}{' ...' if len(changed) > 8 else ''}"
    machine = cpu()
    torch = sys.modules.get("torch")  # versions of what the benchmark imported; nothing imported here
    if torch is not None:
        machine += f"; torch {torch.__version__}"
        if torch.cuda.is_available():
            machine += f", {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    machine += f"; Python {platform.python_version()}; load {os.getloadavg()[0]:.1f} (1 min) when written"
    script = Path(sys.argv[0]).resolve()
    argv0 = str(script.relative_to(ROOT)) if script.is_relative_to(ROOT) else sys.argv[0]
    return {"command": "python " + shlex.join([argv0, *sys.argv[1:]]), "commit": commit, "machine": machine,
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def dict_table(rows: list[dict], floats: str = "{:.3g}") -> str:
    """A markdown table of rows with the same keys (the first row's order); None as '-'."""
    if not rows:
        return ""
    keys = list(rows[0])
    cell = lambda v: "-" if v is None else floats.format(v) if isinstance(v, float) else str(v)  # noqa: E731
    return "\n".join([f"| {' | '.join(keys)} |", "|" + "---|" * len(keys),
                      *(f"| {' | '.join(cell(r.get(k)) for k in keys)} |" for r in rows)])


def markdown_tables(text: str) -> str:
    """The markdown tables in printed output, with the headings before them (progress lines dropped)."""
    keep = [line for line in text.splitlines() if line.startswith(("|", "#"))]
    return "\n".join(f"\n{line}\n" if line.startswith("#") else line for line in keep).strip()


def write(benchmark: str, run: str, table: str, *, raw: list[Path] | tuple = (), protocol: str = "",
          notes: str = "", prov: dict[str, str] | None = None, folder: Path = RESULTS) -> Path:
    """Write (or replace) the section `run` of folder/<benchmark>.md: provenance, raw files, protocol, table."""
    prov = prov or provenance()
    path = folder / f"{benchmark}.md"
    # the section's own raw/<run>.json goes unnamed (the file's first line says where it is): only
    # other raw files are listed
    default = (folder / "raw" / f"{run}.json").resolve()
    found = [(p, Path(p).resolve()) for p in raw if Path(p).exists()]
    names = [str(r.relative_to(RESULTS)) if r.is_relative_to(RESULTS) else str(p) for p, r in found if r != default]
    fields = [*prov.items(), ("raw", ", ".join(f"`{n}`" for n in names) + " (git-ignored)" if names else ""),
              ("protocol", protocol)]
    rows = "\n".join(f"| {key} | {value.replace('|', '/')} |" for key, value in fields if value)
    begin, end = f"<!-- run: {run} -->", f"<!-- end run: {run} -->"
    section = "\n\n".join(s for s in (f"{begin}\n## {run}", f"| | |\n|---|---|\n{rows}", notes.strip(), table.strip(), end)
                          if s)
    text = path.read_text(encoding="utf-8") if path.is_file() else (
        f"# `benchmarks/{benchmark}.py`: results\n\nOne section per measurement; raw results in `raw/<section>.json` "
        f"and the files a section's `raw` row names (git-ignored, see [README.md](README.md)).\n")
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + section
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(text.rstrip("\n") + "\n", encoding="utf-8")
    return path
