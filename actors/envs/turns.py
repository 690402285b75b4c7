"""The token ids around the turns of an episode, made once per tokenizer and added as ids (the
episode's earlier tokens are never decoded and re-encoded).

After an assistant turn the episode's context grows by

    [close]  open  <observation ids>  shut

- `ends`: the ids that end an assistant turn when the policy samples one (its EOS; a chat
  template's end-of-turn token). A turn that stopped otherwise (a tool call's closing tag, the
  turn's token limit) gets `close` first: the template's end of turn, which the policy did not
  sample (nothing without a template).
- `open` / `shut`: the markers around an observation, which end with whatever starts the next
  assistant turn.
- The observation's own ids: its text tokenised alone.

Without a chat template (the character tokenizer) the default turn format is plain text:
`<obs>OBSERVATION</obs>`, the assistant's turns in between, the answer ended by EOS:

    12*34=<calc>12*34</calc><obs>408</obs>408<eos>

With a chat template (`tokenizer.chat_template`, set by data.chat_template where that setting
exists), the markers are read off the template itself: a conversation of a user turn, an
assistant turn and a tool turn is rendered with marker texts in place of the contents, and what
surrounds the tool turn's content becomes `open` and `shut` (e.g. Qwen's `<|im_end|>` +
`\n<|im_start|>user\n<tool_response>\n` ... `\n</tool_response><|im_end|>\n<|im_start|>assistant\n`).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_OPEN, DEFAULT_SHUT = "<obs>", "</obs>"
_MARK_A, _MARK_T = "\u2063coevo-assistant\u2063", "\u2063coevo-tool\u2063"


class TurnFormatError(ValueError):
    """A chat template whose turn markers cannot be read off; the message says what it rendered."""


@dataclass
class TurnFormat:
    ends: list[int]  # ids that end an assistant turn when sampled
    close: list[int]  # appended after a turn that did not end with one of `ends`
    open: list[int]  # before an observation
    shut: list[int]  # after an observation (up to the next assistant turn's start)
    source: str = "default"  # "default" or "chat_template"

    @property
    def end(self) -> int:
        """The id a demonstrated turn ends with: the template's end of turn, else the first end id."""
        return self.close[0] if self.close else self.ends[0]

    def observation(self, tokenizer, text: str, ended: bool, limit: int | None = None) -> list[int]:
        """The ids appended after a turn (`ended`: it ended with one of `ends`): the observation's
        text tokenised alone, cut to its first `limit` tokens."""
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
        if limit is not None and len(ids) > limit:
            ids = ids[:limit]
        return ([] if ended else self.close) + self.open + list(ids) + self.shut


def turn_format(tokenizer, eos_ids: list[int]) -> TurnFormat:
    """The chat template's turn format where the tokenizer has one, else the plain default."""
    template = getattr(tokenizer, "chat_template", None)
    if template:
        return from_chat_template(tokenizer, template, eos_ids)
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    return TurnFormat(ends=list(eos_ids), close=[], open=ids(DEFAULT_OPEN), shut=ids(DEFAULT_SHUT))


def from_chat_template(tokenizer, template: str, eos_ids: list[int]) -> TurnFormat:
    """Read the turn markers off a chat template (see the module docstring)."""
    convo = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _MARK_A},
             {"role": "tool", "content": _MARK_T}]
    try:
        text = tokenizer.apply_chat_template(convo, tokenize=False, add_generation_prompt=True, chat_template=template)
    except Exception as e:  # jinja's TemplateError, a template's own raise_exception
        raise TurnFormatError(f"the chat template cannot render a tool turn (role 'tool'): {e}") from None
    if _MARK_A not in text or _MARK_T not in text or text.index(_MARK_A) > text.index(_MARK_T):
        raise TurnFormatError(f"the chat template's rendering of a tool turn lost its content: {text[-300:]!r}")
    between = text.split(_MARK_A, 1)[1].split(_MARK_T, 1)[0]
    after = text.split(_MARK_T, 1)[1]
    ids = tokenizer(between, add_special_tokens=False)["input_ids"]
    special = set(getattr(tokenizer, "all_special_ids", [])) | set(tokenizer.get_added_vocab().values())
    k = 0
    while k < len(ids) and ids[k] in special and ids[k] in set(eos_ids) | {ids[0]}:
        k += 1  # the end-of-turn run the policy may sample (or that `close` adds)
    close = ids[:k]
    ends = sorted(set(eos_ids) | set(close[:1]))
    return TurnFormat(ends=ends, close=close, open=ids[k:],
                      shut=tokenizer(after, add_special_tokens=False)["input_ids"], source="chat_template")
