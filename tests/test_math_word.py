"""The math_word task and the model directory a run makes for it (model.bpe)."""

from __future__ import annotations

import re

import pytest

from actors import modeling
from actors.rewards import REWARD_FUNCTIONS
from orchestrator import math_word
from orchestrator.config import ConfigError, load_config
from orchestrator.data import load_prompts


def test_problems_are_distinct_seeded_and_their_solutions_right():
    train, held_out = math_word.make(500, 100, [2, 3], 9, seed=0)
    assert (train.num_rows, held_out.num_rows) == (500, 100)
    questions = train.column("prompt").to_pylist() + held_out.column("prompt").to_pylist()
    assert len(set(questions)) == 600  # no held-out problem is trained on
    again, _ = math_word.make(500, 100, [2, 3], 9, seed=0)
    assert again.column("prompt").to_pylist() == train.column("prompt").to_pylist()
    assert math_word.make(500, 100, [2, 3], 9, seed=1)[0].column("prompt").to_pylist() != questions[:500]
    score = REWARD_FUNCTIONS.get("math_verify")
    for row in train.slice(0, 50).to_pylist():
        steps = re.findall(r"(\d+) ([-+*]) (\d+) = (\d+)\.", row["solution"])
        assert len(steps) == row["prompt"].count(".") - 1  # one line per operation sentence
        for a, op, b, c in steps:
            assert eval(f"{a}{op}{b}") == int(c) >= 0
        assert steps[-1][3] == row["answer"]
        assert score(prompt=row["prompt"], response=row["solution"], answer=row["answer"]) == 1.0
        assert score(prompt=row["prompt"], response="\\boxed{-1}", answer=row["answer"]) == 0.0


def test_too_few_distinct_problems_is_named():
    with pytest.raises(ValueError, match="only .* distinct problems"):
        math_word.make(100_000, 10, [1], 2, seed=0)
    with pytest.raises(ConfigError, match="math_word.steps"):
        load_config("math_word", ["data.math_word.steps=[0]"])


def test_the_recipe_makes_its_bpe_chat_model_once(tmp_path):
    overrides = [f"model.bpe.cache_dir={tmp_path}", "model.bpe.vocab_size=320", "data.math_word.train_size=200",
                 "data.eval_size=20", "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1, "
                 "intermediate_size: 64}"]
    cfg = load_config("math_word", overrides)
    prompts = load_prompts(cfg.data, cfg.seed, model_cfg=cfg.model)
    assert cfg.model.bpe is None and cfg.model.path.startswith(str(tmp_path))
    made = list(tmp_path.iterdir())
    assert len(made) == 1 and (made[0] / "tokenizer.json").is_file()
    tok = modeling.load_tokenizer(cfg.model.path)
    row = prompts.eval.to_pylist()[0]
    assert row["prompt"].startswith("<|im_start|>system\nPut the final answer in \\boxed{}.<|im_end|>\n<|im_start|>user\n")
    assert row["messages"][1]["content"] in row["prompt"] and "solution" in row
    assert len(tok(row["solution"], add_special_tokens=False)["input_ids"]) < len(row["solution"])
    again = load_config("math_word", overrides)
    load_prompts(again.data, again.seed, model_cfg=again.model)
    assert again.model.path == cfg.model.path and list(tmp_path.iterdir()) == made  # cached, not made again
    with pytest.raises(ConfigError, match="model.path .* or model.bpe"):
        load_config("math_word", [*overrides, "model.path=/tmp"])
