"""Conversational datasets: reading a row's conversation (a `messages` column, or `prompt` given as a
list of {role, content} messages), and rendering every prompt once, on the driver, with the chat
template of the run's model (data.chat_template, data.system_prompt). The rendered text becomes the
row's `prompt` (what the generator tokenises); the conversation stays in `messages`, which reaches
reward functions like any dataset column. A `model.bpe` model directory is made here first (its
tokenizer is trained on the task's text)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pyarrow as pa

from actors import chat
from orchestrator.prompt_set import DatasetError, PromptSet

MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


def conversation_columns(table: pa.Table, path: Path) -> pa.Table:
    """Check a dataset's prompt columns: `prompt` as text, or a conversation in `messages` (or in
    `prompt`, moved to `messages`). A conversation row's `prompt` is its last user message until the
    chat template renders it. Errors name the file, row and field."""
    names = table.schema.names
    where = f"dataset file {str(path)!r}"
    prompt_type = table.schema.field("prompt").type if "prompt" in names else None
    if prompt_type is not None and pa.types.is_list(prompt_type):
        if "messages" in names:
            raise DatasetError(f"{where} has both 'messages' and a 'prompt' list of messages; keep one")
        table = table.rename_columns(["messages" if n == "prompt" else n for n in names])
        names = table.schema.names
    if "messages" not in names:
        if "prompt" not in names:
            raise DatasetError(f"{where} has no 'prompt' or 'messages' column (columns: {names})")
        if not pa.types.is_string(prompt_type):
            raise DatasetError(f"{where}: column 'prompt' must be text or a list of {{role, content}} messages, "
                               f"got {prompt_type}")
        _no_nulls(table, "prompt", where)
        return table
    if "prompt" in names:
        raise DatasetError(f"{where} has both 'messages' and a 'prompt' text column; keep one (a conversation's "
                           "prompt is rendered from its messages by the chat template)")
    _no_nulls(table, "messages", where)
    conversations = table.column("messages").to_pylist()
    for row, messages in enumerate(conversations):
        _check_messages(messages, f"{where} row {row}")
    clean = [[{"role": m["role"], "content": m["content"]} for m in c] for c in conversations]
    extra = _extra_keys(conversations)
    if extra:
        raise DatasetError(f"{where}: messages carry {sorted(extra)}; coevo keeps role and content only (drop "
                           "those keys, or render the prompts yourself into a 'prompt' text column)")
    table = table.set_column(table.schema.get_field_index("messages"), "messages", pa.array(clean, MESSAGES))
    return table.append_column("prompt", pa.array([chat.question(c, "") for c in clean], pa.string()))


def check_prompt_field(row: dict, where: str) -> None:
    """One JSONL row's prompt: `prompt` text, or a conversation in `messages` or `prompt`."""
    key = "messages" if "messages" in row else "prompt"
    if key not in row:
        raise DatasetError(f"{where}: row has no 'prompt' or 'messages' field (keys: {sorted(row)})")
    value = row[key]
    if value is None:
        raise DatasetError(f"{where}: {key!r} is null; give it a value or drop the row")
    if isinstance(value, list):
        _check_messages(value, where)
    elif key == "messages" or not isinstance(value, str):
        raise DatasetError(f"{where}: {key!r} must be {'a list of messages' if key == 'messages' else 'a string or a list of {role, content} messages'}, got {value!r}")


def _no_nulls(table: pa.Table, col: str, where: str) -> None:
    if table.column(col).null_count:
        import numpy as np
        row = int(np.nonzero(table.column(col).is_null().to_numpy(zero_copy_only=False))[0][0])
        raise DatasetError(f"{where} row {row}: {col!r} is missing or null")


def _check_messages(messages, where: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise DatasetError(f"{where}: 'messages' must be a non-empty list of {{role, content}} messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DatasetError(f"{where}: message {i} must have text 'role' and 'content', got {m!r}")
    if messages[-1]["role"] == "assistant":
        raise DatasetError(f"{where}: the last message is the assistant's; a prompt ends with the turn the "
                           "model answers (the generation prompt follows it)")


def _extra_keys(conversations: list) -> set:
    return {k for c in conversations for m in c for k, v in m.items() if k not in ("role", "content") and v is not None}


# ---- rendering --------------------------------------------------------------------------------
def apply_chat(prompts: PromptSet, data_cfg, model_cfg, seed: int) -> PromptSet:
    """Render every prompt with the chat template in force; make the model.bpe directory first."""
    from actors import modeling

    if model_cfg.bpe is not None:
        made = str(bpe_model_dir(prompts, data_cfg, model_cfg, seed))
        model_cfg.bpe = None  # the run goes on with the made directory as its model.path
        model_cfg.path = made
    tokenizer = modeling.load_tokenizer(model_cfg.path) if model_cfg.path else modeling.char_tokenizer()
    try:
        template = chat.configure(tokenizer, data_cfg.chat_template)
    except chat.ChatTemplateError as e:
        raise DatasetError(str(e)) from None
    conversational = "messages" in prompts.train.schema.names
    if conversational and data_cfg.prompt_template != "{prompt}":
        raise DatasetError("data.prompt_template applies to text prompts; the dataset's prompts are conversations "
                           "(messages): put the wording in the messages, or leave data.prompt_template at '{prompt}'")
    if template is None:
        if conversational or data_cfg.system_prompt:
            what = "the dataset's prompts are conversations (messages)" if conversational else "data.system_prompt is set"
            why = ("data.chat_template=none" if data_cfg.chat_template == "none" else
                   f"the tokenizer of {model_cfg.path or 'the built-in tiny model'} has no chat template")
            raise DatasetError(f"{what}, but {why}: give data.chat_template=<a Jinja template file>")
        return prompts
    for split in ("train", "eval"):
        setattr(prompts, split, _rendered(getattr(prompts, split), tokenizer, template, data_cfg.system_prompt))
    return prompts


def _rendered(table: pa.Table, tokenizer, template: str, system: str | None) -> pa.Table:
    if "messages" in table.schema.names:
        conversations = table.column("messages").to_pylist()
        if system:
            conversations = [c if c[0]["role"] == "system" else [{"role": "system", "content": system}, *c]
                             for c in conversations]
    else:
        head = [{"role": "system", "content": system}] if system else []
        conversations = [head + [{"role": "user", "content": p}] for p in table.column("prompt").to_pylist()]
    try:
        texts = [chat.render(tokenizer, c, template) for c in conversations]
    except chat.ChatTemplateError as e:
        raise DatasetError(str(e)) from None
    table = table.drop_columns([c for c in ("messages",) if c in table.schema.names])
    table = table.set_column(table.schema.get_field_index("prompt"), "prompt", pa.array(texts, pa.string()))
    return table.append_column("messages", pa.array(conversations, MESSAGES))


# ---- model.bpe ----------------------------------------------------------------------------------
def task_texts(prompts: PromptSet, system: str | None) -> list[str]:
    """The training split's text a BPE tokenizer learns from: prompts, answers, solutions, the system
    prompt and the chat roles."""
    t = prompts.train
    texts = [system or "", "system", "user", "assistant"]
    if "messages" in t.schema.names:
        texts += [m["content"] for c in t.column("messages").to_pylist() for m in c]
    else:
        texts += t.column("prompt").to_pylist()
    for col in ("answer", "solution"):
        if col in t.schema.names:
            texts += [str(x) for x in t.column(col).to_pylist()]
    return texts


def bpe_model_dir(prompts: PromptSet, data_cfg, model_cfg, seed: int) -> Path:
    """The model.bpe directory for this task's text, made once and cached (atomically: runs that
    make it at the same time leave one)."""
    from actors import local_model

    bpe, tiny = model_cfg.bpe, model_cfg.tiny
    texts = task_texts(prompts, data_cfg.system_prompt)
    digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()
    key = hashlib.sha256(json.dumps({"texts": digest, "bpe": bpe.model_dump(exclude={"cache_dir"}),
                                     "tiny": tiny.model_dump(), "seed": seed}, sort_keys=True).encode()).hexdigest()[:16]
    out = Path(bpe.cache_dir).expanduser() / f"bpe-{key}"
    if (out / "config.json").is_file():
        return out
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    local_model.build(tmp, texts, vocab_size=bpe.vocab_size, hidden_size=tiny.hidden_size, num_layers=tiny.num_layers,
                      num_heads=tiny.num_heads, num_kv_heads=tiny.num_kv_heads,
                      intermediate_size=tiny.intermediate_size, init_std=tiny.init_std, seed=seed,
                      pad_token=bpe.pad_token)
    try:
        os.replace(tmp, out)
    except OSError:  # another run made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return out
