"""Chat templates: conversational prompts rendered by the tokenizer's own template (with the
generation prompt added), the template's end-of-turn tokens as stop tokens, and the question a
judge reads out of a conversation.

`data.chat_template` picks the template: `auto` (the tokenizer's, where it has one), `none` (prompts
are raw text) or the path of a Jinja file. The driver renders every prompt once
(orchestrator/chat_data.py); the generator tokenises the rendered text with
`add_special_tokens=False`, which is what `apply_chat_template(..., tokenize=True)` does, and the
learner trains on the token ids the generator returned: nothing is decoded and re-encoded between
sampling and training.
"""

from __future__ import annotations

from pathlib import Path

MARK = "\u2063coevo-end-of-turn\u2063"  # text no template changes, to find what follows an assistant turn


class ChatTemplateError(ValueError):
    """A chat template that cannot be read or cannot render the data; the message names the setting."""


def template_for(tokenizer, setting: str) -> str | None:
    """The Jinja template `setting` (data.chat_template) picks for `tokenizer`, or None (raw prompts)."""
    if setting == "none":
        return None
    if setting == "auto":
        return getattr(tokenizer, "chat_template", None) or None
    path = Path(setting).expanduser()
    if not path.is_file():
        raise ChatTemplateError(f"data.chat_template {setting!r}: no such file (give auto, none or the path "
                                "of a Jinja chat template)")
    return path.read_text(encoding="utf-8")


def configure(tokenizer, setting: str) -> str | None:
    """Set `tokenizer.chat_template` to the template in force (None with `none`), so every role that
    holds this tokenizer renders and stops with the same one. Returns it."""
    template = template_for(tokenizer, setting)
    tokenizer.chat_template = template
    return template


def clean(messages: list[dict]) -> list[dict]:
    """Messages as templates expect them: keys whose value is missing (Arrow fills a struct field
    one message lacks with null) are left out."""
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def render(tokenizer, messages: list[dict], template: str) -> str:
    """The prompt text of a conversation, ending with the template's generation prompt."""
    try:
        return tokenizer.apply_chat_template(clean(messages), tokenize=False, add_generation_prompt=True,
                                             chat_template=template)
    except Exception as e:  # jinja's TemplateError, a template's own raise_exception
        raise ChatTemplateError(f"the chat template could not render {clean(messages)!r}: {e}") from None


def end_of_turn_ids(tokenizer, template: str | None) -> list[int]:
    """The special tokens the template writes right after an assistant message (Qwen's `<|im_end|>`,
    Llama-3's `<|eot_id|>`), in order; [] without a template or where it writes none."""
    if not template:
        return []
    convo = [{"role": "user", "content": "x"}, {"role": "assistant", "content": MARK}]
    try:
        text = tokenizer.apply_chat_template(convo, tokenize=False, chat_template=template)
    except Exception:  # a template that refuses this conversation (one that needs a system turn...)
        return []
    if MARK not in text:
        return []
    after = text.split(MARK, 1)[1]
    special = set(getattr(tokenizer, "all_special_ids", [])) | set(tokenizer.get_added_vocab().values())
    ids = tokenizer(after, add_special_tokens=False)["input_ids"]
    found: list[int] = []
    for i in ids:
        if i in special and i not in found:
            found.append(i)
        elif found:  # the end-of-turn run is over (a newline after it is not a stop token)
            break
    return found


def stop_token_ids(generation_config, tokenizer) -> list[int]:
    """Every token that ends a response: the model's generation_config eos ids (several allowed),
    the tokenizer's eos, and the end-of-turn tokens of its chat template (set by `configure`)."""
    eos = generation_config.eos_token_id if generation_config is not None else None
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id is not None:
        eos.append(tokenizer.eos_token_id)
    eos += end_of_turn_ids(tokenizer, getattr(tokenizer, "chat_template", None))
    return sorted(set(eos))


def answer_end_id(tokenizer) -> int:
    """The token a supervised answer ends with: the template's first end-of-turn token where a chat
    template is in force (what the generator stops at), else the tokenizer's eos."""
    ends = end_of_turn_ids(tokenizer, getattr(tokenizer, "chat_template", None))
    return ends[0] if ends else tokenizer.eos_token_id


def question(messages: list[dict] | None, prompt: str) -> str:
    """What a judge is shown as the question: the last user message of a conversation, else `prompt`."""
    for m in reversed(messages or []):
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            return m["content"]
    return prompt
