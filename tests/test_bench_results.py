"""Benchmark results: raw results stay out of git (benchmarks/results/raw/ is ignored), each benchmark
keeps a small markdown summary in git, and the docs link summaries, never raw files.
benchmarks/summary.py writes a measurement's section, and replaces it when it is measured again."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from benchmarks import summary
from tests.test_docs_links import PAGES, ROOT, links

RESULTS = ROOT / "benchmarks" / "results"
RAW_SUFFIXES = (".json", ".jsonl", ".log", ".png", ".csv", ".pt")


def tracked(path: str) -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", path], cwd=ROOT, capture_output=True, text=True, timeout=60)
    except OSError:
        pytest.skip("git is not installed")
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return [p for p in out.stdout.split("\0") if p]


def test_results_in_git_are_small_markdown_summaries() -> None:
    files = tracked("benchmarks/results")
    assert files, "benchmarks/results/ holds no summary"
    assert [f for f in files if not f.endswith(".md")] == []
    # summaries only: a section per measurement is 1-2 kB (the raw results, tens of MB, stay in raw/)
    assert sum((ROOT / f).stat().st_size for f in files) < 576 * 1024


def test_the_raw_folder_is_ignored() -> None:
    out = subprocess.run(["git", "check-ignore", "-q", "benchmarks/results/raw/x.json"], cwd=ROOT, timeout=60)
    assert out.returncode == 0


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_link_summaries_not_raw_files(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    bad = [f"{page.relative_to(ROOT)}:{line}: {target}" for line, target in links(text)
           if (page.parent / target.partition("#")[0]).resolve().is_relative_to(RESULTS / "raw")
           or target.partition("#")[0].endswith(RAW_SUFFIXES) and "benchmarks/results" in target]
    bad += [f"{page.relative_to(ROOT)}: names {m}" for m in
            re.findall(r"benchmarks/results/[\w./{},*-]+", text) if m.rstrip(".,").endswith(RAW_SUFFIXES)]
    assert bad == [], "\n".join(bad)


def test_every_summary_the_docs_link_is_in_git() -> None:
    files = set(tracked("benchmarks/results"))
    missing = []
    for page in PAGES:
        for line, target in links(page.read_text(encoding="utf-8")):
            dest = (page.parent / target.partition("#")[0]).resolve()
            if dest.is_relative_to(RESULTS) and str(dest.relative_to(ROOT)) not in files:
                missing.append(f"{page.relative_to(ROOT)}:{line}: {target}")
    assert missing == []


def test_write_adds_a_section_and_replaces_it_when_measured_again(tmp_path) -> None:
    prov = {"command": "python benchmarks/x.py --seeds 0", "commit": "abc1234", "machine": "a CPU", "date": "today"}
    own, raw = tmp_path / "raw" / "x_a.json", tmp_path / "raw" / "x_a.log"
    raw.parent.mkdir()
    own.write_text("{}")
    raw.write_text("")
    path = summary.write("x", "x_a", "| a |\n|---|\n| 1 |", raw=[own, raw, tmp_path / "raw" / "absent.png"],
                         protocol="seeds [0]", prov=prov, folder=tmp_path)
    first = path.read_text()
    assert path == tmp_path / "x.md" and first.startswith("# `benchmarks/x.py`: results")
    assert "`raw/<section>.json`" in first  # the section's own raw file goes unnamed: the header says where
    assert f"| raw | `{raw}` (git-ignored) |" in first and "absent.png" not in first  # only files that exist
    assert "| command | python benchmarks/x.py --seeds 0 |" in first and "| protocol | seeds [0] |" in first
    summary.write("x", "x_b", "| b |\n|---|\n| 2 |", prov=prov, folder=tmp_path)
    summary.write("x", "x_a", "| a |\n|---|\n| 3 |", prov={**prov, "commit": "def5678"}, folder=tmp_path)
    text = path.read_text()
    assert text.count("## x_a") == 1 and text.count("## x_b") == 1 and text.index("## x_a") < text.index("## x_b")
    assert "| 3 |" in text and "| 1 |" not in text and "def5678" in text and "abc1234" in text  # x_b's commit
    assert "seeds [0]" not in text  # the section is replaced whole


def test_provenance_names_the_commit_machine_and_command() -> None:
    prov = summary.provenance()
    assert re.match(r"[0-9a-f]{7}|unknown", prov["commit"])
    assert "CPUs" in prov["machine"] and prov["command"].startswith("python ") and prov["date"].endswith("UTC")


def test_raw_path_is_under_the_ignored_folder(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(summary, "RAW", tmp_path / "raw")
    path = summary.raw_path("probes/p.jsonl")
    assert path == tmp_path / "raw" / "probes" / "p.jsonl" and path.parent.is_dir()
