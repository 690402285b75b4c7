"""Cache keys and markers of the stages (orchestrator.stages): a stage's output directory is named
by a hash of everything that changes its result, and is a cache hit once its marker is written."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def cache_key(config, extra: dict | None = None) -> str:
    """Everything that changes the warm model (not where the cache lives)."""
    # a kernel choice left at transformers' default is not in the key, so keys made before the
    # setting existed still hit; a chosen kernel changes the warm model's rounding, so it is. The same
    # for model.dtype (the generator's, which evaluates the warm-up): auto is out, a chosen one in
    unset = {k for k, v in (("attn_implementation", None), ("dtype", "auto"), ("bpe", None))
             if getattr(config.model, k) == v}
    model = config.model.model_dump(exclude=unset or None)
    # settings added later are in the key only where set, so the keys made before them still hit: the
    # data settings of chat templates and the math_word task where unused, arithmetic's sample and
    # operator_digits, warmup.data
    data_unset = {k for k, v in (("chat_template", "auto"), ("system_prompt", None)) if getattr(config.data, k) == v}
    data_unset |= {task for task in ("math_word", "sorting") if config.data.task != task}
    data = config.data.model_dump(exclude={"analogs", *data_unset})
    _drop_unset(data)
    warmup = config.warmup.model_dump(exclude={"cache", "cache_dir"} | ({"data"} if config.warmup.data is None else set()))
    if warmup.get("data"):
        _drop_unset(warmup["data"])
    key = {"model": model, "data": data,
           "seed": config.seed,
           "warmup": warmup,
           "files": [_stamp(p) for p in (config.data.path, config.data.eval_path, config.model.path) if p],
           **(extra or {})}
    if config.env.name is not None:  # the warm-up trains on the environment's demonstrations
        key["env"] = config.env.model_dump()
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _drop_unset(data: dict) -> None:
    for key, unset in (("sample", None), ("operator_digits", {})):
        if data["arithmetic"].get(key, unset) == unset:
            data["arithmetic"].pop(key, None)


def _stamp(path: str) -> list:
    """An edited dataset or model directory must not reuse a stale warm model."""
    st = Path(path).expanduser().stat()
    return [str(Path(path).expanduser().resolve()), st.st_size, st.st_mtime_ns]


def stage_path(config, kind: str, source: str | None, label: str | None, extra: dict) -> Path:
    """Cache directory of a warm-up stage that fine-tunes `source` (the previous stage's model) on
    samples labelled by the verifier source `label`: everything that changes its result is in the key."""
    spec = next((r.model_dump() for r in config.rewards if r.name == label), None)
    return (Path(config.warmup.cache_dir).expanduser().parent / kind /
            cache_key(config, {"kind": kind, "source": source, "label": spec, "rollout": config.rollout.model_dump(),
                               "verifier_fraction": config.verifier.fraction, **probe_key(config), **extra}))


def probe_key(config) -> dict:
    """`verifier.probe_share` in a warm-up's key where it is set (keys made before it existed still hit)."""
    share = config.verifier.probe_share
    return {"verifier_probe_share": share} if share else {}


def read_marker(path: Path, marker: str) -> dict | None:
    """The info of a finished stage whose output is at `path` (None: not there)."""
    if (Path(path) / marker).is_file():
        return json.loads((Path(path) / marker).read_text())
    return None


async def save_stage(learner, path: Path, marker: str, info: dict) -> dict:
    """Save a warm-up stage's model where the next stage or the run loads it, and its info last (the
    marker that makes it a cache hit)."""
    await learner.call("save", str(path), False, table=False)
    (Path(path) / marker).write_text(json.dumps(info))
    return info


def fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"
