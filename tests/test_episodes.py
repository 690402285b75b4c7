"""Multi-turn episodes, token-in/token-out (actors/envs/episodes.py), with a scripted environment and
a stub policy: the ids of earlier turns are never changed, the loss mask is True exactly on the
policy's tokens, turn markers come from the turn format (the plain default or a chat template's),
and episodes end at done, max_turns, the token budget or the model's context. Malformed tool
calls are error observations; an environment that raises ends its episodes, not the call."""

from __future__ import annotations

import numpy as np
import pytest

from actors import modeling
from actors.envs.base import Environment, Step
from actors.envs.episodes import BackendPolicy, ScriptedPolicy, Turn, run_episodes
from actors.envs.turns import TurnFormat, turn_format

TOK = modeling.char_tokenizer()
EOS = TOK.eos_token_id


def ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


class Scripted(Environment):
    """Observes `obs<k>` after turn k and is done after `done_after` turns; rewards 0.5 a turn."""

    def __init__(self, row: dict, done_after: int = 3):
        super().__init__(row)
        self.done_after, self.k = done_after, 0

    def step(self, turn: str) -> Step:
        self.k += 1
        return Step(observation=f"obs{self.k}", reward=0.5, done=self.k >= self.done_after)


class Stub:
    """Answers turn k of context i with `turns[i][k]` (ids), recording every context it was given."""

    def __init__(self, turns: list[list[list[int]]]):
        self.turns, self.contexts, self.k = turns, [], {}

    def sample(self, contexts, limits, stops):
        self.contexts.append([c.tolist() for c in contexts])
        out = []
        for c, limit in zip(contexts, limits):
            i = next(j for j, t in enumerate(self.turns) if self._owner(c, j))
            k = self.k.get(i, 0)
            self.k[i] = k + 1
            tok = self.turns[i][k][:limit]
            out.append(Turn(np.asarray(tok, np.int32), np.full(len(tok), -0.25 - i, np.float32),
                            len(tok) == len(self.turns[i][k])))
        return out

    def _owner(self, context, j) -> bool:
        return context[0] == 10 + j  # every prompt starts with its own first id


def fmt() -> TurnFormat:
    return turn_format(TOK, [EOS])


def test_the_token_layout_keeps_earlier_turns_and_masks_exactly_the_policys_tokens():
    prompts = [np.asarray([10, 4, 5]), np.asarray([11, 6])]
    turns = [[ids("ab") + [EOS], ids("cde") + [EOS], ids("f") + [EOS]],
             [ids("xy") + [EOS], ids("z") + [EOS], ids("w") + [EOS]]]
    stub = Stub(turns)
    f = fmt()
    episodes = run_episodes(stub, [Scripted({}), Scripted({}, done_after=2)], prompts, f, TOK, max_turns=5,
                            max_tokens=200, turn_tokens=10)
    a, b = episodes
    block = lambda k: f.open + ids(f"obs{k}") + f.shut  # noqa: E731  (the turn ended with EOS: no close)
    assert a.ids == turns[0][0] + block(1) + turns[0][1] + block(2) + turns[0][2]
    assert a.mask == [True] * 3 + [False] * len(block(1)) + [True] * 4 + [False] * len(block(2)) + [True] * 2
    assert b.ids == turns[1][0] + block(1) + turns[1][1] and b.end == "done" and b.turns == 2
    assert a.end == "done" and a.turns == 3 and a.rewards == [0.5] * 3 and a.reward == 1.5
    # behaviour log-probs on the policy's tokens, 0 on the environment's
    assert [lp for lp, m in zip(a.logprobs, a.mask) if m] == [-0.25] * 9
    assert all(lp == 0.0 for lp, m in zip(a.logprobs, a.mask) if not m)
    # each turn's context extends the one before by ids only: the prompt and earlier turns as they were
    first, second = stub.contexts[0][0], stub.contexts[1][0]
    assert first == prompts[0].tolist() and second[:len(first)] == first
    assert second == first + turns[0][0] + block(1)
    assert [t for t in a.turn_ends] == [2, 2 + len(block(1)) + 4, len(a.ids) - 1]
    assert a.texts == ["ab", "cde", "f"] and a.answer == "f"
    assert f.open == ids("<obs>") and f.shut == ids("</obs>") and f.close == []


def test_max_turns_and_the_token_budget_end_episodes():
    f = fmt()
    block = len(f.open) + len(ids("obs1")) + len(f.shut)

    def one(turn: list[int], **limits):
        (ep,) = run_episodes(Stub([[turn] * 5]), [Scripted({}, done_after=99)], [np.asarray([10, 4])], f, TOK,
                             **{"max_turns": 5, "max_tokens": 500, "turn_tokens": 20, **limits})
        assert len(ep.ids) == len(ep.mask) == len(ep.logprobs)
        return ep

    ep = one(ids("a") + [EOS], max_turns=2)
    assert ep.end == "max_turns" and ep.turns == 2
    # a turn of 9 against a budget of 6: cut at 6 (its turn text is what the verifiers see)
    ep = one(ids("abcdefgh") + [EOS], max_tokens=6)
    assert ep.end == "token_budget" and ep.turns == 1 and ep.ids == ids("abcdef") and ep.answer == "abcdef"
    # the turn fits, its observation and a token of the next turn do not
    ep = one(ids("ab") + [EOS], max_tokens=3 + block)
    assert ep.end == "token_budget" and ep.turns == 1 and len(ep.ids) == 3
    # room for one observation, and the next turn is cut to what is left of the budget
    ep = one(ids("ab") + [EOS], max_tokens=3 + block + 2)
    assert ep.end == "token_budget" and ep.turns == 2 and len(ep.ids) == 3 + block + 2 and ep.mask[-2:] == [True] * 2
    # the model's context (prompt 2 + turn 3 + observation + 1) bounds it the same way
    ep = one(ids("ab") + [EOS], context=2 + 3 + block + 1)
    assert ep.end == "token_budget" and len(ep.ids) == 3 + block + 1


def test_a_turn_cut_by_a_stop_string_gets_the_formats_close_ids():
    f = TurnFormat(ends=[EOS], close=[3], open=ids("["), shut=ids("]"))
    stub = Stub([[ids("<c>1</c>"), ids("2") + [EOS]]])
    (ep,) = run_episodes(stub, [Scripted({}, done_after=2)], [np.asarray([10])], f, TOK, 4, 100, 20)
    assert ep.ids == ids("<c>1</c>") + [3] + ids("[obs1]") + ids("2") + [EOS]
    assert ep.mask == [True] * 8 + [False] * 7 + [True] * 2


def test_an_environment_that_raises_ends_its_episodes_with_env_error():
    class Broken(Scripted):
        def step(self, turn):
            raise KeyError("boom")

    stub = Stub([[ids("a") + [EOS]], [ids("b") + [EOS]]])
    a, b = run_episodes(stub, [Broken({}), Scripted({}, done_after=1)], [np.asarray([10]), np.asarray([11])], fmt(),
                        TOK, 3, 50, 5)
    assert a.end == "env_error" and "KeyError" in a.error and b.end == "done"


def test_malformed_and_unknown_calls_are_error_observations():
    from actors.envs import ENVIRONMENTS

    calc = ENVIRONMENTS.get("calculator")
    cases = {"<calc>1+2": "is not closed", "1+2</calc>": "without <calc>", "<calc>1+</calc>": "cannot parse",
             "<calc>__import__('os')</calc>": "only numbers", "<calc>9**99999</calc>": "exponents",
             "<calc>1/0</calc>": "division by zero"}
    for turn, message in cases.items():
        step = calc({"prompt": "1+2="}).step(turn)
        assert not step.done and step.errors == 1 and message in step.observation, (turn, step)
    hermes = calc({"prompt": "1+2="}, tool_format="hermes")
    for turn, message in {'<tool_call>{"name": "calc", "arguments": {"expression": "2*3"}}</tool_call>': "6",
                          "<tool_call>{nope}</tool_call>": "not JSON", '<tool_call>{"name": "sh"}</tool_call>':
                          "no tool named 'sh'", '<tool_call>{"name": "calc", "arguments": {"x": 1}}</tool_call>':
                          "'expression' is a required property", "<tool_call>": "not closed"}.items():
        assert message in hermes.step(turn).observation, turn
    unavailable = calc({"prompt": "1+2="}, available=False).step("<calc>1+2</calc>")
    assert unavailable.observation == "error: calc is not available in this episode" and unavailable.errors == 1
    done = calc({"prompt": "1+2=", "answer": "3"}, score=True).step("3")
    assert done.done and done.reward == 1.0 and done.observation is None


def test_the_key_value_store_keeps_its_writes_within_an_episode():
    from actors.envs import ENVIRONMENTS

    kv = ENVIRONMENTS.get("kv_store")
    row = {"prompt": "?", "answer": "7", "store": '{"a": "3"}', "key": "a"}
    env = kv(row)
    assert env.step("<get>b</get>").observation == "error: no key 'b'"
    assert env.step("<set>b=7</set><get>b</get>").observation == "ok\n7"
    assert kv(row).step("<get>b</get>").observation == "error: no key 'b'"  # a new episode: a fresh store
    assert env.step("7").reward == 1.0 and kv(row).step("3").reward == 0.0
    with pytest.raises(ValueError, match="'store' column"):
        kv({"prompt": "?"})


def test_scripted_demonstrations_play_the_protocol():
    from actors.envs import ENVIRONMENTS

    env = ENVIRONMENTS.get("calculator")({"prompt": "12*34=", "answer": "408"})
    f = fmt()
    (ep,) = run_episodes(ScriptedPolicy(TOK, f), [env], [np.asarray(ids("12*34="))], f, TOK, 3, 100, 100)
    assert TOK.decode(ep.ids, skip_special_tokens=False) == "<calc>12*34</calc><obs>408</obs>408<eos>"
    assert ep.end == "done" and ep.calls == 1 and ep.errors == 0
    assert [TOK.decode([i]) for i, m in zip(ep.ids, ep.mask) if not m] == list("<obs>408</obs>")


QWEN_LIKE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def chat_tokenizer():
    tok = modeling.char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = QWEN_LIKE
    return tok


def test_a_chat_templates_turn_markers_render_the_conversation_the_template_renders():
    """Token-in/token-out with a chat template: the ids the episode adds are the template's own
    rendering of the whole conversation, though nothing was rendered or re-tokenised whole."""
    from actors.envs import ENVIRONMENTS

    tok = chat_tokenizer()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    f = turn_format(tok, [tok.eos_token_id])
    assert f.source == "chat_template" and f.close == [im_end] and im_end in f.ends
    prompt = tok.apply_chat_template([{"role": "user", "content": "12*34="}], tokenize=False, add_generation_prompt=True)
    env = ENVIRONMENTS.get("calculator")({"prompt": "12*34=", "answer": "408"}, tool_format="hermes")
    p_ids = np.asarray(tok(prompt, add_special_tokens=False)["input_ids"])
    (ep,) = run_episodes(ScriptedPolicy(tok, f), [env], [p_ids], f, tok, 3, 400, 200)
    call = env.format.render("calc", {"expression": "12*34"}, env.tools)
    whole = tok.apply_chat_template([{"role": "user", "content": "12*34="}, {"role": "assistant", "content": call},
                                     {"role": "tool", "content": "408"}, {"role": "assistant", "content": "408"}],
                                    tokenize=False)
    # the demonstration's answer ends with the format's first end id: the template's <|im_end|> here
    assert tok.decode(p_ids.tolist() + ep.ids, skip_special_tokens=False) == whole.rstrip("\n")
    # the call ended at its stop string: <|im_end|> was added by the format (masked), the answer's sampled
    policy = [i for i, m in zip(ep.ids, ep.mask) if m]
    assert policy.count(im_end) == 1 and policy[-1] == im_end


def test_a_backend_policy_cuts_each_turn_at_its_own_limit():
    class Backend:
        def generate_ids(self, contexts, max_new_tokens, stop, **sampling):
            from actors.generation.base import Samples
            n = len(contexts)
            return Samples(prompt_ids=contexts, response_ids=np.arange(n * 6, dtype=np.int32) % 50 + 3,
                           response_lengths=np.full(n, 6), logprobs=np.full(n * 6, -1.0, np.float32),
                           finish_reason=["stop"] * n)

    turns = BackendPolicy(Backend(), [EOS]).sample([np.asarray([1]), np.asarray([2])], [6, 4], [])
    assert [len(t.ids) for t in turns] == [6, 4] and [t.stopped for t in turns] == [True, False]
