"""`coevo run` rejects bad input with exit code 2 and a message that names the problem, before Ray.

The console script itself runs in a subprocess for the cases about the process (help, version, exit
status, imports from the working directory or the repository root). A `sitecustomize` module on
PYTHONPATH turns `ray.init` into an immediate exit 99 the moment `ray` is imported (and costs nothing
if it never is), so a case that would start a cluster fails fast instead of training. The other bad
inputs go through the same `main()` in this process (`cli`): a subprocess each would import torch
again (~3 s apiece); there the guard is a patched `ray.init`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

NO_RAY = '''
import importlib.abc, importlib.machinery, sys

class _PatchRay(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "ray":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            def init(*args, **kwargs):
                print("TEST GUARD: ray.init was called", file=sys.stderr, flush=True)
                raise SystemExit(99)
            module.init = init
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _PatchRay())
'''


def _coevo() -> list[str]:
    script = Path(sys.executable).parent / "coevo"
    if script.is_file():
        return [str(script)]
    found = shutil.which("coevo")
    return [found] if found else [sys.executable, "-m", "orchestrator.cli"]


@pytest.fixture(scope="module")
def guard_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("no_ray")
    (path / "sitecustomize.py").write_text(NO_RAY)
    return path


@pytest.fixture
def coevo(guard_dir, tmp_path):
    """Run `coevo ARGS` in tmp_path with Ray guarded; returns the CompletedProcess."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([str(guard_dir), *filter(None, [env.get("PYTHONPATH")])])
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    env["HF_HUB_OFFLINE"] = "1"

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*_coevo(), *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)

    return run


@pytest.fixture
def cli(monkeypatch, tmp_path, capsys):
    """Run `coevo ARGS` through orchestrator.cli.main in this process, in tmp_path; returns a
    CompletedProcess like `coevo` does. Getting as far as ray.init is a failure, as in a subprocess."""
    import ray

    from orchestrator import cli as cli_module

    def init(*args, **kwargs):
        raise RuntimeError("TEST GUARD: ray.init was called")

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(sys, "path", list(sys.path))  # main() appends the cwd
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    def run(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        code = cli_module.main(list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["coevo", *args], code, out, err)

    return run


def _assert_config_error(proc: subprocess.CompletedProcess) -> str:
    assert "TEST GUARD" not in proc.stderr, f"Ray was started:\n{proc.stderr}"
    assert proc.returncode == 2, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr


def test_guard_catches_ray_init(guard_dir, tmp_path) -> None:
    """The guard itself works: a process that calls ray.init exits 99 without starting Ray."""
    env = dict(os.environ, PYTHONPATH=str(guard_dir))
    proc = subprocess.run([sys.executable, "-c", "import ray; ray.init(num_cpus=1)"], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 99 and "TEST GUARD" in proc.stderr


def test_help(coevo) -> None:
    proc = coevo("run", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "overrides" in proc.stdout.lower()
    assert "key=value" in proc.stdout  # how an override looks
    assert "--resume" in proc.stdout and "--output-dir" in proc.stdout
    # the default job's estimator is PSR, not plain GRPO
    assert "then PSR (GRPO's positive half" in " ".join(proc.stdout.split()) and "then GRPO." not in proc.stdout


def test_unknown_key_lists_accepted_keys(cli) -> None:
    err = _assert_config_error(cli("run", "algorithm.lrr=1"))
    assert "algorithm.lrr" in err
    for accepted in ("lr", "clip_eps", "kl_coef", "advantage"):
        assert accepted in err


def test_unknown_section(cli) -> None:
    err = _assert_config_error(cli("run", "algorythm.lr=1"))
    assert "algorythm" in err
    assert "algorithm" in err.replace("algorythm", "")  # the accepted sections are listed


def test_bad_value_names_key(cli) -> None:
    err = _assert_config_error(cli("run", "rollout.temperature=-1"))
    assert "rollout.temperature" in err


def test_missing_config_file(coevo) -> None:
    err = _assert_config_error(coevo("run", "no_such_config.yaml", "train.max_steps=1"))
    assert "no_such_config.yaml" in err


def test_missing_dataset_file(cli, tmp_path) -> None:
    missing = tmp_path / "nowhere" / "my_data.jsonl"
    err = _assert_config_error(cli("run", f"data.path={missing}", "data.task=null"))
    assert "my_data.jsonl" in err


def test_unimportable_reward_module(cli) -> None:
    err = _assert_config_error(
        cli("run", "rewards=[{name: mine, fn: 'no_such_reward_module_xyz:score'}]"))
    assert "no_such_reward_module_xyz" in err


def test_missing_reward_function_in_cwd_module(cli, tmp_path) -> None:
    """A module in the working directory is found (as in the README); a missing attribute is named."""
    (tmp_path / "my_rewards_cli.py").write_text("def score(prompt, response, answer, **_):\n    return 1.0\n")
    err = _assert_config_error(cli("run", "rewards=[{name: mine, fn: 'my_rewards_cli:nope'}]"))
    assert "my_rewards_cli" in err and "nope" in err
    assert "cannot import" not in err  # the module itself imported from the cwd


@pytest.mark.parametrize("source, line, what", [
    ("def score(prompt, response, answer, **_):\n    return 1.0 +\n", 2, "SyntaxError: invalid syntax"),
    ("import os\nLIMIT = int(os.environ['NO_SUCH_VARIABLE_XYZ'])\n", 2, "KeyError: 'NO_SUCH_VARIABLE_XYZ'"),
    ("import no_such_dependency_xyz\n", 1, "No module named 'no_such_dependency_xyz'"),
])
def test_a_reward_module_that_fails_to_import_is_named_with_its_line(cli, tmp_path, source, line, what) -> None:
    """A module that exists but fails at import (it does not compile, its top level raises, a module
    it imports is missing) gets the same one-line rc-2 error as a missing one, naming file and line."""
    module = f"broken_rewards_{line}_{abs(hash(what)) % 10_000}"
    (tmp_path / f"{module}.py").write_text(source)
    proc = cli("run", f"rewards=[{{name: mine, fn: '{module}:score'}}]")
    err = _assert_config_error(proc)
    assert len(err.strip().splitlines()) == 1, err
    assert f"rewards[mine].fn" in err and f"{tmp_path / module}.py, line {line}" in err and what in err, err


def test_resume_needs_output_dir(coevo) -> None:
    err = _assert_config_error(coevo("run", "--resume"))
    assert "--output-dir" in err


def test_version(coevo) -> None:
    from importlib.metadata import version

    proc = coevo("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"coevo {version('coevo')}"


def test_help_lists_every_recipe_with_a_line() -> None:
    """Each shipped file says what it does and what a first run costs, and `coevo run --help` shows both."""
    from orchestrator.cli import _parser
    from orchestrator.recipe_list import shipped

    recipes = shipped()
    run_help = " ".join(_parser()._subparsers._group_actions[0].choices["run"].format_help().split())
    for name, about in recipes.items():
        assert about.get("summary") and about.get("first_run"), f"pipelines/{name}.yaml lacks '# summary:' or '# first run:'"
        assert f"{name} {about['summary']}" in run_help and f"first run: {about['first_run']}" in run_help


def test_a_new_config_file_is_listed_from_its_own_lines(tmp_path, monkeypatch) -> None:
    from orchestrator import recipe_list

    (tmp_path / "mine.yaml").write_text("# summary: my own variant\n# first run: nothing new\nseed: 1\n")
    (tmp_path / "grpo_addition.yaml").write_text("seed: 0\n")
    monkeypatch.setattr(recipe_list, "PIPELINES_DIR", tmp_path)
    assert recipe_list.shipped() == {"grpo_addition": {}, "mine": {"summary": "my own variant", "first_run": "nothing new"}}
    assert " ".join(recipe_list.recipes_help().split()).endswith("mine my own variant first run: nothing new")


def test_help_examples_are_accepted() -> None:
    """Every example in `coevo run --help` parses and loads (the reward module need not exist)."""
    import shlex

    from orchestrator.cli import EXAMPLES, _parser
    from orchestrator.config import load_config

    for line in EXAMPLES.splitlines()[1:]:
        args, extra = _parser().parse_known_args(shlex.split(line)[1:])
        config, overrides = args.config, [*args.overrides, *extra]
        if config and "=" in config:
            config, overrides = None, [config, *overrides]
        load_config(config, overrides)


def _finished_run(run_dir: Path) -> str:
    (run_dir / "checkpoints" / "final").mkdir(parents=True)
    (run_dir / "checkpoints" / "final" / "loop_state.json").write_text('{"step": 6}')
    (run_dir / "config.yaml").write_text(f"recipe: grpo\noutput_dir: {run_dir}\ntrain: {{max_steps: 6}}\n")
    summary = '{"steps": 6, "eval/accuracy": 0.895, "stopped_by": null}'
    (run_dir / "summary.json").write_text(summary)
    return summary


def test_resume_of_a_finished_run_starts_nothing(cli, tmp_path) -> None:
    run_dir = tmp_path / "done"
    summary = _finished_run(run_dir)
    err = _assert_config_error(cli("run", "--resume", "--output-dir", str(run_dir)))
    assert "finished run" in err and "train.max_steps=N (N > 6)" in err
    assert (run_dir / "summary.json").read_text() == summary
    assert (run_dir / "config.yaml").read_text().endswith("train: {max_steps: 6}\n")  # not rewritten


def test_rerunning_a_saved_config_starts_a_new_run(coevo, tmp_path) -> None:
    """The README's "rerun with: coevo run runs/.../config.yaml" for a run started with --output-dir:
    it gets past the run-directory check (to the guarded ray.init) and into a new directory."""
    run_dir = tmp_path / "done"
    _finished_run(run_dir)
    proc = coevo("run", str(run_dir / "config.yaml"))
    assert proc.returncode == 99 and "TEST GUARD" in proc.stderr, proc.stderr
    assert "already holds a run" not in proc.stderr and "new directory" in proc.stdout
    assert [p.name.split("-")[0] for p in (tmp_path / "runs").iterdir()] == ["grpo"]


def test_an_output_dir_holding_a_users_files_is_refused_untouched(cli, tmp_path) -> None:
    """The user's own config.yaml in the directory they name (also as the config): refused with rc 2,
    naming what is there, before Ray; the file is byte for byte the same."""
    mine = tmp_path / "exp1"
    mine.mkdir()
    text = "# my experiment\nrecipe: grpo\ntrain: {max_steps: 7}\n"
    (mine / "config.yaml").write_text(text)
    for args in (["--output-dir", str(mine)], [str(mine / "config.yaml"), "--output-dir", str(mine)]):
        err = _assert_config_error(cli("run", *args))
        assert "not a coevo run directory" in err and "config.yaml" in err and str(mine) in err
        assert (mine / "config.yaml").read_text() == text and [p.name for p in mine.iterdir()] == ["config.yaml"]


def test_hub_id_model_path_stops_before_ray(cli) -> None:
    err = _assert_config_error(cli("run", "model.path=Qwen/Qwen2.5-0.5B"))
    assert "does not fetch" in err and "download the model to a directory first" in err


def test_a_directory_that_is_not_a_model_stops_before_ray(cli, tmp_path) -> None:
    (tmp_path / "notamodel").mkdir()
    (tmp_path / "notamodel" / "config.json").write_text('{"model_type": "qwen2"}')
    err = _assert_config_error(cli("run", f"model.path={tmp_path / 'notamodel'}"))
    assert "notamodel" in err and "holds no model weights" in err


def test_progress_line_shows_the_last_accuracy_between_evaluations() -> None:
    from orchestrator.loop import step_info

    assert "acc -" in step_info({"reward/mean": 0.5})  # no evaluation yet
    assert "acc 0.825 (step 40)" in step_info({"reward/mean": 0.5}, (0.825, 40))
    line = step_info({"reward/mean": 0.5, "eval/accuracy": 0.85}, (0.85, 50))
    assert "acc 0.850" in line and "(step" not in line
    # a learned reward the guard dropped says so (its reward is then the verifier's alone, or none)
    line = step_info({"reward/mean": 0.0, "learned/judge/guard": 1.0, "learned/judge/auroc": 0.634,
                      "learned/rm/guard": 0.0, "learned/rm/auroc": 0.9})
    assert "judge dropped by the guard (AUROC 0.63)" in line and "rm dropped" not in line
    assert "judge dropped by the guard" in step_info({"reward/mean": 0.0, "learned/judge/guard": 1.0})
    probed = step_info({"reward/mean": 0.0, "learned/judge/guard": 1.0, "learned/judge/auroc": 0.7,
                        "learned/judge/probe_rows": 64.0})
    assert "judge dropped by the guard (AUROC on probes 0.70)" in probed  # verifier.probe_share


def test_the_final_line_puts_the_warm_start_beside_the_end() -> None:
    from orchestrator.cli import held_out_text

    summary = {"eval/accuracy": 0.915, "eval/step": 60, "eval/prompts": 200, "warm_start/accuracy": 0.58,
               "warm_start/stage": "warm-up"}
    assert held_out_text(summary) == ("held-out greedy accuracy on 200 prompts 0.580 (warm start, after the "
                                      "warm-up) -> 0.915 (step 60)")
    del summary["warm_start/accuracy"]  # no stage trained the policy (a recipe's own model)
    assert held_out_text(summary) == "held-out greedy accuracy on 200 prompts 0.915 (step 60)"
    assert held_out_text({"eval/accuracy": None, "eval/pair_accuracy": 0.75}) == "held-out pair accuracy 0.750"
    assert held_out_text({}) == "no evaluation"


@pytest.mark.parametrize("recipe", ["subtraction_jsonl", "code_tasks"])
def test_recipes_with_data_files_find_them_from_any_directory(guard_dir, tmp_path, recipe) -> None:
    """`coevo run subtraction_jsonl` / `code_tasks` from a directory other than the repository root,
    with no PYTHONPATH: the data beside the recipe and the reward module load, so it gets as far as
    starting Ray (the guard's exit 99)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(PYTHONPATH=str(guard_dir), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", HF_HUB_OFFLINE="1")
    proc = subprocess.run([*_coevo(), "run", recipe, "--output-dir", str(tmp_path / "run")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 99 and "TEST GUARD" in proc.stderr, proc.stderr
    import yaml  # the saved config names the data by its absolute path: it reruns from anywhere

    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert Path(saved["data"]["path"]).is_absolute() and Path(saved["data"]["path"]).is_file()


def test_a_relative_path_in_a_yaml_file_is_looked_up_beside_it_then_in_the_cwd(cli, tmp_path) -> None:
    from orchestrator.config import load_config

    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "rows.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    (tmp_path / "cwd_rows.jsonl").write_text('{"prompt": "1+2=", "answer": "3"}\n')
    (tmp_path / "exp" / "a.yaml").write_text("data: {task: null, path: rows.jsonl, eval_path: cwd_rows.jsonl}\n")
    config = load_config(str(tmp_path / "exp" / "a.yaml"))  # the cwd is tmp_path (the cli fixture)
    assert config.data.path == str(tmp_path / "exp" / "rows.jsonl")  # beside the file
    assert config.data.eval_path == "cwd_rows.jsonl"  # not beside it: the working directory's, as before
    assert load_config(str(tmp_path / "exp" / "a.yaml"), ["data.path=rows.jsonl"]).data.path == "rows.jsonl"


def test_the_printout_names_each_saved_models_loader(tmp_path) -> None:
    """From each model's own config.json: ppo's critic is a causal LM body plus its value head, not
    `from_pretrained.from_pretrained`; a reward model is a sequence classifier."""
    from orchestrator.cli import loader_text

    for name, arch in (("critic", "Qwen2ForCausalLM"), ("rm_learner", "LlamaForSequenceClassification"),
                       ("odd", "SomethingElse")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(f'{{"architectures": ["{arch}"]}}')
    (tmp_path / "critic" / "value_head.pt").write_bytes(b"")
    critic = loader_text(tmp_path / "critic")
    assert critic.startswith("AutoModelForCausalLM.from_pretrained") and "value_head.pt" in critic
    assert loader_text(tmp_path / "rm_learner") == "AutoModelForSequenceClassification.from_pretrained"
    assert loader_text(tmp_path / "odd") == "AutoModel.from_pretrained"
