"""Conversational data and real tokenizers, in-process (no Ray): a locally made byte-level BPE chat
model directory, prompts rendered by its template, the template's end-of-turn token stopping
generation, the sampled token ids trained on as they are, a tokenizer without a pad token, and the
messages reaching a reward function."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
import torch

from actors import batch as B
from actors import chat, local_model, modeling
from actors.generator import Generator
from actors.learner import Learner
from actors.verifier import Verifier
from orchestrator.config import validate_config
from orchestrator.data import DatasetError, load_prompts, read_rows
from rl_step import train
from user_module import on_path

TEXTS = ["Tom has 3 apples. He buys 4 more. How many apples does Tom have now?",
         "3 + 4 = 7. The answer is \\boxed{7}.", "Answer with a number.", "system", "user", "assistant"] * 20
TINY = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
CONVERSATIONS = [
    [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "Tom has 3 apples."}],
    [{"role": "user", "content": "He buys 4 more. How many apples does Tom have now?"}],
]

REWARD_MODULE = """
def sees_messages(prompt, response, messages, answer, **_):
    # the conversation as the dataset gave it, and the response without template tokens
    assert isinstance(messages, list) and messages[-1]["role"] == "user", messages
    assert "<|im_end|>" not in response and "<|im_start|>" not in response, response
    return float(len(messages))
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return local_model.build(tmp_path_factory.mktemp("bpe") / "model", TEXTS, vocab_size=300, **TINY)


@pytest.fixture(scope="module")
def no_pad_dir(tmp_path_factory):
    return local_model.build(tmp_path_factory.mktemp("bpe") / "nopad", TEXTS, vocab_size=300, pad_token=False, **TINY)


@pytest.fixture(scope="module")
def reward_fn(tmp_path_factory):
    with on_path(tmp_path_factory, "coevo_test_chat_rewards", REWARD_MODULE) as module:
        yield f"{module}:sees_messages"


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def config_for(model_path, data_path, reward_fn=None, data=None):
    rewards = [{"name": "seen", "fn": reward_fn, "timeout_s": 10}] if reward_fn else [{"name": "integer_match"}]
    return validate_config({
        "seed": 0, "model": {"path": str(model_path)},
        "data": {"task": None, "path": str(data_path), "eval_size": 1, **(data or {})},
        "rollout": {"prompts_per_step": 2, "samples_per_prompt": 3, "max_new_tokens": 6},
        "rewards": rewards, "algorithm": {"lr": 1e-2}, "train": {"threads": 1}})


@pytest.fixture(scope="module")
def data_path(tmp_path_factory):
    rows = [{"messages": c, "answer": "7"} for c in CONVERSATIONS] * 2
    return write_jsonl(tmp_path_factory.mktemp("data") / "chat.jsonl", rows)


def test_the_made_model_is_a_real_bpe_chat_checkpoint(model_dir):
    tok = modeling.load_tokenizer(model_dir)
    ids = tok("Tom has 3 apples.", add_special_tokens=False)["input_ids"]
    assert len(ids) < len("Tom has 3 apples.")  # merges: tokens of several characters
    assert tok.pad_token == "<|endoftext|>" and tok.eos_token == "<|im_end|>" and tok.pad_token_id != tok.eos_token_id
    assert tok.padding_side == "left" and tok.chat_template
    model = modeling.load_model(model_dir)
    assert model.config.vocab_size == len(tok) and type(model).__name__ == "Qwen2ForCausalLM"


def test_rendered_prompts_tokenize_as_apply_chat_template(model_dir, data_path):
    cfg = config_for(model_dir, data_path, data={})
    prompts = load_prompts(cfg.data, cfg.seed, model_cfg=cfg.model).train
    tok = modeling.load_tokenizer(model_dir)
    for text, messages in zip(prompts.column("prompt").to_pylist(), prompts.column("messages").to_pylist()):
        assert text.endswith("<|im_start|>assistant\n")
        want = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        want = want["input_ids"] if hasattr(want, "keys") else want
        assert tok(text, add_special_tokens=False)["input_ids"] == list(want)


def test_system_prompt_wraps_string_prompts(model_dir, tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", [{"prompt": f"What is {i}+1?", "answer": str(i + 1)} for i in range(3)])
    cfg = config_for(model_dir, path, data={"system_prompt": "Answer with a number."})
    row = load_prompts(cfg.data, cfg.seed, model_cfg=cfg.model).train.to_pylist()[0]
    assert row["messages"][0] == {"role": "system", "content": "Answer with a number."}
    assert row["messages"][1]["role"] == "user" and row["prompt"].startswith("<|im_start|>system\nAnswer")
    none = config_for(model_dir, path, data={"chat_template": "none"})
    assert load_prompts(none.data, none.seed, model_cfg=none.model).train.column("prompt")[0].as_py().startswith("What")


def test_template_from_a_file_and_its_end_of_turn_token(model_dir, data_path, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}<|im_start|>{{ m['content'] }}<|endoftext|>{% endfor %}"
                        "{% if add_generation_prompt %}<|im_start|>{% endif %}")
    cfg = config_for(model_dir, data_path, data={"chat_template": str(template)})
    assert load_prompts(cfg.data, cfg.seed, model_cfg=cfg.model).train.column("prompt")[0].as_py().endswith("<|im_start|>")
    tok = modeling.load_tokenizer(model_dir)
    assert chat.end_of_turn_ids(tok, template.read_text()) == [tok.convert_tokens_to_ids("<|endoftext|>")]
    missing = config_for(model_dir, data_path, data={"chat_template": str(tmp_path / "nope.jinja")})
    with pytest.raises(DatasetError, match="nope.jinja"):
        load_prompts(missing.data, missing.seed, model_cfg=missing.model)


@pytest.mark.parametrize("rows,match", [
    ([{"messages": [{"role": "user"}], "answer": "1"}], r":1: message 0 must have text 'role' and 'content'"),
    ([{"messages": [], "answer": "1"}], r":1: 'messages' must be a non-empty list"),
    ([{"prompt": "a", "answer": "1"}, {"messages": [{"role": "assistant", "content": "x"}], "answer": "1"}],
     r":2: the last message is the assistant's"),
    ([{"messages": "hi", "answer": "1"}], r":1: 'messages' must be a list of messages"),
    ([{"answer": "1"}], r":1: row has no 'prompt' or 'messages' field"),
    ([{"prompt": 5, "answer": "1"}], r":1: 'prompt' must be a string or a list"),
])
def test_bad_conversations_name_the_line(tmp_path, rows, match):
    with pytest.raises(DatasetError, match=match):
        read_rows(write_jsonl(tmp_path / "bad.jsonl", rows))


def test_prompt_as_a_list_of_messages_and_parquet_errors(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": CONVERSATIONS[1], "answer": "7"}])
    table = read_rows(path)
    assert table.column("messages").to_pylist() == [CONVERSATIONS[1]]
    import pyarrow.parquet as pq
    both = tmp_path / "both.parquet"
    pq.write_table(pa.table({"prompt": ["a"], "messages": [CONVERSATIONS[1]], "answer": ["1"]}), both)
    with pytest.raises(DatasetError, match="both 'messages' and a 'prompt'"):
        read_rows(both)
    extra = tmp_path / "extra.parquet"
    pq.write_table(pa.table({"messages": [[{"role": "user", "content": "a", "name": "x"}]], "answer": ["1"]}), extra)
    with pytest.raises(DatasetError, match=r"messages carry \['name'\]"):
        read_rows(extra)


def test_prompt_template_is_refused_for_conversations(model_dir, data_path):
    cfg = config_for(model_dir, data_path, data={"prompt_template": "Q: {prompt}"})
    with pytest.raises(DatasetError, match="data.prompt_template applies to text prompts"):
        load_prompts(cfg.data, cfg.seed, model_cfg=cfg.model)


def test_messages_need_a_template(data_path):
    cfg = validate_config({"data": {"task": None, "path": str(data_path), "eval_size": 1}})
    with pytest.raises(DatasetError, match="built-in tiny model has no chat template.*data.chat_template"):
        load_prompts(cfg.data, cfg.seed, model_cfg=cfg.model)
    none = validate_config({"data": {"task": None, "path": str(data_path), "eval_size": 1, "chat_template": "none"}})
    with pytest.raises(DatasetError, match="data.chat_template=none"):
        load_prompts(none.data, none.seed, model_cfg=none.model)


def test_the_templates_end_of_turn_stops_generation(model_dir, data_path):
    """<|im_end|> ends a response although neither the tokenizer's eos nor generation_config names it."""
    cfg = config_for(model_dir, data_path)
    prompts = load_prompts(cfg.data, cfg.seed, model_cfg=cfg.model).train
    gen = Generator(cfg, None)
    tok, model = gen.backend.tokenizer, gen.backend.model
    end = tok.convert_tokens_to_ids("<|im_end|>")
    tok.eos_token = "<|endoftext|>"
    model.generation_config.eos_token_id = tok.eos_token_id
    assert chat.stop_token_ids(model.generation_config, tok) == sorted({tok.eos_token_id, end})
    gen.backend.eos_ids = chat.stop_token_ids(model.generation_config, tok)
    step = {"n": 0}

    def push_end_on_third_token(module, args, out):  # the model "answers" two tokens, then ends its turn
        step["n"] += 1
        if step["n"] == 3:
            out = out.clone()
            out[..., end] += 1e4
        return out
    handle = model.lm_head.register_forward_hook(push_end_on_third_token)
    try:
        table, _ = gen.generate(prompts, n=2, seq=0)
    finally:
        handle.remove()
    ids = table.column("response_ids").to_pylist()
    assert all(len(r) == 3 and r[-1] == end for r in ids)
    assert set(table.column("finish_reason").to_pylist()) == {"stop"}
    assert all("<|im_end|>" not in r for r in table.column("response").to_pylist())


@pytest.mark.parametrize("fixture", ["model_dir", "no_pad_dir"])
def test_learner_trains_on_the_sampled_ids(request, fixture, data_path, reward_fn):
    """The learner's sequences are the generator's prompt and response ids as sampled (left-padded
    prompts of different lengths), and its log-probs of them are the generator's; with a tokenizer
    that has no pad token too."""
    cfg = config_for(request.getfixturevalue(fixture), data_path, reward_fn)
    prompts = load_prompts(cfg.data, cfg.seed, model_cfg=cfg.model).train
    assert len(set(len(p) for p in prompts.column("prompt").to_pylist())) > 1
    gen = Generator(cfg, None)
    if fixture == "no_pad_dir":
        assert gen.backend.tokenizer.pad_token_id == gen.backend.tokenizer.eos_token_id
    table, _ = gen.generate(prompts, seq=0)
    verifier = Verifier(cfg)
    try:
        table, _ = verifier.score(table)
    finally:
        verifier.close()
    # the reward function got each row's messages and template-free response text
    assert table.column("reward.seen").to_pylist() == [float(len(m)) for m in table.column("messages").to_pylist()]
    learner = Learner(cfg)
    ids, mask, positions, r_ids, r_mask, p_width = learner._sequences(table)
    for i, (p, r) in enumerate(zip(table.column("prompt_ids").to_pylist(), table.column("response_ids").to_pylist())):
        row = ids[i][mask[i].bool()].tolist()
        assert row == p + r
    tok = learner.tokenizer
    want = tok.apply_chat_template(table.column("messages")[0].as_py(), tokenize=True, add_generation_prompt=True)
    assert table.column("prompt_ids")[0].as_py() == list(want["input_ids"] if hasattr(want, "keys") else want)
    with torch.no_grad():
        lp = learner._token_logprobs(learner.model, ids, mask, positions, r_ids, p_width)
    old, _ = B.to_padded(table.column("behavior_logprobs"), 0.0, torch.float32)
    assert torch.allclose(lp * r_mask, old * r_mask, atol=1e-4)
    metrics = train(learner, table)
    assert metrics["train/step_skipped"] == 0 and metrics["train/clip_frac"] == 0


def test_supervised_answers_end_with_the_end_of_turn_token(model_dir, data_path):
    cfg = config_for(model_dir, data_path)
    learner = Learner(cfg)
    learner.tokenizer.eos_token = "<|endoftext|>"
    learner._answer_end = None
    assert learner.answer_end_id == learner.tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompts = load_prompts(cfg.data, cfg.seed, model_cfg=cfg.model).train.select(["prompt", "answer"])
    ids, targets = learner.objective("sft", "packed_answers").packed_answers(prompts)
    last = [row[row != -100][-1].item() for row in targets]
    assert set(last) == {learner.answer_end_id}


def test_judge_and_laser_tokens_on_a_bpe_vocabulary(model_dir):
    from actors.judging import single_token
    tok = modeling.load_tokenizer(model_dir)
    with pytest.raises(ValueError, match="is 2 tokens|is 3 tokens|tokens for this tokenizer"):
        single_token(tok, " zebra", "laser.token")
    assert single_token(tok, "<|im_end|>", "laser.token") == tok.convert_tokens_to_ids("<|im_end|>")


@pytest.mark.parametrize("fixture", ["model_dir", "no_pad_dir"])
def test_reward_models_and_judges_pad_bpe_rows_without_changing_them(request, fixture):
    """A scalar reward model and a yes/no judge read a batch of BPE rows of different lengths as each
    row alone (left padding, with a pad token or with eos standing in for one)."""
    from actors.judging import yes_probability
    from actors.reward_model import score_ids

    path = request.getfixturevalue(fixture)
    model, tok = modeling.load_reward_model(path, seed=0)
    texts = ["<|im_start|>user\nTom has 3 apples.<|im_end|>\n<|im_start|>assistant\n7",
             "Answer with a number. 3 + 4 = 7. The answer is \\boxed{7}."]
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    assert len(ids[0]) != len(ids[1])
    with torch.no_grad():
        together = score_ids(model, ids, tok.pad_token_id, "cpu")
        alone = torch.cat([score_ids(model, [i], tok.pad_token_id, "cpu") for i in ids])
    assert torch.allclose(together, alone, atol=1e-5)
    policy = modeling.load_model(path)
    yes, no = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    both = yes_probability(policy, tok, texts, yes, no, "cpu")
    one = [yes_probability(policy, tok, [t], yes, no, "cpu")[0] for t in texts]
    assert both == pytest.approx(one, abs=1e-5)
