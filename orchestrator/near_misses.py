"""Verifier-labelled near misses for a judge (`judge.near_misses`): one-character edits of answers the
verifier marked correct (two neighbours swapped, a character dropped, doubled, or replaced by another
of the answer's own), scored by the verifier on the same labelled prompts. The ones it marks wrong
are wrong answers a hair from right, the kind a policy that mostly solves the task still makes, and
few of which a judge sees among a small labelled pool's samples. Any edit the verifier still passes
is dropped. Only labelled prompts are edited, so the judge learns from no label the run lacks."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from actors import batch as B


def edits(text: str, k: int, rng: np.random.Generator) -> list[str]:
    """Up to `k` distinct one-character edits of `text`, none equal to it. Whitespace is neither
    edited nor inserted; text with no character to edit has none."""
    spots = [i for i, c in enumerate(text) if not c.isspace()]
    if not spots:
        return []
    chars = sorted({text[i] for i in spots})
    out: list[str] = []
    for _ in range(8 * k):  # a few draws each: a swap of equal neighbours changes nothing
        if len(out) == k:
            break
        i = int(rng.choice(spots))
        kind = int(rng.integers(4))
        if kind == 0 and i + 1 < len(text) and not text[i + 1].isspace():
            new = text[:i] + text[i + 1] + text[i] + text[i + 2:]  # swap with the next
        elif kind == 1 and len(spots) > 1:
            new = text[:i] + text[i + 1:]  # drop
        elif kind == 2:
            new = text[:i] + text[i] + text[i:]  # double
        elif kind == 3 and len(chars) > 1:
            new = text[:i] + str(rng.choice([c for c in chars if c != text[i]])) + text[i + 1:]  # replace
        else:
            continue
        if new != text and new not in out:
            out.append(new)
    return out


def candidates(table: pa.Table, label: str, k: int, rng: np.random.Generator) -> pa.Table | None:
    """`table`'s verifier-correct, non-empty rows, each repeated with up to `k` edits of its response
    in place of it (every other column as it was but `uid`, made unique); None when there are none."""
    column = B.REWARD_PREFIX + label
    if k == 0 or column not in table.schema.names or table.num_rows == 0:
        return None
    values = table.column(column).to_numpy(zero_copy_only=False).astype(np.float64)
    responses = table.column("response").to_pylist()
    rows, texts = [], []
    for i in np.nonzero(~np.isnan(values) & (values >= B.CORRECT_AT))[0]:
        if not responses[i] or not responses[i].strip():
            continue
        for new in edits(responses[i], k, rng):
            rows.append(int(i))
            texts.append(new)
    if not rows:
        return None
    out = B.replace_column(table.take(pa.array(rows, pa.int64())), "response", pa.array(texts, pa.string()))
    if "uid" in out.schema.names:  # a row of its own (uids name rows: a verifier merges a retried batch by them)
        uids = out.column("uid").to_pylist()
        out = B.replace_column(out, "uid", pa.array([f"{u}~near{j}" for j, u in enumerate(uids)], pa.string()))
    return out


async def with_near_misses(ctx, table: pa.Table, label: str, k: int, rng: np.random.Generator) -> tuple[pa.Table, int]:
    """`table` (prompt, response and the `label` reward column only) plus its near misses the verifier
    pool marks wrong, and how many those are. `table` unchanged where `k` is 0."""
    keep = ["prompt", "response", B.REWARD_PREFIX + label]
    if k == 0:
        return table, 0
    edited = candidates(table, label, k, rng)
    base = table.select(keep)
    if edited is None:
        return base, 0
    scored, _ = await ctx.pools["verifier"].call("score", edited)
    scored = (await scored).select(keep)
    values = scored.column(keep[2]).to_numpy(zero_copy_only=False).astype(np.float64)
    wrong = np.nonzero(~np.isnan(values) & (values < B.CORRECT_AT))[0]
    scored = scored.take(pa.array(wrong, pa.int64())).cast(base.schema)
    return pa.concat_tables([base, scored]), len(wrong)
