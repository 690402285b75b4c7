"""End to end: `coevo run` on a locally made BPE chat model directory with a conversational dataset
(generator, verifier, learner on Ray), LoRA adapters on the learner, a checkpoint and a resume."""

from __future__ import annotations

import json
import textwrap

import pyarrow.parquet as pq
import pytest
import torch

from coevo_cli import coevo, read_metrics

REWARD = textwrap.dedent('''
    def checks_messages(prompt, response, messages, answer, **_):
        assert messages[0] == {"role": "system", "content": "Reply with the sum."}, messages
        assert "<|im_end|>" not in response
        return float(len(response) % 2)  # varies within a group, so the random model's steps move it
''')


def first_run(tmp_path, ray_env, *more: str):
    from actors import local_model

    rows = [{"messages": [{"role": "system", "content": "Reply with the sum."},
                          {"role": "user", "content": f"What is {a} plus {b}?"}], "answer": str(a + b)}
            for a in range(8) for b in range(8)]
    (tmp_path / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    texts = [m["content"] for r in rows for m in r["messages"]] + [r["answer"] for r in rows]
    model_dir = local_model.build(tmp_path / "model", texts * 4, vocab_size=320, hidden_size=32, num_layers=1,
                                  num_heads=2, num_kv_heads=1, intermediate_size=64)
    (tmp_path / "chat_reward.py").write_text(REWARD)
    run_dir = tmp_path / "run"
    coevo(["data.task=null", "data.path=sums.jsonl", "data.eval_size=8", f"model.path={model_dir}",
           "rewards=[{name: sum, fn: 'chat_reward:checks_messages'}]", "learner.lora={r: 4, alpha: 8}",
           "algorithm.kl_coef=0.05", "warmup.enabled=false", "train.max_steps=2", "train.eval_every=2",
           "train.checkpoint_every=2", "rollout.prompts_per_step=4", "rollout.samples_per_prompt=4",
           "rollout.max_new_tokens=6", "ray.num_cpus=2", "train.threads=1", *more,
           "--output-dir", str(run_dir)], ray_env, tmp_path, timeout=300)
    return model_dir, run_dir


@pytest.mark.slow
def test_chat_template_run_with_lora_on_a_bpe_model(ray_env, tmp_path) -> None:
    """Prompts rendered by the template reach the generator as apply_chat_template's ids, the verifier's
    reward function gets the messages, and the LoRA learner's checkpoint holds the adapter and a merged
    model plain transformers loads."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir, run_dir = first_run(tmp_path, ray_env, "train.dump_rollouts=true")
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["reward/sum/errors"] == 0 for r in rows)  # every sample scored: the messages got there
    tok = AutoTokenizer.from_pretrained(model_dir)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    dump = pq.read_table(run_dir / "rollouts" / "step_1.parquet").to_pylist()
    for row in dump:
        want = tok.apply_chat_template(row["messages"], tokenize=True, add_generation_prompt=True)
        assert row["prompt_ids"] == list(want["input_ids"] if hasattr(want, "keys") else want)
        assert (row["finish_reason"] == "stop") == (row["response_ids"][-1] == end)
    final = run_dir / "checkpoints" / "final" / "policy_learner"
    assert (final / "adapter" / "adapter_model.safetensors").is_file()
    merged = AutoModelForCausalLM.from_pretrained(final)  # plain transformers, no peft
    base = AutoModelForCausalLM.from_pretrained(run_dir / "policy_learner_reference")
    assert any(not torch.equal(a, b) for a, b in zip(merged.state_dict().values(), base.state_dict().values()))


@pytest.mark.long
def test_a_lora_run_resumes_from_its_adapter_and_base(ray_env, tmp_path) -> None:
    _, run_dir = first_run(tmp_path, ray_env)
    out = coevo(["--resume", "--output-dir", str(run_dir), "train.max_steps=3", "train.eval_every=3"],
                ray_env, tmp_path, timeout=300)
    assert "resuming" in out
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["train/kl"] > 0  # the base (adapters off) is the reference after the resume too
