"""Micro-batches cut by a token budget, and padding-free packed sequences (docs/learner.md#packing).

Two layouts feed the learner's forward passes:
- **packed** (`learner.packing`, on a GPU by default): the micro-batch's rows -- each its prompt then its
  response -- are concatenated into one sequence with `position_ids` restarting at every row, and
  attention stays inside each row (actors.attention's varlen kernel). No padding token is computed.
  Rows are assigned to micro-batches longest first (first-fit decreasing), so each micro-batch fills
  its budget; a row is never split.
- **padded** (on a CPU by default, where it is faster for short rows): rows left-padded prompts and
  right-padded responses, in their batch order (a GRPO group's rows stay together and share one
  prompt forward), cut where the padded tokens (rows x width) would pass the budget.

The budget is `algorithm.micro_batch_tokens`; `algorithm.micro_batch_size` caps the rows either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def packed_micro_batches(rows: torch.Tensor, cost: torch.Tensor, budget: int | None, max_rows: int) -> list[torch.Tensor]:
    """`rows` (indices) into micro-batches of at most `budget` tokens (`cost[row]` each) and `max_rows`
    rows: first-fit decreasing, longest row first. A row longer than the budget gets one of its own.
    Each micro-batch lists its rows in ascending order; every row appears exactly once."""
    if len(rows) == 0:
        return []
    budget = budget or int(cost[rows].sum())
    order = sorted(rows.tolist(), key=lambda r: (-int(cost[r]), r))
    bins: list[list[int]] = []
    room: list[int] = []
    for r in order:
        c = int(cost[r])
        for i, left in enumerate(room):
            if c <= left and len(bins[i]) < max_rows:
                bins[i].append(r)
                room[i] -= c
                break
        else:
            bins.append([r])
            room.append(budget - c)
    return [torch.tensor(sorted(b), dtype=torch.long) for b in bins]


def padded_micro_batches(rows: torch.Tensor, length: torch.Tensor, p_width: int, budget: int | None,
                         max_rows: int) -> list[torch.Tensor]:
    """`rows` in their order, cut where a micro-batch would hold more than `max_rows` rows or more than
    `budget` padded tokens (rows x (p_width + its longest response))."""
    out: list[torch.Tensor] = []
    current: list[int] = []
    widest = 0
    for r in rows.tolist():
        w = max(widest, int(length[r]))
        n = len(current) + 1
        if current and (n > max_rows or (budget and n * (p_width + w) > budget)):
            out.append(torch.tensor(current, dtype=torch.long))
            current, w = [], int(length[r])
        current.append(r)
        widest = w
    if current:
        out.append(torch.tensor(current, dtype=torch.long))
    return out


@dataclass
class Packed:
    """One micro-batch as a single packed sequence: `input_ids`/`position_ids` [1, T], `cu_seqlens`
    [n + 1] (int32, each row's start), `max_len`; `targets` [K] the response tokens and `at` [K] the
    position whose output predicts each; `tail` [n] the position after each row's last token."""
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_len: int
    targets: torch.Tensor
    at: torch.Tensor
    tail: torch.Tensor
    r_mask: torch.Tensor  # [n, R] where `targets` go back to in the padded response layout
    seq_lengths: torch.Tensor  # [n] tokens of each row

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def to(self, device) -> "Packed":
        return Packed(*(getattr(self, f).to(device) if isinstance(getattr(self, f), torch.Tensor) else getattr(self, f)
                        for f in self.__dataclass_fields__))

    def unpack(self, flat: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """Per-target values [K] -> the padded response layout [n, R] (zeros where a row has no token)."""
        out = flat.new_full(self.r_mask.shape, fill)
        out[self.r_mask] = flat
        return out


def pack(ids: torch.Tensor, mask: torch.Tensor, r_mask: torch.Tensor, r_ids: torch.Tensor, p_width: int) -> Packed:
    """Pack rows given in the learner's padded layout (actors.trainable `_sequences`: left-padded prompts
    then right-padded responses, `mask` over both) into one sequence, dropping every pad token."""
    real = mask.bool()
    lengths = real.sum(1)
    r_len = r_mask.sum(1)
    p_len = lengths - r_len
    flat = ids[real]
    starts = torch.cumsum(lengths, 0) - lengths
    positions = torch.arange(len(flat)) - starts.repeat_interleave(lengths)
    within = torch.arange(int(r_len.sum())) - (torch.cumsum(r_len, 0) - r_len).repeat_interleave(r_len)
    at = (starts + p_len - 1).repeat_interleave(r_len) + within  # the position before each response token
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lengths, 0)
    return Packed(input_ids=flat[None], position_ids=positions[None], cu_seqlens=cu,
                  max_len=int(lengths.max()) if len(lengths) else 0, targets=r_ids[r_mask.bool()], at=at,
                  tail=starts + lengths - 1, r_mask=r_mask.bool(), seq_lengths=lengths)
