"""rollout.stop on the HF backend: where a sample ends, what it keeps, and the text the verifier sees
(the vLLM backend against it: tests/test_vllm_backend.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from actors import modeling
from actors.generation.base import cut_at_stop
from actors.generation.hf import HFBackend
from actors.generator import Generator
from orchestrator.config import ConfigError, load_config, validate_config

PROMPTS = ["12+7=", "3+45=", "Hello", "9+9="]


def config(**rollout):
    return validate_config({"seed": 0, "rollout": {"max_new_tokens": 16, **rollout},
                            "rewards": [{"name": "integer_match"}], "train": {"threads": 1}})


def rows(out):
    ends = np.cumsum(out.response_lengths)[:-1]
    return np.split(out.response_ids, ends), np.split(out.logprobs, ends)


def two_token_stop(texts: list[str]) -> tuple[str, int]:
    """A two-character string (two tokens of the character tokenizer) that first occurs in row 0 at
    position k >= 1 and in no other row."""
    first = texts[0]
    for k in range(1, len(first) - 1):
        s = first[k:k + 2]
        if first.find(s) == k and not any(s in t for t in texts[1:]):
            return s, k
    raise AssertionError(f"no usable stop string in {texts}")


def test_a_stop_string_spanning_two_tokens_ends_its_sample_after_them():
    model, tok = modeling.build(config().model, 0)
    hf = HFBackend(model, tok)
    free = hf.generate(PROMPTS, n=1, max_new_tokens=16, greedy=True)
    texts = hf.decode(free.response_ids, free.response_lengths)
    assert free.texts is None and set(free.finish_reason) == {"length"}
    stop, k = two_token_stop(texts)

    out = hf.generate(PROMPTS, n=1, max_new_tokens=16, greedy=True, stop=[stop])
    (ids, lps), (free_ids, free_lps) = rows(out), rows(free)
    # row 0 keeps its tokens up to and including the one that completed the string, with their log-probs
    assert out.response_lengths.tolist() == [k + 2, 16, 16, 16]
    assert ids[0].tolist() == free_ids[0][:k + 2].tolist()
    assert len(out.logprobs) == len(out.response_ids) == sum(out.response_lengths)
    np.testing.assert_allclose(lps[0], free_lps[0][:k + 2], atol=1e-6)
    for a, b in zip(ids[1:], free_ids[1:]):  # the other samples ran on untouched
        assert a.tolist() == b.tolist()
    assert out.finish_reason == ["stop", "length", "length", "length"]
    # the text ends before the string (vLLM's include_stop_str_in_output=False); the tokens do not
    assert out.texts == [texts[0][:k], *texts[1:]]
    assert tok.decode(ids[0].tolist()) == texts[0][:k] + stop

    # through the Generator: the rollout table carries the cut text and the kept tokens
    generator = Generator(config(stop=[stop]), None)
    table, _ = generator.generate(pa.table({"prompt_id": list("abcd"), "prompt": PROMPTS}), greedy=True)
    assert table.column("response").to_pylist() == out.texts
    assert table.column("response_ids").to_pylist()[0] == ids[0].tolist()
    assert table.column("finish_reason").to_pylist() == out.finish_reason


def test_the_stop_string_that_completes_first_cuts_the_text():
    assert cut_at_stop("12 = 19\nok", ["\n", " = "]) == "12"  # " = " completes first
    assert cut_at_stop("abc", ["abc", "bc"]) == ""  # both complete at c: the first listed
    assert cut_at_stop("abc", ["bc", "abc"]) == "a"
    assert cut_at_stop("abc", ["x"]) == "abc"


@pytest.mark.parametrize("value, message", [
    ('[""]', r"rollout.stop\[0\] is '': stop strings must be non-empty"),
    ('["</a>", ""]', r"rollout.stop\[1\] is '': stop strings must be non-empty"),
    ("[3]", r"rollout.stop.0: Input should be a valid string \(got 3\)"),
])
def test_a_bad_stop_string_is_named(value, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [f"rollout.stop={value}"])
    assert load_config(None, ["rollout.stop=</a>"]).rollout.stop == ["</a>"]
