"""Models and tokenizers without a hub: the tiny factory and local HF directories."""

import pytest
import torch

from actors import modeling
from actors.generator import Generator
from orchestrator.config import validate_config
from rl_step import train

SMALL = {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
                  "intermediate_size": 64}}


def test_char_tokenizer_round_trips_text():
    tok = modeling.char_tokenizer()
    text = "12+34=46\nThe answer: x y"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per character
    assert tok.decode(ids) == text
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == text


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tiny_model_archs(arch):
    tok = modeling.char_tokenizer()
    model = modeling.tiny_model(tok, arch=arch, hidden_size=32, num_layers=1, num_heads=2,
                                num_kv_heads=1, intermediate_size=64)
    assert model.config.model_type == arch
    out = model(torch.tensor([[4, 5, 6]]))
    assert out.logits.shape == (1, 3, len(tok))


def test_model_from_local_directory_generates(tmp_path):
    """model.path: any HF model + tokenizer saved in a local directory (here a tiny one)."""
    tok = modeling.char_tokenizer()
    model = modeling.tiny_model(tok, arch="llama", hidden_size=32, num_layers=1, num_heads=2,
                                num_kv_heads=1, intermediate_size=64)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    config = validate_config({"model": {"path": str(tmp_path)}, "rollout": {"max_new_tokens": 3}})
    gen = Generator(config, None)
    assert gen.backend.model.config.model_type == "llama"
    import pyarrow as pa
    out, info = gen.generate(pa.table({"prompt_id": ["a"], "prompt": ["1+1="], "answer": ["2"]}), n=4)
    assert out.num_rows == 4 and info["rows"] == 4
    assert out.column("answer").to_pylist() == ["2"] * 4


def test_the_chosen_attention_kernel_is_the_one_every_copy_runs(tmp_path):
    """model.attn_implementation reaches the generator's and the learner's models, built or loaded
    from a directory, and their log-probs agree with the default kernel's; an unset one leaves the
    warm-up cache key as it was before the setting existed, a set one changes it."""
    from actors.learner import Learner
    from orchestrator.stage_cache import cache_key

    config = validate_config({"model": {**SMALL, "attn_implementation": "eager"}})
    built, _ = modeling.build(config.model, seed=0)
    assert built.config._attn_implementation == "eager"
    tok = modeling.char_tokenizer()
    built.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    assert Generator(config, str(tmp_path)).backend.model.config._attn_implementation == "eager"
    assert Learner(config, model_source=str(tmp_path)).model.config._attn_implementation == "eager"
    default = modeling.load_model(tmp_path)
    assert default.config._attn_implementation != "eager"
    ids = torch.tensor([[4, 5, 6, 7], [0, 8, 9, 10]])
    mask = (ids != 0).long()
    eager = modeling.load_model(tmp_path, attn="eager")
    assert torch.allclose(eager(ids, attention_mask=mask).logits[mask.bool()],
                          default(ids, attention_mask=mask).logits[mask.bool()], atol=1e-5)
    assert cache_key(validate_config({"model": SMALL})) != cache_key(config)
    # the default recipe's warm-up keeps the cache entry it had before the setting (the benchmarks'
    # warm start, named in docs/benchmarks.md)
    from orchestrator.config import load_config
    assert cache_key(load_config()) == "389b841308046817"
    with pytest.raises(Exception, match="attn_implementation"):
        validate_config({"model": {"attn_implementation": "fast"}})


def test_a_kernel_that_cannot_run_here_names_the_setting(tmp_path):
    pytest.importorskip("transformers")
    try:
        import flash_attn  # noqa: F401
        pytest.skip("flash-attn is installed here")
    except ImportError:
        pass
    config = validate_config({"model": {**SMALL, "attn_implementation": "flash_attention_2"}})
    with pytest.raises(ValueError, match=r"model.attn_implementation='flash_attention_2' cannot be used here"):
        modeling.build(config.model, seed=0)


def test_missing_model_directory_is_named(tmp_path):
    config = validate_config({"model": {"path": str(tmp_path / "nope")}})
    with pytest.raises(FileNotFoundError, match="nope"):
        modeling.build(config.model, seed=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_generate_and_train_on_gpu():
    """The same generator and learner code on a CUDA device (skipped on CPU-only machines)."""
    import pyarrow as pa

    from actors.learner import Learner
    from actors.verifier import Verifier

    config = validate_config({"model": SMALL, "rollout": {"max_new_tokens": 3},
                              "roles": {"generator": {"num_gpus": 1}, "policy_learner": {"num_gpus": 1}}})
    gpu = {"num_gpus": 1}
    gen, learner, verifier = Generator(config, None, role=gpu), Learner(config, role=gpu), Verifier(config)
    try:
        batch, _ = gen.generate(pa.table({"prompt_id": ["a", "b"], "prompt": ["1+1=", "2+2="], "answer": ["2", "4"]}))
        metrics = train(learner, verifier.score(batch)[0])
    finally:
        verifier.close()
    assert next(learner.model.parameters()).is_cuda
    assert metrics["samples/count"] == 2 * config.rollout.samples_per_prompt


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_a_saved_model_has_the_mode_of_its_neighbours(tmp_path, umask):
    """safetensors writes model.safetensors 0600: a learner's save gives every file the umask's mode,
    so a model shared with a group (umask 022) is readable like its config.json beside it."""
    import os

    from actors.learner import Learner

    config = validate_config({"model": SMALL, "train": {"threads": 1}})
    old = os.umask(umask)
    try:
        Learner(config).save(str(tmp_path / "saved"))
    finally:
        os.umask(old)
    modes = {p.relative_to(tmp_path / "saved").as_posix(): oct(p.stat().st_mode & 0o777)
             for p in (tmp_path / "saved").rglob("*") if p.is_file()}
    assert "model.safetensors" in modes and set(modes.values()) == {oct(0o666 & ~umask)}, modes
