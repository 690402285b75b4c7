"""The vLLM backend against the HF backend and the learner (runs where vLLM is installed:
scripts/install_vllm_cpu.sh; the main venv skips this file)."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest
import torch

pytest.importorskip("vllm", reason="vLLM not installed (scripts/install_vllm_cpu.sh)")

from actors import modeling  # noqa: E402
from actors.generation.hf import HFBackend  # noqa: E402
from actors.generator import Generator  # noqa: E402
from actors.learner import Learner  # noqa: E402
from actors.verifier import Verifier  # noqa: E402
from actors.weight_transport import Endpoint, Link  # noqa: E402
from actors.weights import WeightMismatchError, export_state  # noqa: E402
from actors import batch as B  # noqa: E402
from orchestrator.config import validate_config  # noqa: E402
from orchestrator.data import arithmetic  # noqa: E402
from rl_step import train  # noqa: E402

pytestmark = pytest.mark.vllm

PROMPTS = ["12+7=", "3+45=", "Hello", "9+9="]


def make_config(tiny: dict | None = None, **rollout):
    return validate_config({
        "seed": 0, "model": {"tiny": tiny or {}},
        "rollout": {"backend": "vllm", "prompts_per_step": 4, "samples_per_prompt": 4, "max_new_tokens": 16,
                    **rollout},
        "rewards": [{"name": "integer_match"}], "train": {"threads": 1},
    })


def hf_backend(config, seed: int | None = None) -> HFBackend:
    model, tok = modeling.build(config.model, config.seed if seed is None else seed)
    return HFBackend(model, tok)


def greedy(backend, n_tokens: int = 16):
    out = backend.generate(PROMPTS, n=1, max_new_tokens=n_tokens, greedy=True)
    return np.split(out.response_ids, np.cumsum(out.response_lengths)[:-1]), out.finish_reason


def assert_same_greedy(vllm_backend, hf) -> list:
    (v_tokens, v_finish), (h_tokens, h_finish) = greedy(vllm_backend), greedy(hf)
    for i, (v, h) in enumerate(zip(v_tokens, h_tokens)):
        assert v.tolist() == h.tolist(), f"prompt {PROMPTS[i]!r}: vLLM {v.tolist()} != HF {h.tolist()}"
    assert v_finish == h_finish
    return v_tokens


@pytest.fixture(scope="module")
def tiny():
    """One Generator on the vLLM backend (one engine start for the module) and its config. It asks
    for sleep mode, which the CPU build lacks: the engine is built without it."""
    config = make_config(temperature=0.7, top_p=0.9, vllm_sleep_level=2)
    return Generator(config, None), config


def test_on_cpu_the_engine_cannot_sleep_and_sleeping_does_nothing(tiny):
    generator, config = tiny
    generator.update_weights(1, export_state(modeling.build(config.model, config.seed)[0], 1))
    assert generator.backend.can_sleep is False and generator.sleep() is False and not generator.asleep
    assert_same_greedy(generator.backend, hf_backend(config))  # the weights are still there


def test_greedy_equals_hf_on_the_tiny_model(tiny):
    generator, config = tiny
    generator.update_weights(1, export_state(modeling.build(config.model, config.seed)[0], 1))
    assert_same_greedy(generator.backend, hf_backend(config))


# ---- multi-turn episodes (docs/environments.md) -------------------------------------------------
class _Talkative:
    """Never done: observes `obs<k>` after turn k, so every episode runs to max_turns."""

    def __init__(self):
        self.k = 0

    def step(self, turn):
        from actors.envs.base import Step
        self.k += 1
        return Step(observation=f"obs{self.k}")

    @classmethod
    def step_batch(cls, envs, turns):
        return [e.step(t) for e, t in zip(envs, turns)]

    def stops(self):
        return []


def _episodes(backend, tokenizer, prompts, turns=3):
    from actors.envs.episodes import BackendPolicy, run_episodes
    from actors.envs.turns import turn_format

    fmt = turn_format(tokenizer, list(backend.eos_ids))
    ids = [np.asarray(i, np.int32) for i in tokenizer(prompts, add_special_tokens=False)["input_ids"]]
    return run_episodes(BackendPolicy(backend, fmt.ends, greedy=True), [_Talkative() for _ in prompts], ids, fmt,
                        tokenizer, max_turns=turns, max_tokens=60, turn_tokens=6, observation_tokens=8)


def test_greedy_episodes_through_vllm_lay_out_the_tokens_hf_lays_out(tiny):
    """(Before the tests that build engines of their own: closing one tears down vLLM's process-wide
    parallel state, which the module's engine then lacks.) Every turn after the first is generated from token ids (the earlier turns, markers and
    observations), through vLLM's prefix-cached engine: the same ids and masks as the HF backend."""
    generator, config = tiny
    generator.update_weights(1, export_state(modeling.build(config.model, config.seed)[0], 1))
    hf = hf_backend(config)
    got, want = _episodes(generator.backend, hf.tokenizer, PROMPTS), _episodes(hf, hf.tokenizer, PROMPTS)
    for g, w in zip(got, want):
        assert g.ids == w.ids and g.mask == w.mask and g.end == w.end == "max_turns"
        assert g.turns == 3 and not all(g.mask)
        np.testing.assert_allclose([x for x, m in zip(g.logprobs, g.mask) if m],
                                   [x for x, m in zip(w.logprobs, w.mask) if m], atol=2e-3)


def test_a_stop_string_gives_the_same_tokens_finish_reasons_and_text_as_hf(tiny):
    from test_stop_strings import two_token_stop

    generator, config = tiny
    hf = hf_backend(config)
    generator.update_weights(1, export_state(hf.model, 1))
    free = hf.generate(PROMPTS, n=1, max_new_tokens=16, greedy=True)
    stop = [two_token_stop(hf.decode(free.response_ids, free.response_lengths))[0]]
    v, h = (b.generate(PROMPTS, n=1, max_new_tokens=16, greedy=True, stop=stop) for b in (generator.backend, hf))
    assert "stop" in h.finish_reason and v.finish_reason == h.finish_reason
    assert v.response_lengths.tolist() == h.response_lengths.tolist()
    assert v.response_ids.tolist() == h.response_ids.tolist() and len(v.logprobs) == len(v.response_ids)
    assert v.texts == h.texts
    # vLLM's own detokenized text agrees with where coevo cuts it
    engine = generator.backend.engine
    ids = hf.tokenizer(PROMPTS, add_special_tokens=False)["input_ids"]
    own = engine.generate(ids, n=1, max_tokens=16, temperature=1.0, top_p=1.0, top_k=0, greedy=True,
                          stop_token_ids=hf.eos_ids, seed=None, stop=stop)
    assert [g[0].text for g in own] == v.texts
    # sampled, n=4: every sample a string ended stops at the token completing it, log-probs aligned
    stop = ["1", "e", "&"]
    out = generator.backend.generate(PROMPTS, n=4, max_new_tokens=16, temperature=1.0, stop=stop)
    assert len(out.logprobs) == out.response_lengths.sum()
    ended = 0
    for ids, text, why in zip(np.split(out.response_ids, np.cumsum(out.response_lengths)[:-1]), out.texts,
                              out.finish_reason):
        whole, before = (hf.tokenizer.decode(x, skip_special_tokens=True) for x in (ids, ids[:-1]))
        assert not any(s in before for s in stop), whole
        if why == "stop" and ids[-1] not in hf.eos_ids:
            ended += 1
            assert text == whole[:min(whole.find(s) for s in stop if s in whole)]
    assert ended > 0, "no sample met a stop string"


def test_after_a_weight_update_greedy_still_equals_hf_with_the_new_weights(tiny):
    generator, config = tiny
    hf_old, hf_new = hf_backend(config), hf_backend(config, seed=7)
    generator.update_weights(1, export_state(hf_old.model, 1))
    before = assert_same_greedy(generator.backend, hf_old)
    # a prompt's cached prefix must not survive the update: the same prompts again, new weights
    assert generator.update_weights(2, export_state(hf_new.model, 2)) == 2
    after = assert_same_greedy(generator.backend, hf_new)
    assert [a.tolist() for a in after] != [b.tolist() for b in before], "the update changed nothing"
    table, info = generator.generate(pa.table({"prompt_id": ["a"], "prompt": ["1+1="]}), seq=3)
    assert info["version"] == 2 and set(table.column("policy_version").to_pylist()) == {2}


def test_a_mismatched_update_is_refused_with_nothing_loaded(tiny):
    generator, config = tiny
    hf = hf_backend(config)
    generator.update_weights(1, export_state(hf.model, 1))
    other = export_state(hf_backend(config, seed=7).model, 2)
    bad = dict(other, state=dict(other["state"]))
    name = "model.layers.0.mlp.up_proj.weight"
    bad["state"][name] = bad["state"][name][:, :-1]
    del bad["state"]["model.norm.weight"]
    with pytest.raises(WeightMismatchError, match=r"missing 1 keys .*model\.norm\.weight.*up_proj\.weight: shape"):
        generator.update_weights(2, bad)
    with pytest.raises(WeightMismatchError, match="says version 2 but was sent as version 3"):
        generator.update_weights(3, other)
    assert generator.version == 1
    assert_same_greedy(generator.backend, hf)  # still the version-1 weights, all of them


def test_behaviour_logprobs_are_what_the_learner_recomputes(tiny):
    """Temperature 0.7, top-p 0.9: vLLM's processed log-probs are the learner's recomputation, so
    step 1 of a strict on-policy step has ratio 1 and clips nothing."""
    generator, config = tiny
    learner = Learner(config)
    generator.update_weights(1, export_state(learner.model, 1))
    prompts = arithmetic(1, ["+"], eval_size=10, seed=0).train.slice(0, 4)
    rollouts, _ = generator.generate(prompts, seq=0)
    assert rollouts.num_rows == 16 and set(rollouts.column("finish_reason").to_pylist()) <= {"stop", "length"}
    verifier = Verifier(config)
    try:
        table, _ = verifier.score(rollouts)
    finally:
        verifier.close()
    ids, mask, positions, r_ids, r_mask, p_width = learner._sequences(table)
    with torch.no_grad():
        lp = learner._token_logprobs(learner.model, ids, mask, positions, r_ids, p_width, **learner.sampling)
    old, _ = B.to_padded(table.column("behavior_logprobs"), 0.0, torch.float32)
    assert torch.allclose(lp * r_mask, old * r_mask, atol=1e-3), float(((lp - old) * r_mask).abs().max())
    # the same tokens read without temperature/top-p would not match: the log-probs are processed
    with torch.no_grad():
        plain = learner._token_logprobs(learner.model, ids, mask, positions, r_ids, p_width)
    assert not torch.allclose(plain * r_mask, old * r_mask, atol=1e-3)
    assert train(learner, table)["train/clip_frac"] == 0


def test_samples_are_seeded_per_request_and_differ_within_a_group(tiny):
    generator, _ = tiny
    prompts = pa.table({"prompt_id": ["a"], "prompt": ["12+7="]})
    first, _ = generator.generate(prompts, seq=5)
    again, _ = generator.generate(prompts, seq=5)
    assert first.column("response_ids").to_pylist() == again.column("response_ids").to_pylist()
    assert len({tuple(r) for r in first.column("response_ids").to_pylist()}) > 1


def test_what_the_backend_cannot_do_is_refused_by_name(tiny):
    generator, _ = tiny
    with pytest.raises(NotImplementedError, match="LaSeR.*use rollout.backend=hf"):
        generator.backend.generate(PROMPTS, n=1, max_new_tokens=2, next_token=3)
    with pytest.raises(NotImplementedError, match="judge.mode=yes_prob"):
        generator.backend.model


def test_a_collective_update_goes_through_the_same_in_place_load(tiny):
    """The collective transport (gloo on 127.0.0.1) installs a version into the engine as the object
    store does: greedy then equals HF with the sent weights."""
    generator, config = tiny
    hf_new = hf_backend(config, seed=11)
    sender = Endpoint()
    link = Link("policy", "g1", "127.0.0.1", sender.open("policy", "g1", "127.0.0.1", 60.0), 2, "gloo", 60.0, 1.0)
    errors = []

    def receive():
        try:
            generator.receive_weights(link, 1, 5)
        except Exception as e:  # noqa: BLE001  (handed back to the test)
            errors.append(e)
    thread = threading.Thread(target=receive)
    thread.start()
    sender.send(link, hf_new.model.state_dict(), 5)
    thread.join()
    assert errors == [] and generator.version == 5
    assert_same_greedy(generator.backend, hf_new)


def test_greedy_equals_hf_on_a_larger_random_init_config():
    # Last in the file: vLLM keeps its parallel state per process, and tearing this second engine down
    # resets it under the module's `tiny` engine (a Generator actor holds one engine per process).
    config = make_config({"hidden_size": 256, "num_layers": 6, "num_heads": 8, "num_kv_heads": 4,
                          "intermediate_size": 1024})
    generator = Generator(config, None)
    assert_same_greedy(generator.backend, hf_backend(config))


def test_a_vllm_generator_samples_episodes_seeded_per_request():
    config = validate_config({
        "seed": 0, "model": {"tiny": {}},
        "rollout": {"backend": "vllm", "prompts_per_step": 2, "samples_per_prompt": 3, "max_new_tokens": 6,
                    "temperature": 1.0},
        "env": {"name": "calculator", "max_turns": 2, "max_tokens": 24},
        "rewards": [{"name": "integer_match"}], "train": {"threads": 1},
    })
    generator = Generator(config, None)
    prompts = pa.table({"prompt_id": ["a", "b"], "prompt": ["12*7=", "3*45="]})
    first, info = generator.generate(prompts, seq=3)
    again, _ = generator.generate(prompts, seq=3)
    assert first.column("response_ids").to_pylist() == again.column("response_ids").to_pylist()
    for ids, mask in zip(first.column("response_ids").to_pylist(), first.column("loss_mask").to_pylist()):
        assert len(ids) == len(mask)
    assert info["env/episodes"] == 6
    # one seed per episode: the three episodes of a row do not all draw the same first turn
    rows = first.column("response_ids").to_pylist()
    assert len({tuple(r) for r in rows[:3]}) > 1
