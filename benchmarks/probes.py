"""In-process probes behind README statements about reward models and self-rewards (no Ray).

    python benchmarks/probes.py rm-pairs WARM_DIR [--pairs-per-prompt 4] [--lr 3e-4] [--steps 200]
        Bradley-Terry training of a scalar head on the warm policy, on pairs of a correct and a wrong
        sample of the same training prompt; each step takes batch/pairs_per_prompt distinct prompts.
        Prints held-out pair accuracy every --every steps (how many distinct prompts a step matters).
    python benchmarks/probes.py majority WARM_DIR
        How often the majority answer of 8 samples (temperature 1) is right, by vote share: the
        label quality that majority-vote training gets from this policy.
    python benchmarks/probes.py laser-groups POLICY_DIR [--recipe laser]
        Within-prompt ranking of a LaSeR self-reward: 8 samples for each of 100 held-out prompts; the
        fraction of (correct, wrong) pairs of one prompt the self-reward orders correctly, best-of-8.

    python benchmarks/probes.py judge-prompts WARM_DIR [--prompts 100 2000 7000] [--steps 800]
            [--init policy|scratch] [--batch 32] [--lr 1e-3]
        How good a judge the warm policy becomes with more labelled prompts (sorting, issue 32): for
        each count, a judge trained on the verifier's labels of 8 samples of that many training
        prompts (judge template "{prompt}{response}?" -> Y/N, balanced batches of --batch, AdamW
        --lr); held-out AUROC on 8 samples of 200 held-out prompts every --every steps. The judge
        starts as a copy of the warm policy (--init policy) or as the same architecture randomly
        initialised (--init scratch; seeded by --seed).

    python benchmarks/probes.py laser-align WARM_DIR [--lr 3e-4] [--steps 600] [--beta 0.25] [--nll 1.0]
            [--resample] [--prompts 2048]
        A supervised self-verification phase for LaSeR: MSE between r and the verifier's label on
        (correct, wrong) sample pairs of one training prompt, plus --nll x the NLL of the correct
        samples. Every --every steps: the self-reward on the warm model's fixed held-out samples
        ("fixed") and on fresh samples of the model being trained ("fresh", what best-of-N sees).

WARM_DIR is a cached SFT warm-up (~/.cache/coevo/warmup/<hash>); POLICY_DIR a saved policy
(`<run>/checkpoints/final/policy_learner`). Output: JSON lines on stdout, also written to
benchmarks/results/raw/probes/<probe><label>.jsonl, and their table to its section of the summary
benchmarks/results/probes.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors import modeling  # noqa: E402
from summary import dict_table, raw_path, write as write_summary  # noqa: E402
from orchestrator.data import arithmetic  # noqa: E402


def sample(policy, tokenizer, prompts: list[str], n: int = 8, seed: int = 0, max_new_tokens: int = 5) -> list[list[str]]:
    """n sampled responses per prompt (temperature 1, no truncation), decoded."""
    torch.manual_seed(seed)
    out = []
    for i in range(0, len(prompts), 500):
        chunk = prompts[i:i + 500]
        enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            ids = policy.generate(**enc, do_sample=True, temperature=1.0, top_k=0, max_new_tokens=max_new_tokens,
                                  num_return_sequences=n, pad_token_id=tokenizer.pad_token_id,
                                  eos_token_id=tokenizer.eos_token_id)
        texts = tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        out += [texts[j * n:(j + 1) * n] for j in range(len(chunk))]
    return out


def rm_pairs(args) -> None:
    from actors.algorithms.preference import bradley_terry
    from actors.reward_model import score_ids

    tasks = arithmetic(2, ["+"], 200, 0)
    policy, tok = modeling.load_model(args.warm), modeling.load_tokenizer(args.warm)
    rng = np.random.default_rng(args.seed)

    def pairs(table):  # (prompt, correct, [wrong samples]) for prompts with both
        prompts, answers = table.column("prompt").to_pylist(), table.column("answer").to_pylist()
        out = []
        for p, a, s in zip(prompts, answers, sample(policy, tok, prompts, seed=args.seed)):
            wrong = [x for x in s if x.strip() != a]
            if wrong and len(wrong) < len(s):
                out.append((p, a, wrong))
        return out

    train, held = pairs(tasks.train), pairs(tasks.eval)
    rm, _ = modeling.load_reward_model(args.warm, seed=args.seed)
    rm.train()
    opt = torch.optim.AdamW(rm.parameters(), lr=args.lr, weight_decay=0.0)

    def scores(texts):
        return score_ids(rm, tok(texts, add_special_tokens=False)["input_ids"], tok.pad_token_id, "cpu")

    def held_out():
        rm.eval()
        with torch.no_grad():
            good, bad = scores([p + g for p, g, _ in held]), scores([p + w[0] for p, _, w in held])
        rm.train()
        return float((good > bad).float().mean())

    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        idx = np.repeat(rng.integers(len(train), size=args.batch // args.pairs_per_prompt), args.pairs_per_prompt)
        chosen = [train[i][0] + train[i][1] for i in idx]
        rejected = [train[i][0] + train[i][2][rng.integers(len(train[i][2]))] for i in idx]
        x = scores(chosen + rejected)
        loss, _ = bradley_terry(x[:len(idx)], x[len(idx):])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(rm.parameters(), 1.0)
        opt.step()
        if step % args.every == 0:
            print(json.dumps({"step": step, "s": round(time.perf_counter() - start, 1), "loss": round(loss.item(), 3),
                              "held_out_pair_accuracy": held_out()}), flush=True)


def majority(args) -> None:
    tasks = arithmetic(2, ["+"], 200, 0)
    policy, tok = modeling.load_model(args.warm), modeling.load_tokenizer(args.warm)
    prompts = tasks.train.column("prompt").to_pylist()[:args.prompts]
    answers = tasks.train.column("answer").to_pylist()[:args.prompts]
    rows = []  # (top share, majority right, tie, per-sample accuracy)
    for a, s in zip(answers, sample(policy, tok, prompts, seed=args.seed)):
        top = Counter(s).most_common(2)
        rows.append((top[0][1] / len(s), top[0][0] == a, len(top) == 2 and top[0][1] == top[1][1],
                     sum(x == a for x in s) / len(s)))
    r = np.array(rows, dtype=float)
    untied = r[:, 2] == 0
    out = {"per_sample_accuracy": r[:, 3].mean(), "majority_right": r[untied, 1].mean(), "ties": r[:, 2].mean()}
    for share in (0.5, 0.625, 0.75, 0.875, 1.0):
        m = (r[:, 0] >= share - 1e-9) & untied
        out[f"share>={share}"] = {"groups": m.mean(), "majority_right": r[m, 1].mean()}
    print(json.dumps(out))


def judge_prompts(args) -> None:
    import copy

    from actors.judging import render, single_token, verdict_logprobs, yes_probability
    from actors.rewards.sorting import sorted_digits
    from orchestrator.data import sorting
    from orchestrator.evaluation import auroc

    task = sorting(6, 8200, 1000, 0)
    policy, tok = modeling.load_model(args.warm), modeling.load_tokenizer(args.warm)
    yes, no = single_token(tok, "Y", "judge.yes"), single_token(tok, "N", "judge.no")

    def judged(prompts: list[str]) -> tuple[list[str], np.ndarray]:
        texts, labels = [], []
        for p, answers in zip(prompts, sample(policy, tok, prompts, seed=args.seed, max_new_tokens=7)):
            for a in (a.strip() for a in answers):
                if a:
                    texts.append(render("{prompt}{response}?", p, a))
                    labels.append(sorted_digits(p, a) >= 0.5)
        return texts, np.array(labels)

    held_texts, held_labels = judged(task.eval.column("prompt").to_pylist()[:200])
    for n in args.prompts:
        texts, labels = judged(task.train.column("prompt").to_pylist()[:n])
        good, bad = np.nonzero(labels)[0], np.nonzero(~labels)[0]
        judge = copy.deepcopy(policy) if args.init == "policy" else modeling.reinitialised(policy, args.seed)
        opt = torch.optim.AdamW(judge.parameters(), lr=args.lr)
        rng = np.random.default_rng(args.seed + 1)
        for step in range(1, args.steps + 1):
            judge.train()
            idx = np.concatenate([rng.choice(good, args.batch // 2), rng.choice(bad, args.batch // 2)])
            pair = verdict_logprobs(judge, tok, [texts[i] for i in idx], yes, no, "cpu")
            loss = torch.nn.functional.nll_loss(pair, torch.from_numpy(np.where(labels[idx], 0, 1)))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(judge.parameters(), 1.0)
            opt.step()
            if step % args.every == 0:
                judge.eval()
                score = yes_probability(judge, tok, held_texts, yes, no, "cpu", 256)
                print(json.dumps({"init": args.init, "prompts": n, "examples": len(texts), "step": step,
                                  "held_out_auroc": round(auroc(score, held_labels), 4)}), flush=True)


def laser_groups(args) -> None:
    from actors import batch as B
    from actors.generator import Generator
    from actors.verifier import Verifier
    from orchestrator.config import load_config
    from orchestrator.data import load_prompts
    from orchestrator.evaluation import rank_quality

    cfg = load_config(args.recipe, [])
    gen, ver = Generator(cfg, args.policy), Verifier(cfg)
    table, _ = gen.generate(load_prompts(cfg.data, cfg.seed).eval.slice(0, 100), n=8, seq=-5)
    table, _ = ver.score(table)
    lp = table.column("laser_logprob").to_numpy(zero_copy_only=False)
    right = table.column(B.REWARD_PREFIX + cfg.accuracy_source()).fill_null(0).to_numpy(zero_copy_only=False) >= 0.5
    q = rank_quality(lp, right, B.group_index(table))
    print(json.dumps({"random_pick_accuracy": q["random_pick"], "best_of_8_accuracy": q["best_of_n"],
                      "within_prompt_pairs_ordered": q["pairs_ordered"], "pairs": q["pairs"]}))


def laser_align(args) -> None:
    import pyarrow as pa

    from actors import batch as B
    from actors.generator import Generator
    from actors.learner import Learner
    from actors.sampling import token_logprobs
    from actors.verifier import Verifier
    from orchestrator.config import load_config
    from orchestrator.data import load_prompts
    from orchestrator.evaluation import rank_quality
    from pipelines.stages.laser import pair_indices

    cfg = load_config("laser", [f"laser.beta={args.beta}", f"seed={args.seed}"])
    prompts = load_prompts(cfg.data, cfg.seed)
    gen, ver, lrn = Generator(cfg, args.warm), Verifier(cfg), Learner(cfg, args.warm)
    from actors.judging import single_token

    token, offset = single_token(lrn.tokenizer, cfg.laser.token, "laser.token"), {"c": None}  # c: set below
    key = B.REWARD_PREFIX + cfg.accuracy_source()
    rng = np.random.default_rng(args.seed)

    def samples(table, seq):
        out, _ = gen.generate(table, n=8, seq=seq)
        out, _ = ver.score(out)
        label = out.column(key).fill_null(0).to_numpy(zero_copy_only=False).astype(np.float32)
        return out, label, B.group_index(out)

    def self_reward(table, grad=False):
        ids, mask, pos, r_ids, r_mask, pw = lrn._sequences(table)
        with torch.set_grad_enabled(grad):
            logits, tail = lrn._response_logits(lrn.model, ids, mask, pos, pw, after=True)
            r = args.beta * (torch.log_softmax(tail.float(), -1)[:, token] - offset["c"])
        return r, logits, r_ids, r_mask

    def quality(table, label, groups):
        lrn.model.eval()
        r = self_reward(table)[0].numpy()
        lrn.model.train()
        q = rank_quality(r, label >= .5, groups)
        return {"auroc": q["auroc"], "pairs_ordered": q["pairs_ordered"], "best_of_8": q["best_of_n"],
                "random_pick": q["random_pick"]}

    version = 0

    def refresh():  # the generator takes the learner's current weights
        nonlocal version
        version += 1
        lrn.version = version
        gen.update_weights(version, lrn.publish())

    print(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "probe"}}), flush=True)
    train_prompts = prompts.train.slice(0, args.prompts)
    train, tl, tg = samples(train_prompts, -9)
    fixed = samples(prompts.eval, -5)
    offset["c"] = float(np.nanmean(train.column("laser_logprob").to_numpy(zero_copy_only=False)))
    pairs = pair_indices(tl, tg)
    opt = torch.optim.AdamW(lrn.model.parameters(), lr=args.lr, weight_decay=0.0)
    started = time.perf_counter()
    for step in range(args.steps + 1):
        if step % args.every == 0:
            refresh()
            row = {"step": step, "s": round(time.perf_counter() - started, 1), "fixed": quality(*fixed),
                   "fresh": quality(*samples(prompts.eval, -100 - step))}
            print(json.dumps(row), flush=True)
            if args.resample and 0 < step < args.steps:
                train, tl, tg = samples(train_prompts, -9 - step)
                pairs = pair_indices(tl, tg)
        if step == args.steps:
            break
        pick = rng.choice(len(pairs), min(64, len(pairs)), replace=False)
        idx = np.array([rng.choice(pairs[i][k]) for k in (0, 1) for i in pick])
        r, logits, r_ids, r_mask = self_reward(train.take(pa.array(idx)), grad=True)
        target = torch.from_numpy(tl[idx])
        m = r_mask.float() * (target >= .5).float()[:, None]
        loss = ((r - target) ** 2).mean() - args.nll * (token_logprobs(logits, r_ids) * m).sum() / m.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lrn.model.parameters(), 1.0)
        opt.step()


class _Tee:
    """stdout that is also written to a file."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()


def table(lines: list[str]) -> str:
    """A probe's JSON lines as one table (its `args` line left out; nested dicts become `outer/inner` columns)."""
    rows = [json.loads(x) for x in lines if x.strip().startswith("{")]
    flat = [{f"{k}/{k2}" if isinstance(v, dict) else k: v2 for k, v in r.items()
             for k2, v2 in (v.items() if isinstance(v, dict) else [(None, v)])} for r in rows if "args" not in r]
    return dict_table(flat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="probe", required=True)
    p = sub.add_parser("rm-pairs")
    p.add_argument("warm")
    p.add_argument("--pairs-per-prompt", type=int, default=1)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--every", type=int, default=25)
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("majority")
    p.add_argument("warm")
    p.add_argument("--prompts", type=int, default=1500)
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("judge-prompts")
    p.add_argument("warm")
    p.add_argument("--prompts", type=int, nargs="+", default=[100, 2000, 7000])
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--every", type=int, default=200)
    p.add_argument("--init", choices=["policy", "scratch"], default="policy",
                   help="the judge's start: the warm policy's weights or a random init of its architecture")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("laser-groups")
    p.add_argument("policy")
    p.add_argument("--recipe", default="laser")
    p = sub.add_parser("laser-align")
    p.add_argument("warm")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--beta", type=float, default=0.25)
    p.add_argument("--nll", type=float, default=1.0)
    p.add_argument("--resample", action="store_true", help="re-draw the training samples every --every steps")
    p.add_argument("--prompts", type=int, default=2048)
    p.add_argument("--every", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    parser.add_argument("--label", default="", help="raw file suffix: probes/<probe><label>.jsonl")
    args = parser.parse_args()
    torch.set_num_threads(2)
    out = raw_path(f"probes/{args.probe}{args.label}.jsonl")
    with out.open("w") as f, contextlib.redirect_stdout(_Tee(sys.stdout, f)):
        {"rm-pairs": rm_pairs, "majority": majority, "judge-prompts": judge_prompts, "laser-groups": laser_groups,
         "laser-align": laser_align}[args.probe](args)
    summary = write_summary("probes", out.stem, table(out.read_text().splitlines()), raw=[out], protocol=" ".join(
        f"{k}={v}" for k, v in vars(args).items()))
    print(f"wrote {out} and {summary}", file=sys.stderr)


if __name__ == "__main__":
    main()
