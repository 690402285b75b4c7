"""End to end: `coevo run` on an embedded local Ray (2 CPUs, loopback, token auth), as a user runs it:
the run directory, resume, user data and rewards, bad plug-ins and dead actors."""

from __future__ import annotations

import json
import subprocess

import pytest

from coevo_cli import COEVO, coevo, read_metrics, small

STEP_KEYS = ("step", "time_s", "reward/mean", "throughput/tokens_per_s", "time/generate_s", "time/verify_s",
             "time/learn_s", "version", "channel/policy/version", "role/generator/busy_frac",
             "samples/dispatched", "samples/consumed", "samples/lost")


@pytest.mark.slow
def test_grpo_run_writes_run_dir_and_resumes(ray_env, warm_cache, tmp_path) -> None:
    """It starts in a directory a run left before its first checkpoint (Ctrl-C in the warm-up, a
    failed start): the same command reuses it. The log (not a terminal) carries no transformers
    progress bars or escape codes, and no Ray token-auth warning when RAY_AUTH_MODE is left unset."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "coevo_run.json").write_text("{}\n")  # coevo made it
    (run_dir / "config.yaml").write_text("recipe: grpo\n")
    (run_dir / "metrics.jsonl").write_text('{"step": 99}\n')
    env = {k: v for k, v in ray_env.items() if k != "RAY_AUTH_MODE"}
    out = coevo(small(warm_cache, "train.max_steps=6", "train.eval_every=3", "train.checkpoint_every=2",
                      "train.keep_checkpoints=2", "--output-dir", str(run_dir)), env, tmp_path)
    assert "run directory" in out
    assert f"{run_dir} holds a run that stopped before its first checkpoint: starting it again there" in out
    assert "Loading weights" not in out and "\x1b[" not in out, out[-3000:]
    assert "Token authentication" not in out, out[-3000:]

    import yaml

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["train"]["max_steps"] == 6 and config["data"]["arithmetic"]["digits"] == 1
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 7))
    for row in rows:
        missing = [k for k in STEP_KEYS if row.get(k) is None]
        assert not missing, f"step {row['step']} lacks {missing}"
        assert 0.0 <= row["reward/mean"] <= 1.0 and row["throughput/tokens_per_s"] > 0
        assert row["samples/lost"] == 0 and row["samples/consumed"] == 32 * row["step"]
        assert row["version"] == row["step"] == row["channel/policy/version"]
        assert 0 < row["time/driver_cpu_s"] < row["time_s"]  # the loop's own CPU, a share of the wall time
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [3, 6]
    assert all(r1["time_s"] < r2["time_s"] for r1, r2 in zip(rows, rows[1:]))
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert all(p.stat().st_size > 1000 for p in (run_dir / "plots").glob("*.png"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["samples/lost"] == 0
    # the last line says where the wall time went; the phases add up to it
    phases = sum(summary[f"time/{p}_s"] for p in ("ray_start", "warmup", "actors", "train", "finish", "restart"))
    assert summary["time/wall_s"] - 1.0 < phases <= summary["time/wall_s"] + 1e-6, summary
    assert summary["restarts"] == 0 and summary["resumed_from"] is None and summary["first_step"] == 1
    assert f"done: 6 steps in {summary['time/wall_s']:.1f}s (Ray " in out
    # the warm start (the SFT warm-up's greedy held-out accuracy) is printed beside the end's
    warm = summary["warm_start/accuracy"]
    assert warm == summary["warmup/accuracy"] and summary["warm_start/stage"] == "warm-up"
    assert summary["eval/step"] == 6 and summary["eval/prompts"] == 32
    assert (f"held-out greedy accuracy on 32 prompts {warm:.3f} (warm start, after the warm-up) -> "
            f"{summary['eval/accuracy']:.3f} (step 6)") in out
    # checkpoints: the newest two step_N kept, plus final; a half-written one would be a dot-dir
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == ["final", "step_4", "step_6"], names

    # the final checkpoint loads with plain transformers
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = run_dir / "checkpoints" / "final" / "policy_learner"
    model, tokenizer = AutoModelForCausalLM.from_pretrained(final), AutoTokenizer.from_pretrained(final)
    ids = tokenizer("3+4=", return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        assert torch.isfinite(model(**ids).logits).all()

    # --resume continues from the final checkpoint: no step twice, none missing
    out = coevo(["--resume", "--output-dir", str(run_dir), "train.max_steps=8"], ray_env, tmp_path)
    assert "resuming" in out and "warm-up (SFT)" not in out
    resumed = read_metrics(run_dir)
    assert [r["step"] for r in resumed] == list(range(1, 9))
    assert resumed[:6] == rows  # earlier rows kept as they were
    assert resumed[6]["version"] == 7 and resumed[6]["time_s"] > rows[-1]["time_s"]
    assert resumed[6]["samples/consumed"] == 32 * 7 and resumed[-1]["samples/lost"] == 0
    assert json.loads((run_dir / "checkpoints" / "final" / "loop_state.json").read_text())["step"] == 8
    resumed_summary = json.loads((run_dir / "summary.json").read_text())
    assert resumed_summary["warm_start/accuracy"] == warm  # from the checkpoint
    assert f"{warm:.3f} (warm start, after the warm-up) -> " in out
    # this session's steps, not the earlier one's; no warm-up ran; both sessions kept
    assert resumed_summary["first_step"] == 7 and resumed_summary["resumed_from"] == "final"
    assert "done: steps 7-8, resumed from final, in " in out and "warm-up" not in out.split("done:")[1].split(";")[0]
    assert [(s["first_step"], s["steps"], s["resumed_from"]) for s in resumed_summary["sessions"]] == \
        [(1, 6, None), (7, 8, "final")]


@pytest.mark.slow
def test_a_users_model_is_measured_first_and_trained_only_below_its_target(ray_env, warm_cache, tmp_path) -> None:
    """model.path at or above warmup.target_accuracy: the SFT warm-up measures it, says so and leaves
    it as it is (RL starts from its own accuracy). Below the target it is fine-tuned, with a line that
    says so and how not to."""
    from orchestrator.config import load_config
    from pipelines.stages.sft import MARKER, cache_path

    warm = cache_path(load_config(None, small(warm_cache)))  # a model at the small task's target
    if not (warm / MARKER).is_file():
        coevo(small(warm_cache, "train.max_steps=1", "--output-dir", str(tmp_path / "fill")), ray_env, tmp_path)
    accuracy = json.loads((warm / MARKER).read_text())["warmup/accuracy"]
    run_dir, user_cache = tmp_path / "given", tmp_path / "user-cache"
    out = coevo(small(warm_cache, f"model.path={warm}", f"warmup.target_accuracy={accuracy}",
                      f"warmup.cache_dir={user_cache}", "train.max_steps=1", "--output-dir", str(run_dir)),
                ray_env, tmp_path)
    assert (f"warm-up (SFT): skipped: model.path={warm} has held-out greedy accuracy {accuracy:.3f} >= "
            f"warmup.target_accuracy {accuracy}; RL starts from it as given") in out, out[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["warmup/steps"] == 0 and summary["warmup/skipped"] and summary["warm_start/skipped"]
    assert summary["warm_start/accuracy"] == pytest.approx(accuracy)  # the same greedy evaluation: same number
    assert f"{summary['warm_start/accuracy']:.3f} (warm start, the model as given: its warm-up was skipped" in out
    assert "policy_learner/ " in out  # RL ran and saved

    out = coevo(small(warm_cache, f"model.path={warm}", "warmup.target_accuracy=0.99", "warmup.max_steps=5",
                      "warmup.eval_every=5", f"warmup.cache_dir={user_cache}", "train.max_steps=1",
                      "--output-dir", str(tmp_path / "trained")), ray_env, tmp_path)
    assert (f"warm-up (SFT): model.path={warm} has held-out greedy accuracy {accuracy:.3f} < warmup.target_accuracy "
            "0.99: fine-tuning it on the task's reference answers before RL (warmup.enabled=false starts RL from "
            "it as given)") in out, out[-3000:]
    assert json.loads((tmp_path / "trained" / "summary.json").read_text())["warmup/steps"] == 5


@pytest.mark.slow
def test_an_existing_run_directory_is_never_reused_silently(ray_env, warm_cache, tmp_path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step_2").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_2" / "loop_state.json").write_text('{"step": 2}')
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    proc = subprocess.run([*COEVO, "run", *small(warm_cache), "--output-dir", str(run_dir)], cwd=tmp_path,
                          env=ray_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "already holds a run" in proc.stderr and "--resume" in proc.stderr
    assert (run_dir / "metrics.jsonl").read_text() == '{"step": 1}\n'  # untouched
    proc = subprocess.run([*COEVO, "run", "--resume", "--output-dir", str(tmp_path / "empty")], cwd=tmp_path,
                          env=ray_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no checkpoint" in proc.stderr


REWARD_MODULE = '''
def score(prompt, response, answer, level, **_):
    """Exact match; raises for every prompt whose first operand is even."""
    if int(prompt[0]) % 2 == 0:
        raise ValueError(f"refusing {prompt!r} (level {level})")
    return float(response.strip() == answer)
'''


@pytest.mark.slow
def test_user_dataset_and_reward_function(ray_env, tmp_path) -> None:
    """The README path: a JSONL file and a `module:function` reward in the working directory,
    no coevo code touched. A reward that raises for half the prompts does not stop the run."""
    with (tmp_path / "sums.jsonl").open("w") as f:
        for a in range(10):
            for b in range(10):
                f.write(json.dumps({"prompt": f"{a}+{b}=", "answer": a + b, "level": "easy"}) + "\n")
    (tmp_path / "my_reward_mod.py").write_text(REWARD_MODULE)
    run_dir = tmp_path / "run"
    out = coevo(["data.task=null", "data.path=sums.jsonl", "data.eval_size=16",
                 "rewards=[{name: mine, fn: 'my_reward_mod:score'}]",
                 "warmup.enabled=false", "train.max_steps=2", "train.eval_every=2",
                 "rollout.prompts_per_step=8", "rollout.samples_per_prompt=4", "ray.num_cpus=2",
                 "train.threads=1", "train.dump_rollouts=true",
                 # two generator replicas share each step's prompts (half a CPU each fits 2 CPUs)
                 "roles.generator.replicas=2", "roles.generator.num_cpus=0.5",
                 "--output-dir", str(run_dir)], ray_env, tmp_path)
    assert "run directory" in out
    done = next(line for line in out.splitlines() if line.startswith("done:"))
    assert "warm-up" not in done  # warmup.enabled=false: no warm-up time is claimed
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]

    import pandas as pd

    dump = pd.read_parquet(run_dir / "rollouts" / "step_1.parquet")
    assert len(dump) == 8 * 4 and dump["uid"].is_unique
    assert dump.groupby("group_id").size().eq(4).all()
    assert {"reward", "reward.mine", "reward_error.mine", "advantages", "level"} <= set(dump.columns)
    failed = dump["reward_error.mine"].notna()
    assert failed.any() and dump.loc[failed, "reward.mine"].isna().all()
    assert all("reward/mine/mean" in r for r in rows)
    errors = sum(r["reward/mine/errors"] for r in rows)
    assert 0 < errors < sum(r["samples/count"] for r in rows)
    assert rows[-1]["eval/errors/mine"] > 0
    assert (run_dir / "checkpoints" / "final" / "policy_learner" / "config.json").is_file()
    # about half the samples fail: the console says so, naming the function and an error
    assert "warning: reward source 'mine' (function 'my_reward_mod:score') failed on" in out
    assert "first error: ValueError: refusing" in out
    # the accounting closes: what admission dispatched ahead of the end is dropped as run_ended
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["samples/pending"] == 0 and summary["samples/lost"] == 0
    assert summary["samples/dropped/run_ended"] > 0
    assert summary["samples/dispatched"] == summary["samples/consumed"] + summary["samples/dropped/run_ended"]


STRING_REWARD = '''
def score(prompt, response, answer, **_):
    return "1.0"  # a string, not a number: every sample fails
'''


@pytest.mark.slow
def test_a_reward_failing_on_every_sample_stops_the_run(ray_env, warm_cache, tmp_path) -> None:
    (tmp_path / "str_reward.py").write_text(STRING_REWARD)
    out = coevo(small(warm_cache, "warmup.enabled=false", "train.max_steps=20", "train.eval_every=20",
                      "rewards=[{name: one, fn: 'str_reward:score'}]", "verifier.max_failed_steps=2",
                      "--output-dir", str(tmp_path / "run")), ray_env, tmp_path, expect=1)
    last = out.strip().splitlines()[-1]
    assert last.startswith("error: ") and "reward source 'one' (function 'str_reward:score') failed on every " \
        "sample for 2 steps in a row (steps 1-2); its first error: returned '1.0'" in last, out[-3000:]
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2]


KILLER = '''
import os, signal

def score(prompt, response, answer, **_):
    os.kill(os.getppid(), signal.SIGKILL)  # the reward worker's parent: it must not be the verifier
    return 0.0
'''

DYING_LOSS = '''
import os

def loss(logprobs, old_logprobs, advantages, **_):
    os._exit(3)  # runs inside the policy learner
'''


@pytest.mark.slow
def test_reward_code_cannot_kill_the_verifier_but_a_dead_learner_ends_the_run(ray_env, warm_cache, tmp_path):
    (tmp_path / "killer.py").write_text(KILLER)
    run_dir = tmp_path / "run"
    coevo(small(warm_cache, "warmup.enabled=false", "train.max_steps=2", "train.eval_every=2",
                "rewards=[{name: k, fn: 'killer:score', timeout_s: 2}]", "--output-dir", str(run_dir)),
          ray_env, tmp_path)
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2] and all(r["reward/k/errors"] == 32 for r in rows)

    (tmp_path / "dying.py").write_text(DYING_LOSS)
    # it dies again after its one restart (train.learner_restarts=1): the run ends with the error (every
    # row computed: an untrained policy's rewards may all tie, and tied groups are otherwise skipped)
    proc = subprocess.run([*COEVO, "run", *small(warm_cache, "warmup.enabled=false", "train.max_steps=3",
                                                  "algorithm.policy_loss=dying:loss", "algorithm.skip_uniform_groups=false",
                                                  "train.learner_restarts=1"),
                           "--output-dir", str(tmp_path / "run2")],
                          cwd=tmp_path, env=ray_env, capture_output=True, text=True, timeout=180,
                          start_new_session=True)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "role 'policy_learner'" in last and "died" in last, proc.stderr[-3000:]
    assert "restarting the run from the first step (no checkpoint yet)" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_local_cluster_without_the_asked_gpus_is_a_config_error(ray_env, warm_cache, tmp_path) -> None:
    """An embedded cluster never grows, so a GPU it lacks would be waited for forever: exit 2 instead."""
    proc = subprocess.run([*COEVO, "run", *small(warm_cache, "roles.generator.num_gpus=1"),
                           "--output-dir", str(tmp_path / "run")],
                          cwd=tmp_path, env=ray_env, capture_output=True, text=True, timeout=120,
                          start_new_session=True)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 GPU (the cluster has 0)" in proc.stderr and "roles.<name>" in proc.stderr
