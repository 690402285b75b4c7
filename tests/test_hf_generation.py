"""The HF backend's decoding loop: on a GPU it reads "every sample has ended" a step late instead of
waiting for the device every step; that changes nothing it returns (checked here by running the
same lagged loop on the CPU), and its tokens follow the distribution transformers' own `generate`
samples from with the same warper."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actors import modeling
from actors.generation.hf import HFBackend
from actors.generator import shares_gpu

TINY = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}
PROMPTS = ["12+34=", "7+8=", "99+1=", "5+55="]


@pytest.fixture(scope="module")
def backend() -> HFBackend:
    tok = modeling.char_tokenizer()
    torch.set_num_threads(1)
    return HFBackend(modeling.tiny_model(tok, **TINY, init_std=0.5, seed=3), tok)


def run(backend: HFBackend, deferred: bool, seed: int, **kwargs):
    backend.defer_stop = deferred
    torch.manual_seed(seed)
    try:
        return backend.generate(PROMPTS, **kwargs)
    finally:
        backend.defer_stop = False


def same(a, b) -> None:
    assert np.array_equal(a.response_ids, b.response_ids)
    assert np.array_equal(a.response_lengths, b.response_lengths)
    assert np.array_equal(a.logprobs, b.logprobs)
    assert a.finish_reason == b.finish_reason
    assert (a.next_logprobs is None) == (b.next_logprobs is None)
    if a.next_logprobs is not None:
        assert np.array_equal(a.next_logprobs, b.next_logprobs, equal_nan=True)


@pytest.mark.parametrize("early", [False, True])
@pytest.mark.parametrize("kwargs", [dict(n=4, max_new_tokens=12), dict(n=3, max_new_tokens=9, temperature=0.7, top_k=20),
                                    dict(n=2, max_new_tokens=10, top_p=0.9, next_token=5),
                                    dict(n=1, max_new_tokens=8, greedy=True)])
def test_reading_the_end_a_step_late_returns_the_same_samples(backend, kwargs, early) -> None:
    eos = backend.eos_ids
    if early:  # most tokens end a sample: every sample ends within a few steps, well before the limit
        backend.eos_ids = sorted(set(eos) | set(range(3, 60)))
    try:
        for seed in range(3):
            per_step, lagged = run(backend, False, seed, **kwargs), run(backend, True, seed, **kwargs)
            same(per_step, lagged)
            if early and not kwargs.get("greedy"):
                assert per_step.response_lengths.max() < kwargs["max_new_tokens"]  # the early end was taken
    finally:
        backend.eos_ids = eos


def test_samples_follow_transformers_generate_with_the_same_warper(backend) -> None:
    """The first token's frequencies from the loop and from `model.generate` (through
    `generate_hf`, with coevo's SamplingWarper) agree with the exact probabilities."""
    n, kwargs = 4000, dict(temperature=0.8, top_k=12, top_p=0.95)
    prompt = PROMPTS[:1]
    torch.manual_seed(0)
    ours = backend.generate(prompt, n=n, max_new_tokens=1, **kwargs)
    torch.manual_seed(1)
    theirs = backend.generate_hf(prompt, n=n, max_new_tokens=1, **kwargs)
    from actors.sampling import processed_logits
    enc = backend.tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        logits = backend.model(**enc).logits[0, -1]
    p = torch.softmax(processed_logits(logits[None], **{"temperature": 0.8, "top_k": 12, "top_p": 0.95}), -1)[0]
    for sample in (ours, theirs):
        first = sample.response_ids[np.concatenate([[0], np.cumsum(sample.response_lengths)[:-1]])]
        freq = np.bincount(first, minlength=len(p)) / n
        assert np.abs(freq - p.numpy()).max() < 0.03  # ~4 standard errors at p = 0.5
        assert set(np.flatnonzero(freq)) <= set(np.flatnonzero(p.numpy()))  # nothing outside top-k/top-p
    # the behaviour log-probs are the processed distribution's
    first = ours.response_ids[np.concatenate([[0], np.cumsum(ours.response_lengths)[:-1]])]
    lp = ours.logprobs[np.concatenate([[0], np.cumsum(ours.response_lengths)[:-1]])]
    assert np.allclose(lp, torch.log(p)[first].numpy(), atol=1e-5)


def test_a_generator_that_shares_a_gpu_frees_its_kv_cache() -> None:
    assert shares_gpu(0.45) and not shares_gpu(1) and not shares_gpu(0) and not shares_gpu(2)
    tok = modeling.char_tokenizer()
    on_cpu = HFBackend(modeling.tiny_model(tok, **TINY), tok, free_memory=True)
    assert not on_cpu.free_memory and not on_cpu.defer_stop  # nothing to give back on a CPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_late_check_returns_the_same_samples_and_a_shared_gpu_gets_its_memory_back() -> None:
    tok = modeling.char_tokenizer()
    model = modeling.tiny_model(tok, **TINY, init_std=0.5, seed=3).to(torch.bfloat16)
    backend = HFBackend(model, tok, device="cuda", free_memory=True)
    assert backend.defer_stop and backend.free_memory
    eos = backend.eos_ids
    for early in (False, True):
        backend.eos_ids = sorted(set(eos) | set(range(3, 60))) if early else eos
        for seed in range(3):
            kwargs = dict(n=4, max_new_tokens=16, next_token=5)
            same(run(backend, False, seed, **kwargs), run(backend, True, seed, **kwargs))
    backend.eos_ids = eos
    weights = torch.cuda.memory_allocated()
    backend.generate(PROMPTS * 16, n=8, max_new_tokens=64)
    freed = torch.cuda.memory_reserved()
    backend.free_memory = False
    backend.generate(PROMPTS * 16, n=8, max_new_tokens=64)
    kept = torch.cuda.memory_reserved()
    assert weights <= freed < kept  # the KV cache's blocks went back to the GPU; without, the allocator kept them


@pytest.mark.parametrize("early", [False, True])
@pytest.mark.parametrize("kwargs", [dict(n=4, max_new_tokens=12), dict(n=3, max_new_tokens=9, temperature=0.7, top_k=20),
                                    dict(n=2, max_new_tokens=10, top_p=0.9, next_token=5),
                                    dict(n=1, max_new_tokens=8, greedy=True)])
def test_a_static_kv_cache_samples_what_the_dynamic_one_does(backend, kwargs, early) -> None:
    """rollout.hf_static_cache: the prefill copied into a static cache, every slot masked in but
    hidden by causality until written, gives the same tokens and (to rounding) the same log-probs."""
    static = HFBackend(backend.model, backend.tokenizer, static_cache=True)
    eos = backend.eos_ids
    if early:
        static.eos_ids = backend.eos_ids = sorted(set(eos) | set(range(3, 60)))
    try:
        for seed in range(3):
            a, b = run(backend, False, seed, **kwargs), run(static, False, seed, **kwargs)
            assert np.array_equal(a.response_ids, b.response_ids)
            assert np.array_equal(a.response_lengths, b.response_lengths) and a.finish_reason == b.finish_reason
            assert np.allclose(a.logprobs, b.logprobs, atol=1e-5)
            if a.next_logprobs is not None:
                assert np.allclose(a.next_logprobs, b.next_logprobs, atol=1e-5, equal_nan=True)
    finally:
        backend.eos_ids = eos


def test_a_static_cache_is_kept_per_batch_shape_and_reused() -> None:
    from actors.generation.static_cache import KEEP_SHAPES
    tok = modeling.char_tokenizer()
    backend = HFBackend(modeling.tiny_model(tok, **TINY, seed=3), tok, static_cache=True)
    backend.generate(PROMPTS, n=2, max_new_tokens=5)
    (shape, (cache, _)), = backend.static.shapes.items()
    assert shape == (8, 64)  # 8 rows; prompt width + 5 new tokens, rounded up to the bucket
    backend.generate(PROMPTS[::-1], n=2, max_new_tokens=7)  # same shape: the same cache, reset
    assert list(backend.static.shapes) == [shape] and backend.static.shapes[shape][0] is cache
    for n in range(1, KEEP_SHAPES + 2):  # more shapes than are kept: the least recently used goes
        backend.generate(PROMPTS[:1], n=n, max_new_tokens=3)
    assert len(backend.static.shapes) == KEEP_SHAPES and shape not in backend.static.shapes


def test_calls_shorter_than_the_static_minimum_decode_with_the_dynamic_cache() -> None:
    tok = modeling.char_tokenizer()
    backend = HFBackend(modeling.tiny_model(tok, **TINY, seed=3), tok, static_cache=True, static_min_new_tokens=10)
    backend.generate(PROMPTS, n=2, max_new_tokens=4)  # a judge's verdict: no static cache, no compilation
    assert not backend.static.shapes
    backend.generate(PROMPTS, n=2, max_new_tokens=12)
    assert list(backend.static.shapes) == [(8, 64)]


def test_static_cache_auto_is_on_for_long_single_turn_decodes_on_a_gpu() -> None:
    from actors.generation.static_cache import wanted
    assert wanted(None, "cuda:0", 200, episodes=False)
    assert not wanted(None, "cuda:0", 8, episodes=False)  # the default job: too few steps to repay a compile
    assert not wanted(None, "cuda:0", 200, episodes=True)  # batches that shrink turn by turn
    assert not wanted(None, "cpu", 200, episodes=False)
    assert wanted(True, "cpu", 8, episodes=True) and not wanted(False, "cuda", 512, episodes=False)


def test_static_cache_is_the_hf_backends_setting() -> None:
    from orchestrator.config import validate_config
    assert validate_config({"rollout": {"hf_static_cache": True}}).rollout.hf_static_cache
    with pytest.raises(ValueError, match="hf_static_cache=true applies to rollout.backend=hf, not 'vllm'"):
        validate_config({"rollout": {"backend": "vllm", "hf_static_cache": True}})


def compiled_decodes_like_the_dynamic_loop(device: str, mode: str | None) -> None:
    """The static cache's step under torch.compile: one graph for the whole forward (no break, which
    would split a CUDA graph), the same greedy tokens as the eager dynamic loop, float32; a second
    call of a shape compiles nothing, a new batch shape compiles once."""
    from torch._dynamo.utils import counters

    from actors.generation.static_cache import StaticDecoder
    tok = modeling.char_tokenizer()
    model = modeling.tiny_model(tok, **TINY, init_std=0.5, seed=3)
    dynamic = HFBackend(model, tok, device=device)
    static = HFBackend(model, tok, device=device, static_cache=True)
    if mode is not None:
        static.static = StaticDecoder(static.model, mode)
    kwargs = dict(n=4, max_new_tokens=24, greedy=True, next_token=5)
    counters.clear()
    a, b = dynamic.generate(PROMPTS * 2, **kwargs), static.generate(PROMPTS * 2, **kwargs)
    assert np.array_equal(a.response_ids, b.response_ids) and np.array_equal(a.response_lengths, b.response_lengths)
    assert np.allclose(a.logprobs, b.logprobs, atol=1e-3)
    assert np.allclose(a.next_logprobs, b.next_logprobs, atol=1e-3, equal_nan=True)
    assert counters["stats"]["unique_graphs"] == 1 and counters["frames"]["ok"] == 1
    c = static.generate(PROMPTS * 2, **kwargs)
    assert counters["frames"]["total"] == 1  # replayed, not compiled again
    assert np.array_equal(b.response_ids, c.response_ids)
    static.generate(PROMPTS, **kwargs)
    assert counters["frames"]["total"] == 2


@pytest.mark.slow
@pytest.mark.long  # an inductor compilation on the CPU, ~20 s: CI's long stage
def test_the_compiled_static_step_is_one_graph_and_compiles_once_per_shape() -> None:
    compiled_decodes_like_the_dynamic_loop("cpu", "")  # inductor's default mode: the CPU has no CUDA graphs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_compiled_static_cache_decodes_what_the_dynamic_one_does() -> None:
    compiled_decodes_like_the_dynamic_loop("cuda", None)  # the backend's own: reduce-overhead, CUDA graphs
