"""Episode metrics from the generators' counts (`env/...` keys of a generate call's info, summed
over a step's pieces or an evaluation's chunks): docs/metrics.md#environments."""

from __future__ import annotations

from actors.envs.episodes import ENDS


def episode_metrics(infos: list[dict], prefix: str = "env/") -> dict[str, float]:
    """`env/turns_mean`, `env/tool_calls_mean` (per episode), `env/tool_call_ok_frac` (calls that
    were well-formed and answered without an error; None without calls), `env/ended/<why>_frac`
    and `env/observation_token_frac` (of the response tokens, those the environment added).
    Empty where no info has episodes."""
    total: dict[str, float] = {}
    for info in infos:
        for key, value in info.items():
            if key.startswith("env/"):
                total[key] = total.get(key, 0) + value
    episodes = total.get("env/episodes", 0)
    if not episodes:
        return {}
    calls, errors = total.get("env/tool_calls", 0), total.get("env/tool_errors", 0)
    tokens = total.get("env/policy_tokens", 0) + total.get("env/observation_tokens", 0)
    out = {f"{prefix}turns_mean": total["env/turns"] / episodes, f"{prefix}tool_calls_mean": calls / episodes,
           f"{prefix}tool_call_ok_frac": (calls - errors) / calls if calls else None,
           f"{prefix}observation_token_frac": total.get("env/observation_tokens", 0) / tokens if tokens else 0.0}
    for end in ENDS:
        out[f"{prefix}ended/{end}_frac"] = total.get(f"env/ended/{end}", 0) / episodes
    return out
