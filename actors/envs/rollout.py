"""A generator's rollouts as episodes: n episodes per prompt row, each with its own environment,
into the rollout batch (actors/batch.py), one row per episode.

- `prompt_ids`: the prompt; `response_ids`: everything after it (every turn and observation), with
  `loss_mask` True on the policy's tokens only and `behavior_logprobs` 0 on the others;
- `response`: the last turn's text (what the verifiers score: the answer); `transcript`: the whole
  episode's text after the prompt, markers included;
- `turns`, `tool_calls`, `tool_errors`, `episode_end` (done / max_turns / token_budget /
  env_error), `env_error`, `turn_rewards` (one per turn, null where none was given);
- `finish_reason`: stop when the environment ended the episode, length when a limit did, error when
  the environment raised;
- each `env: true` reward source: `reward.<name>`, the episode's summed rewards (null, with
  `reward_error.<name>`, where the environment gave none); with env.turn_rewards, the per-turn
  rewards at each turn's last token in `token_rewards.<name>` instead (the aggregation's process
  sources: the credit step turns them into per-token advantages).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from actors import batch as B
from actors.envs.episodes import BackendPolicy, run_episodes, summary
from actors.envs.make import make_environment
from actors.envs.turns import turn_format
from actors.rewards.aggregate import TOKEN_REWARD_PREFIX


class EpisodeRollouts:
    """Built once per generator: the turn format of its tokenizer, the environment settings."""

    def __init__(self, config, backend, context: int | None):
        self.env = config.env
        self.rollout = config.rollout
        self.backend = backend
        self.tokenizer = backend.tokenizer
        self.format = turn_format(self.tokenizer, list(backend.eos_ids))
        self.context = context
        self.sources = [r.name for r in config.rewards if r.kind == "env"]

    def generate(self, prompts: pa.Table, n: int, greedy: bool, tag: str, version: int) -> tuple[pa.Table, dict]:
        cfg = self.rollout
        rows = prompts.to_pylist()
        repeat = np.repeat(np.arange(prompts.num_rows), n)
        sample = np.tile(np.arange(n), prompts.num_rows)
        texts = [r["prompt"] for r in rows]
        encoded = [np.asarray(ids, np.int32) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]
        envs = [make_environment(self.env, rows[i]) for i in repeat]
        policy = BackendPolicy(self.backend, self.format.ends, cfg.temperature, cfg.top_p, cfg.top_k, greedy)
        try:
            episodes = run_episodes(policy, envs, [encoded[i] for i in repeat], self.format, self.tokenizer,
                                    self.env.max_turns, self.env.max_tokens, cfg.max_new_tokens,
                                    self.env.observation_tokens, self.context)
        finally:
            for e in envs:
                e.close()
        lengths = np.array([len(e.ids) for e in episodes], dtype=np.int64)
        flat = lambda key, dtype: np.asarray([x for e in episodes for x in getattr(e, key)], dtype=dtype)  # noqa: E731
        extra = {name: prompts.column(name).take(repeat) for name in prompts.schema.names
                 if name not in ("prompt_id", "prompt")}
        extra.update({
            "loss_mask": B.list_column(flat("mask", np.bool_), lengths, pa.bool_()),
            "transcript": pa.array([self.tokenizer.decode(e.ids, skip_special_tokens=False) for e in episodes]),
            "turns": pa.array([e.turns for e in episodes], pa.int32()),
            "tool_calls": pa.array([e.calls for e in episodes], pa.int32()),
            "tool_errors": pa.array([e.errors for e in episodes], pa.int32()),
            "episode_end": pa.array([e.end for e in episodes], pa.string()),
            "env_error": pa.array([e.error for e in episodes], pa.string()),
            "turn_rewards": pa.array([e.rewards for e in episodes], pa.list_(pa.float32())),
        })
        extra.update(self._rewards(episodes))
        prompt_lengths = np.array([len(p) for p in encoded], dtype=np.int64)
        prompt_ids = B.list_column(np.concatenate(encoded) if encoded else np.zeros(0, np.int32), prompt_lengths,
                                   pa.int32())
        table = B.rollout_table(
            uid=[f"{tag}.{g}.{s}" for g, s in zip(repeat, sample)],
            group_id=[f"{tag}.{g}" for g in repeat],
            prompt_id=prompts.column("prompt_id").take(repeat).to_pylist(),
            prompt=[texts[i] for i in repeat],
            response=[e.answer for e in episodes],
            prompt_ids=prompt_ids.take(pa.array(repeat)),
            response_ids=B.list_column(flat("ids", np.int32), lengths, pa.int32()),
            behavior_logprobs=B.list_column(flat("logprobs", np.float32), lengths, pa.float32()),
            policy_version=version,
            finish_reason=[{"done": "stop", "env_error": "error"}.get(e.end, "length") for e in episodes],
            extra=extra,
        )
        return table, {**summary(episodes), "tokens": int(lengths.sum())}

    def _rewards(self, episodes) -> dict[str, pa.Array]:
        if not self.sources:
            return {}
        if self.env.turn_rewards:  # each turn's reward at its last token: process advantages in the credit step
            dense = []
            for e in episodes:
                row = np.zeros(len(e.ids), np.float32)
                for end, r in zip(e.turn_ends, e.rewards):
                    row[end] += 0.0 if r is None else r
                dense.append(row)
            lengths = np.array([len(r) for r in dense], dtype=np.int64)
            column = B.list_column(np.concatenate(dense) if dense else np.zeros(0, np.float32), lengths, pa.float32())
            return {TOKEN_REWARD_PREFIX + name: column for name in self.sources}
        values = [e.reward for e in episodes]
        errors = [None if v is not None else (f"the environment raised: {e.error}" if e.error else
                                               "the environment gave no reward") for v, e in zip(values, episodes)]
        out = {}
        for name in self.sources:
            out[B.REWARD_PREFIX + name] = pa.array(values, pa.float32())
            out[B.REWARD_ERROR_PREFIX + name] = pa.array(errors, pa.string())
        return out
