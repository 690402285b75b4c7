"""Run directories (orchestrator.run_dir): a directory coevo did not make is refused unless empty,
one whose run stopped before its first checkpoint is reused, one with a checkpoint needs --resume,
and a finished one is never written over."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.config import ConfigError, load_config
from orchestrator.run_dir import MARKER, claim, is_saved_config, mark


def _checkpoint(run: Path, name: str, step: int) -> None:
    (run / "checkpoints" / name).mkdir(parents=True)
    (run / "checkpoints" / name / "loop_state.json").write_text(json.dumps({"step": step}))


def _finished(run: Path, steps: int = 6, accuracy: float = 0.5, stopped_by=None) -> str:
    _checkpoint(run, "final", steps)
    (run / "config.yaml").write_text("recipe: grpo\n")
    summary = json.dumps({"steps": steps, "eval/accuracy": accuracy, "stopped_by": stopped_by})
    (run / "summary.json").write_text(summary)
    return summary


def test_a_run_without_checkpoint_is_reused_in_place(tmp_path) -> None:
    run = tmp_path / "run"
    (run / "tensorboard").mkdir(parents=True)
    mark(run)
    (run / "config.yaml").write_text("recipe: grpo\n")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "policy_learner_reference").mkdir()
    (run / "checkpoints" / ".step_2.tmp").mkdir(parents=True)  # half-written: not a checkpoint
    (run / "notes.txt").write_text("mine")
    note = claim(run, load_config(None), resume=False)
    assert note and str(run) in note and "before its first checkpoint" in note
    # the stale outputs went, not the user's file
    assert sorted(p.name for p in run.iterdir()) == [MARKER, "notes.txt"]


def test_resume_without_checkpoint_says_the_command_that_reuses_it(tmp_path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    mark(run)
    (run / "config.yaml").write_text("recipe: grpo\n")
    with pytest.raises(FileNotFoundError) as e:
        claim(run, load_config(None), resume=True)
    assert f"coevo run {run}/config.yaml --output-dir {run}" in str(e.value)
    assert (run / "config.yaml").is_file()
    with pytest.raises(FileNotFoundError, match="no checkpoint under"):
        claim(tmp_path / "empty", load_config(None), resume=True)


def test_a_run_with_a_checkpoint_needs_resume(tmp_path) -> None:
    run = tmp_path / "run"
    _checkpoint(run, "step_4", 4)
    with pytest.raises(ConfigError, match="already holds a run; continue it with --resume"):
        claim(run, load_config(None), resume=False)
    assert claim(run, load_config(None), resume=True) is None


def test_resume_of_a_finished_run_changes_nothing_and_says_how_to_extend(tmp_path) -> None:
    run = tmp_path / "run"
    summary = _finished(run, steps=6)
    with pytest.raises(ConfigError) as e:
        claim(run, load_config(None, ["train.max_steps=6"]), resume=True)
    msg = str(e.value)
    assert "is a finished run" in msg and "nothing was changed" in msg
    assert f"coevo run --resume --output-dir {run} train.max_steps=N (N > 6)" in msg
    assert (run / "summary.json").read_text() == summary
    # more steps: a resume that trains
    assert claim(run, load_config(None, ["train.max_steps=8"]), resume=True) is None


def test_resume_of_a_run_that_reached_its_accuracy_target(tmp_path) -> None:
    run = tmp_path / "run"
    _finished(run, steps=40, accuracy=0.85)
    config = load_config(None, ["train.max_steps=200", "train.stop_at_accuracy=0.8"])
    with pytest.raises(ConfigError, match=r"0\.850 reached train\.stop_at_accuracy=0\.8.*stop_at_accuracy=null"):
        claim(run, config, resume=True)
    assert claim(run, load_config(None, ["train.max_steps=200", "train.stop_at_accuracy=null"]), resume=True) is None


def test_a_run_stopped_by_a_signal_resumes(tmp_path) -> None:
    run = tmp_path / "run"
    _finished(run, steps=6, stopped_by="SIGINT")
    assert claim(run, load_config(None, ["train.max_steps=6"]), resume=True) is None


def test_saved_config_is_recognised(tmp_path) -> None:
    run = tmp_path / "run"
    _finished(run)
    (run / "config.yaml").write_text(f"recipe: grpo\noutput_dir: {run}\n")
    assert is_saved_config(str(run / "config.yaml"))
    (tmp_path / "config.yaml").write_text("recipe: grpo\noutput_dir: elsewhere\n")  # a user's own config
    assert not is_saved_config(str(tmp_path / "config.yaml")) and not is_saved_config(None)


@pytest.mark.parametrize("resume", [False, True])
def test_a_directory_coevo_did_not_make_is_refused_and_left_alone(tmp_path, resume) -> None:
    """A hand-written config.yaml, an unrelated file: refused by name, neither touched."""
    mine = tmp_path / "mine"
    (mine / "data").mkdir(parents=True)
    (mine / "config.yaml").write_text("recipe: grpo  # my own\n")
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(ConfigError) as e:
        claim(mine, load_config(None), resume=resume)
    msg = str(e.value)
    assert "not a coevo run directory" in msg and "config.yaml, data/, notes.txt" in msg and str(mine) in msg
    assert ("no run to resume there" in msg) == resume
    assert sorted(p.name for p in mine.iterdir()) == ["config.yaml", "data", "notes.txt"]
    assert (mine / "config.yaml").read_text() == "recipe: grpo  # my own\n"


def test_an_empty_or_new_directory_is_used_and_a_file_is_refused(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    assert claim(tmp_path / "empty", load_config(None), resume=False) is None
    assert claim(tmp_path / "new", load_config(None), resume=False) is None
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        claim(tmp_path / "a_file", load_config(None), resume=False)


def test_a_run_directory_made_before_the_marker_still_resumes(tmp_path) -> None:
    run = tmp_path / "run"
    _checkpoint(run, "step_4", 4)
    (run / "config.yaml").write_text("recipe: grpo\n")
    assert claim(run, load_config(None), resume=True) is None
