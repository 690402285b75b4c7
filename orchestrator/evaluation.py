"""Held-out evaluation shared by the warm-up and the recipes: greedy generation on the eval split,
scored by the verifier; accuracy is the mean of the accuracy source."""

from __future__ import annotations

import asyncio

import numpy as np

from actors.envs.metrics import episode_metrics


async def greedy_accuracy(ctx, prompts=None, keep: list | None = None) -> dict[str, float]:
    """Greedy accuracy on the held-out split, spread over the generator replicas. `keep`: a list the
    generated tables are appended to (in prompt order), for a learned reward to score the same
    responses (`judge_quality`, `reward_model_quality`) instead of generating them again."""
    gen, ver = ctx.pools["generator"], ctx.pools["verifier"]
    chunks = ctx.split(ctx.prompts.eval if prompts is None else prompts, len(gen.replicas))

    async def one(chunk):
        table, info = await gen.call("generate", chunk, greedy=True, versioned=True)
        return (await ver.call("evaluate", table, table=False), table), info

    done = await asyncio.gather(*[one(c) for c in chunks])
    if keep is not None:
        keep.extend(table for (_, table), _ in done)
    results = [r for (r, _), _ in done]
    n = sum(r["samples"] for r in results)
    out = {"eval/accuracy": sum(r["accuracy"] * r["samples"] for r in results) / n,
           **episode_metrics([info for _, info in done], prefix="eval/env/")}  # multi-turn episodes (env.name)
    for key in sorted({k for r in results for k in r if k.startswith("errors/")}):
        out[f"eval/{key}"] = sum(r.get(key, 0) for r in results)
    return out


async def judge_quality(ctx, accuracy: dict, previous: dict | None, responses: list | None = None) -> dict:
    """The policy-as-judge on the held-out greedy responses: its mean score, agreement and AUROC
    against the verifier, and `eval/hacking` (1 when the judge's score rose while held-out accuracy
    fell since the previous evaluation). `responses`: the tables `greedy_accuracy(keep=)` generated
    at this evaluation (else generated here)."""
    judge_pool = ctx.pools.get("judge", ctx.pools["generator"])
    return await learned_quality(ctx, lambda table: judge_pool.call("judge", table, versioned=True),
                                 ctx.config.judge_rewards()[0].name, "judge", accuracy, previous, responses)


async def reward_model_quality(ctx, accuracy: dict, previous: dict | None, responses: list | None = None) -> dict:
    """The same for a reward model (`model:` source; Cooper's trained one or a frozen one): how well
    its score on the held-out greedy responses separates right from wrong (`eval/reward_model_auroc`),
    and `eval/hacking` when its mean score rose while held-out accuracy fell. Its scores are
    Bradley-Terry logits, not probabilities, so no agreement at 0.5."""
    pool = ctx.pools["reward_model"]
    return await learned_quality(ctx, lambda table: pool.call("score", table, versioned=True),
                                 ctx.config.model_rewards()[0].name, "reward_model", accuracy, previous,
                                 responses, probability=False)


async def learned_quality(ctx, score, name: str, prefix: str, accuracy: dict, previous: dict | None,
                          responses: list | None = None, probability: bool = True) -> dict:
    """A learned reward (`score` a table -> (scored table, info)) on the held-out greedy responses
    (`responses`, the tables of this evaluation's greedy pass; generated here where not given):
    `eval/<prefix>_score` (its mean), `_auroc` and, where its score is a probability, `_agreement`
    (score > 0.5 against the verifier)."""
    import pyarrow as pa

    from actors import batch as B

    gen, ver = ctx.pools["generator"], ctx.pools["verifier"]
    if len(responses or ()) == 1:  # one generator replica: its output as it is (a reference in a run)
        table = responses[0]
    elif responses:  # one piece a replica, joined on the driver (references in a run, tables in a test)
        table = pa.concat_tables([t if isinstance(t, pa.Table) else await t for t in responses])
    else:
        table, _ = await gen.call("generate", ctx.prompts.eval, greedy=True, versioned=True)
    learned, _ = await score(table)
    scored, _ = await ver.call("score", learned)
    scored = await scored
    value = scored.column(B.REWARD_PREFIX + name).to_numpy(zero_copy_only=False)
    label = scored.column(B.REWARD_PREFIX + ctx.config.accuracy_source()).to_numpy(zero_copy_only=False)
    ok = ~np.isnan(value) & ~np.isnan(label)
    out = {f"eval/{prefix}_score": float(np.mean(value[ok])) if ok.any() else None,
           f"eval/{prefix}_auroc": auroc(value[ok], label[ok] >= 0.5)}
    if probability:
        out[f"eval/{prefix}_agreement"] = float(np.mean((value[ok] > 0.5) == (label[ok] >= 0.5))) if ok.any() else None
    out.update(hacking(out, accuracy, previous, f"eval/{prefix}_score"))
    return out


def hacking(judge: dict, accuracy: dict, previous: dict | None, key: str = "eval/judge_score") -> dict:
    """Reward hacking between two evaluations: `eval/hacking` 1 when the learned reward's mean score
    (`key`: the judge's `eval/judge_score`, a reward model's `eval/reward_model_score`) rose while
    held-out accuracy fell, and `eval/hacking_count`, how many evaluations of the run so far were
    flagged."""
    previous = previous or {}
    count = previous.get("eval/hacking_count") or 0
    if judge.get(key) is None or previous.get(key) is None:
        return {"eval/hacking_count": count} if previous else {}
    flag = float(judge[key] > previous[key] and accuracy["eval/accuracy"] < previous["eval/accuracy"])
    return {"eval/hacking": flag, "eval/hacking_count": count + flag}


async def self_reward_quality(ctx, seq: int) -> dict[str, float]:
    """LaSeR's self-reward on `laser.best_of` samples of each of `laser.eval_prompts` held-out
    prompts: its AUROC against the verifier, the share of (correct, wrong) pairs of one prompt it
    orders right, and best-of-N by it against a random pick."""
    from actors import batch as B

    cfg = ctx.config
    n = cfg.laser.best_of
    gen, ver = ctx.pools["generator"], ctx.pools["verifier"]
    table, _ = await gen.call("generate", ctx.prompts.eval.slice(0, cfg.laser.eval_prompts), n=n, seq=seq,
                              versioned=True)
    scored, _ = await ver.call("score", table)
    scored = await scored
    # log pi(z | x, y): the self-reward up to its positive scale and offset (rankings are the same)
    self_r = scored.column("laser_logprob").to_numpy(zero_copy_only=False)
    correct = scored.column(B.REWARD_PREFIX + cfg.accuracy_source()).fill_null(0).to_numpy(
        zero_copy_only=False) >= 0.5
    quality = rank_quality(self_r, correct, B.group_index(scored))
    return {"eval/self_reward_auroc": quality["auroc"], "eval/self_reward_pairs_ordered": quality["pairs_ordered"],
            f"eval/best_of_{n}_accuracy": quality["best_of_n"], "eval/random_pick_accuracy": quality["random_pick"],
            "eval/best_of_n_gain": quality["best_of_n"] - quality["random_pick"]}


def rank_quality(scores: np.ndarray, correct: np.ndarray, groups: np.ndarray) -> dict:
    """How well `scores` rank samples, `groups` holding each prompt's samples: pooled AUROC, the share
    of a prompt's (correct, wrong) pairs ordered right (ties count half; None without such pairs),
    best-of-N by score and a random pick (the mean accuracy of a prompt's samples), over prompts."""
    best, mean, ordered, pairs = [], [], 0.0, 0
    for g in np.unique(groups):
        rows = np.nonzero(groups == g)[0]
        best.append(correct[rows[np.argmax(scores[rows])]])
        mean.append(correct[rows].mean())
        good, bad = scores[rows][correct[rows]], scores[rows][~correct[rows]]
        ordered += float((good[:, None] > bad[None, :]).sum() + 0.5 * (good[:, None] == bad[None, :]).sum())
        pairs += len(good) * len(bad)
    return {"auroc": auroc(scores, correct), "pairs_ordered": ordered / pairs if pairs else None,
            "best_of_n": float(np.mean(best)), "random_pick": float(np.mean(mean)), "pairs": pairs}


def auroc(scores: np.ndarray, positive: np.ndarray) -> float | None:
    """Area under the ROC curve of `scores` for the boolean labels `positive` (Mann-Whitney U with
    average ranks for ties): 0.5 is chance, 1 a perfect separation. None without both classes."""
    scores, positive = np.asarray(scores, dtype=np.float64), np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):  # average ranks over ties
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


async def labelled_samples(ctx, prompts, seq0: int, n: int | None = None):
    """Samples of `prompts` from the generators (`n` a prompt; None: the rollout's group size), scored
    by the verifier (for the warm-ups that train on the policy's own labelled samples)."""
    from actors import batch as B

    gen, ver = ctx.pools["generator"], ctx.pools["verifier"]

    async def one(i, chunk):
        table, _ = await gen.call("generate", chunk, seq=seq0 - i, versioned=True, n=n)
        scored, _ = await ver.call("score", table)
        return scored

    chunks = ctx.split(prompts, max(1, prompts.num_rows // 64))
    refs = await asyncio.gather(*[one(i, c) for i, c in enumerate(chunks)])
    return B.concat(list(await asyncio.gather(*refs)))


def labelled_scores(tables: list, score_col: str, label_col: str) -> tuple[np.ndarray, np.ndarray]:
    """A judge's scores and the verifier's labels (float64) on the rows of `tables` that both scored."""
    score = np.concatenate([t.column(score_col).to_numpy(zero_copy_only=False) for t in tables]).astype(np.float64)
    truth = np.concatenate([t.column(label_col).to_numpy(zero_copy_only=False) for t in tables]).astype(np.float64)
    ok = ~np.isnan(score) & ~np.isnan(truth)
    return score[ok], truth[ok]
