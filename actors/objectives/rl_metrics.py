"""The metrics of one RL step (losses, samples, staleness), from the policy-gradient objective. Those
of its rewards and advantages come from the credit step (orchestrator/credit.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def rl_metrics(learner, table, groups, sums, old_lp, r_mask, norms, skipped) -> dict:
    n_tokens = int(r_mask.sum())
    versions = table.column("policy_version")
    per_token = max(n_tokens, 1)
    out = {
        "version": learner.version,
        "train/loss": sums["loss"] / per_token,
        "train/pg_loss": sums["pg_loss"] / per_token,
        "train/clip_frac": sums["clip_frac"] / per_token,
        "train/is_weight_mean": sums["is_weight"] / per_token,
        # the behaviour policy's negative log-likelihood of its own samples (an entropy estimate)
        "train/neg_logprob": float(-(old_lp * r_mask).sum()) / per_token,
        "train/grad_norm": float(np.mean(norms)) if norms else 0.0,
        "train/skipped_nonfinite": float(learner.skipped_steps),
        "train/step_skipped": float(skipped > 0),
        "train/optimizer_steps": len(norms),
        "samples/count": table.num_rows,
        "samples/tokens": int(n_tokens + pc.sum(pc.list_value_length(table.column("prompt_ids"))).as_py()),
        "samples/response_length": n_tokens / max(table.num_rows, 1),
        "samples/truncated_frac": float(pc.mean(pc.equal(pc.cast(table.column("finish_reason"),
                                                                pa.string()), "length")).as_py()),
        # diversity: how many different responses a group's samples are (1: the policy has collapsed)
        "samples/distinct_per_group": distinct_per_group(table.column("response_ids").to_pylist(), groups.tolist()),
        "policy/version_min": int(pc.min(versions).as_py()),
        "policy/staleness_max": learner.version - 1 - int(pc.min(versions).as_py()),
    }
    if learner.reference is not None:
        out["train/kl"] = sums["kl"] / per_token
    if "entropy" in sums:  # with an entropy bonus: the sampling distribution's mean token entropy
        out["train/entropy"] = sums["entropy"] / per_token
    return out


def distinct_per_group(responses: list, groups: list[int]) -> float:
    """The mean over groups of the number of distinct responses (token sequences) in the group."""
    seen: dict[int, set] = {}
    for response, group in zip(responses, groups):
        seen.setdefault(group, set()).add(tuple(response))
    return sum(len(s) for s in seen.values()) / len(seen) if seen else 0.0
