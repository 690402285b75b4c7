"""An environment's demonstrations as training sequences: the scripted episodes
(`Environment.demonstrate`, played by episodes.ScriptedPolicy against the real environment) laid
out exactly as the generator lays out an episode: prompt ids, then every turn's and observation's
ids, with the policy's tokens marked. The SFT warm-up trains on the marked tokens only (the
observations are the environment's, never a target)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from actors.envs.episodes import Episode, ScriptedPolicy, run_episodes
from actors.envs.make import make_environment
from actors.envs.turns import turn_format


def demonstrations(config, tokenizer, rows: pa.Table) -> list[Episode]:
    """One demonstrated episode per row of `rows` (prompt, answer and the environment's columns).
    A demonstration the environment does not end (a limit cut it, or it raised) is refused, naming
    the row: a warm-up must not teach a truncated protocol."""
    env = config.env
    fmt = turn_format(tokenizer, sorted({tokenizer.eos_token_id}))
    records = rows.to_pylist()
    envs = [make_environment(env, r) for r in records]
    prompts = [np.asarray(ids, np.int32) for ids in
               tokenizer([r["prompt"] for r in records], add_special_tokens=False)["input_ids"]]
    try:
        episodes = run_episodes(ScriptedPolicy(tokenizer, fmt), envs, prompts, fmt, tokenizer, env.max_turns,
                                env.max_tokens, env.max_tokens, env.observation_tokens)
    finally:
        for e in envs:
            e.close()
    for r, ep in zip(records, episodes):
        if ep.end != "done":
            raise ValueError(f"env {env.name!r}: the demonstration of the row with prompt {r['prompt']!r} ended with "
                             f"{ep.end!r}{': ' + ep.error if ep.error else ''}, not done (raise env.max_turns or "
                             "env.max_tokens)")
    return episodes
