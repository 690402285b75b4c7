"""Multi-turn episodes, token-in/token-out: policy turns and environment observations alternate
until the environment says done, `max_turns` turns were taken, or the episode's token budget (or
the model's context) is used up.

Every running episode of a call takes its turn together (one batched generation over their
contexts); their environments then step together (`Environment.step_batch`, so the Python tool
runs a round's programs side by side), and an episode that is over leaves the batch. A context
only ever grows by ids: the tokens the policy sampled, as sampled, and the turn markers and
observation ids of actors/envs/turns.py. Nothing is decoded and re-encoded, so the learner trains
on exactly the ids that were sampled, with `mask` True on the policy's tokens only.

A policy is anything with `sample(contexts, limits, stops) -> list[Turn]`: `BackendPolicy` over a
generation backend (HF or vLLM), `ScriptedPolicy` replaying an environment's demonstrations (the
warm-up's, and tests').
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from actors.envs.base import Environment, Step
from actors.envs.turns import TurnFormat

ENDS = ("done", "max_turns", "token_budget", "env_error")  # why an episode ended


@dataclass
class Turn:
    ids: np.ndarray  # int32, the sampled tokens (the one that ended the turn included)
    logprobs: np.ndarray  # float32, one per token
    stopped: bool  # ended by an end id or a stop string (False: cut at its token limit)


@dataclass
class Episode:
    prompt_ids: np.ndarray
    ids: list[int] = field(default_factory=list)  # every token after the prompt
    mask: list[bool] = field(default_factory=list)  # True where the policy sampled the token
    logprobs: list[float] = field(default_factory=list)  # behaviour log-probs (0.0 where mask is False)
    texts: list[str] = field(default_factory=list)  # each policy turn's text
    rewards: list[float | None] = field(default_factory=list)  # each turn's environment reward
    turn_ends: list[int] = field(default_factory=list)  # index in `ids` of each turn's last token
    calls: int = 0
    errors: int = 0
    end: str = ""  # one of ENDS
    error: str | None = None  # env_error: what the environment raised

    @property
    def turns(self) -> int:
        return len(self.texts)

    @property
    def answer(self) -> str:
        """What the verifiers score: the last turn's text."""
        return self.texts[-1] if self.texts else ""

    @property
    def reward(self) -> float | None:
        """The sum of the turns' rewards, None if the environment gave none."""
        given = [r for r in self.rewards if r is not None]
        return float(sum(given)) if given else None

    def add(self, ids, mask: bool, logprobs=None) -> None:
        ids = [int(i) for i in ids]
        self.ids.extend(ids)
        self.mask.extend([mask] * len(ids))
        self.logprobs.extend([0.0] * len(ids) if logprobs is None else [float(x) for x in logprobs])


class Policy(Protocol):
    def sample(self, contexts: list[np.ndarray], limits: list[int], stops: list[str]) -> list[Turn]:
        """One turn per context, at most `limits[i]` tokens, ending early after an end id or a
        stop string."""


class BackendPolicy:
    """A generation backend (`generate_ids`) as a policy, with the run's sampling settings."""

    def __init__(self, backend, ends: list[int], temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 greedy: bool = False):
        self.backend, self.ends = backend, set(ends)
        self.sampling = dict(temperature=temperature, top_p=top_p, top_k=top_k, greedy=greedy)

    def sample(self, contexts: list[np.ndarray], limits: list[int], stops: list[str]) -> list[Turn]:
        out = self.backend.generate_ids(contexts, max_new_tokens=max(limits), stop=list(stops), **self.sampling)
        starts = np.concatenate([[0], np.cumsum(out.response_lengths)])
        turns = []
        for i, limit in enumerate(limits):  # one generation for all: each turn cut to its own limit
            ids = out.response_ids[starts[i]:starts[i + 1]]
            lp = out.logprobs[starts[i]:starts[i + 1]]
            stopped = out.finish_reason[i] == "stop"
            if len(ids) > limit:
                ids, lp, stopped = ids[:limit], lp[:limit], False
            turns.append(Turn(ids, lp, stopped))
        return turns


class ScriptedPolicy:
    """Plays the environments' demonstrations (`Environment.demonstrate`), tokenised, each ended by
    the format's end id (TurnFormat.end) unless it ends with a stop string; log-probs 0. Set `envs` and
    `observations` before each round (run_episodes does)."""

    def __init__(self, tokenizer, fmt: TurnFormat):
        self.tokenizer, self.fmt = tokenizer, fmt
        self.envs: list[Environment] = []
        self.observations: list[list[str]] = []

    def sample(self, contexts: list[np.ndarray], limits: list[int], stops: list[str]) -> list[Turn]:
        turns = []
        for env, seen, limit in zip(self.envs, self.observations, limits):
            text = env.demonstrate(seen)
            if text is None:
                raise ValueError(f"environment {type(env).__name__} gives no demonstration (Environment.demonstrate)")
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if not any(text.endswith(s) for s in stops):
                ids = ids + [self.fmt.end]
            stopped = len(ids) <= limit
            ids = np.asarray(ids[:limit], dtype=np.int32)
            turns.append(Turn(ids, np.zeros(len(ids), np.float32), stopped))
        return turns


def run_episodes(policy: Policy, envs: list[Environment], prompt_ids: list[np.ndarray], fmt: TurnFormat, tokenizer,
                 max_turns: int, max_tokens: int, turn_tokens: int, observation_tokens: int | None = None,
                 context: int | None = None) -> list[Episode]:
    """Run one episode per (environment, prompt ids). `max_tokens`: the episode's budget after the
    prompt (turns and observations); `turn_tokens`: a turn's limit; `observation_tokens`: an
    observation's text is cut to this many tokens; `context`: the model's length limit."""
    episodes = [Episode(np.asarray(p, dtype=np.int32)) for p in prompt_ids]
    seen: list[list[str]] = [[] for _ in envs]
    running = list(range(len(envs)))
    stops = sorted({s for env in envs for s in env.stops()})
    while running:
        limits = {i: _room(episodes[i], max_tokens, turn_tokens, context) for i in running}
        for i in [i for i in running if limits[i] <= 0]:
            episodes[i].end = "token_budget"
        running = [i for i in running if limits[i] > 0]
        if not running:
            break
        if isinstance(policy, ScriptedPolicy):
            policy.envs, policy.observations = [envs[i] for i in running], [seen[i] for i in running]
        contexts = [np.concatenate([episodes[i].prompt_ids, np.asarray(episodes[i].ids, np.int32)]) for i in running]
        turns = policy.sample(contexts, [limits[i] for i in running], stops)
        for i, turn in zip(running, turns):
            ep = episodes[i]
            ep.add(turn.ids, True, turn.logprobs)
            ep.turn_ends.append(len(ep.ids) - 1)
            ep.texts.append(tokenizer.decode(turn.ids, skip_special_tokens=True))
        steps = _step(envs, episodes, running)
        still = []
        for i, turn in zip(running, turns):
            ep, step = episodes[i], steps[i]
            if step is None:
                continue  # env_error, set by _step
            ep.rewards.append(step.reward)
            ep.calls += step.calls
            ep.errors += step.errors
            if step.done:
                ep.end = "done"
                continue
            if ep.turns >= max_turns:
                ep.end = "max_turns"
                continue
            ended = len(turn.ids) > 0 and int(turn.ids[-1]) in fmt.ends
            block = fmt.observation(tokenizer, step.observation or "", ended, observation_tokens)
            if _room(ep, max_tokens, len(block) + 1, context) < len(block) + 1:
                ep.end = "token_budget"  # no room for the observation and a token of the next turn
                continue
            ep.add(block, False)
            seen[i].append(step.observation or "")
            still.append(i)
        running = still
    return episodes


def _room(ep: Episode, max_tokens: int, turn_tokens: int, context: int | None) -> int:
    room = min(turn_tokens, max_tokens - len(ep.ids))
    if context is not None:
        room = min(room, context - len(ep.prompt_ids) - len(ep.ids))
    return room


def _step(envs: list[Environment], episodes: list[Episode], running: list[int]) -> dict[int, Step | None]:
    """Step the running episodes' environments, class by class; an environment that raises ends its
    class's episodes of this round with `env_error` (the run goes on)."""
    out: dict[int, Step | None] = {}
    by_class: dict[type, list[int]] = {}
    for i in running:
        by_class.setdefault(type(envs[i]), []).append(i)
    for cls, rows in by_class.items():
        try:
            steps = cls.step_batch([envs[i] for i in rows], [episodes[i].texts[-1] for i in rows])
            if len(steps) != len(rows):
                raise RuntimeError(f"step_batch returned {len(steps)} steps for {len(rows)} turns")
        except Exception as e:  # noqa: BLE001  (a user environment's bug ends its episodes, not the run)
            message = f"{cls.__name__}.step: {type(e).__name__}: {e}"[:500]
            for i in rows:
                episodes[i].end, episodes[i].error = "env_error", message
                out[i] = None
            continue
        out.update(zip(rows, steps))
    return out


def summary(episodes: list[Episode]) -> dict[str, float]:
    """Counts for the metrics (summed over pieces by the loop: actors/envs/metrics.py)."""
    out = {"env/episodes": len(episodes), "env/turns": sum(e.turns for e in episodes),
           "env/tool_calls": sum(e.calls for e in episodes), "env/tool_errors": sum(e.errors for e in episodes),
           "env/policy_tokens": sum(sum(e.mask) for e in episodes),
           "env/observation_tokens": sum(len(e.mask) - sum(e.mask) for e in episodes)}
    for end in ENDS:
        out[f"env/ended/{end}"] = sum(e.end == end for e in episodes)
    return out
