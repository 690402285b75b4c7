"""Rollout production: prompt pieces go through generation and the recipe's per-piece scoring
stages into a buffer, paced by admission control; the loop takes whole train batches from it.

Admission control (AReaL's capacity rule): a piece of c prompt groups is dispatched only while
`admitted + c <= (trained + k + 1) * B` (B groups per train batch, k = train.max_staleness, trained =
batches the learner has finished). So no sample lags the learner by more than k versions, without
generating freely and discarding stale samples later (which biases training toward short, fast
responses). Staleness is re-checked when a batch is taken; anything dropped is counted with a reason.

Every piece has a sequence number `seq`: it names its samples (uid `seq.prompt.sample`) and seeds
their sampling, so a piece retried after a replica died reproduces the same samples, and a resumed
run regenerates pieces that were in flight at the checkpoint under the same names.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa
import ray

from orchestrator.batch_source import BatchSource

log = logging.getLogger("coevo")
UNIFORM = "uniform_reward"  # the drop reason of dynamic sampling


@dataclass
class Piece:
    seq: int
    prompts: pa.Table  # kept by the driver: small, and needed to retry or to checkpoint in-flight work
    groups: int
    samples: int
    table: ray.ObjectRef | None = None  # scored rollout table (in the object store)
    version: int = -1  # policy version the generator held when the piece was dispatched to it
    info: dict = field(default_factory=dict)
    dispatched_at: float = field(default_factory=time.perf_counter)


class Rollouts(BatchSource):
    """Generates and scores pieces concurrently; `take(B)` returns the oldest complete pieces that
    together hold B prompt groups."""

    def __init__(self, ctx, recipe, state: dict | None = None):
        cfg = ctx.config
        self.ctx, self.recipe = ctx, recipe
        self.k = cfg.train.max_staleness
        self.batch_groups = cfg.rollout.prompts_per_step
        # an elastic pool: pieces for its max, so that replicas it adds have work
        self.chunk = cfg.rollout.chunk_prompts or max(1, self.batch_groups // ctx.pools["generator"].spec.max_replicas)
        while self.batch_groups % self.chunk:  # pieces never straddle train batches
            self.chunk -= 1
        self.n = cfg.rollout.samples_per_prompt
        self.dynamic = cfg.rollout.dynamic_sampling
        self.max_tries = cfg.rollout.max_sampling_tries
        self.ready: dict[int, Piece] = {}
        self.inflight: dict[int, Piece] = {}
        self.tasks: set[asyncio.Task] = set()
        self.counts: Counter = Counter()  # samples: dispatched, consumed, dropped/<reason>
        state = state or {}
        self.seq = state.get("seq", 0)
        self.trained = state.get("trained", 0)
        self.admitted = state.get("admitted", 0)  # groups dispatched and not dropped
        self.filtered = state.get("filtered", 0)  # uniform groups dropped since the last trained batch
        self.counts.update(state.get("counts", {}))
        self.error: BaseException | None = None
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._stopped = False
        self.producer: asyncio.Task | None = None
        self._pending_restore = state.get("pieces", [])

    # ---- production -------------------------------------------------------------------------------
    def start(self) -> None:
        for saved in self._pending_restore:  # pieces of the checkpoint: buffered ones come back as they were
            groups = saved.get("groups", saved["prompts"].num_rows)  # fewer after dynamic sampling
            piece = Piece(seq=saved["seq"], prompts=saved["prompts"], groups=groups,
                          samples=saved.get("samples", groups * self.n), version=saved["version"])
            if saved.get("table") is not None:
                piece.table, piece.info = ray.put(saved["table"]), saved.get("info", {})
                self.ready[piece.seq] = piece
            else:  # it was in flight: generate it again under the same seq (same uids and seeds)
                self._launch(piece)
        self._pending_restore = []
        self.producer = asyncio.ensure_future(self._produce())

    def _capacity(self) -> int:
        return (self.trained + self.k + 1) * self.batch_groups - self.admitted

    async def _produce(self) -> None:
        try:
            while not self._stopped:
                self._fill()
                self._wake.clear()
                await self._wake.wait()
        except Exception as e:  # noqa: BLE001  (surfaced by take())
            self._fail(e)

    def _fill(self) -> None:
        """Dispatch pieces while admission allows (synchronously: their tasks start at the next turn
        of the event loop, before anything else the loop does)."""
        while not self._stopped and self._capacity() > 0:
            # paired prompts (data.analogs) come in whole pairs, so a piece may hold one fewer or
            # more than asked: ask for what admission still allows
            prompts = self.ctx.sampler.next(min(self.chunk, self._capacity()))
            piece = Piece(seq=self.seq, prompts=prompts, groups=prompts.num_rows, samples=prompts.num_rows * self.n)
            self.seq += 1
            self.admitted += piece.groups
            self.counts["samples/dispatched"] += piece.samples
            self._launch(piece)

    def _launch(self, piece: Piece) -> None:
        self.inflight[piece.seq] = piece
        task = asyncio.ensure_future(self._rollout(piece))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _rollout(self, piece: Piece) -> None:
        try:
            gen = self.ctx.pools["generator"]
            piece.table, info = await gen.call("generate", piece.prompts, seq=piece.seq, versioned=True)
            piece.version = info["version"]
            piece.info = {"generate_s": info["busy_s"], "tokens": info.get("tokens", 0),
                          **{k: v for k, v in info.items() if k.startswith("env/")}}  # episode counts
            piece.table, more = await self.recipe.score_piece(self.ctx, piece.table)
            piece.info.update(more)
            if self.dynamic:
                await self._keep_informative(piece)
            self.inflight.pop(piece.seq, None)
            self.ready[piece.seq] = piece
            self._changed.set()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001
            self._fail(e)

    async def _keep_informative(self, piece: Piece) -> None:
        """Dynamic sampling: drop the piece's groups whose rewards are all equal and let admission
        dispatch prompts in their place, within the bound of max_sampling_tries x B groups per batch."""
        from actors.batch import uniform_groups

        table = await piece.table
        uniform = uniform_groups(table)
        dropped = len(set(uniform.tolist()) - {-1})
        if not dropped:
            return
        rows = int((uniform >= 0).sum())
        if self.filtered + dropped > (self.max_tries - 1) * self.batch_groups:
            self.counts["samples/uniform_kept_at_bound"] += rows
            return
        piece.table = ray.put(table.filter(pa.array(uniform < 0)))
        piece.groups -= dropped
        piece.samples -= rows
        self.admitted -= dropped
        self.filtered += dropped
        self.counts[f"samples/dropped/{UNIFORM}"] += rows
        self._fill()

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self._changed.set()

    # ---- consumption ------------------------------------------------------------------------------
    async def take(self) -> list[Piece] | None:
        """The oldest complete pieces holding one train batch of prompt groups, none staler than k;
        None if a stop was requested while waiting."""
        while True:
            if self.error is not None:
                raise self.error
            if self.ctx.stop_requested:
                return None
            current = self.ctx.pools["generator"].version  # the policy version generators now hold
            for seq in sorted(self.ready):
                if self.ready[seq].version < current - self.k:  # possible only after retries
                    self._drop(self.ready[seq], "stale")
            # In order of seq, so that every run draws the same batches: stop at the first piece
            # that is still in flight.
            batch, groups = [], 0
            for seq in sorted([*self.ready, *self.inflight]):
                if seq not in self.ready:
                    break
                batch.append(self.ready[seq])
                groups += batch[-1].groups
                if groups >= self.batch_groups:
                    return self._consume(batch)
            if batch and not self.inflight and self._capacity() <= 0:
                # paired prompts made an earlier batch a group larger: nothing more may come before
                # this batch trains, so it goes a group short
                return self._consume(batch)
            self._changed.clear()
            await self._changed.wait()

    def _consume(self, batch: list[Piece]) -> list[Piece]:
        for p in batch:
            del self.ready[p.seq]
            self.counts["samples/consumed"] += p.samples
        return batch

    def _drop(self, piece: Piece, reason: str) -> None:
        del self.ready[piece.seq]
        self.admitted -= piece.groups
        self.counts[f"samples/dropped/{reason}"] += piece.samples
        log.warning("dropped piece %d (%d samples): %s", piece.seq, piece.samples, reason)
        self._fill()

    def interrupt(self) -> None:
        """Wake a waiting take() (a stop was requested)."""
        self._changed.set()

    def trained_batch(self) -> None:
        """The learner finished a batch: admission may dispatch the next one, right away."""
        self.trained += 1
        self.filtered = 0
        try:
            self._fill()
        except Exception as e:  # noqa: BLE001  (surfaced by take())
            self._fail(e)

    # ---- bookkeeping ------------------------------------------------------------------------------
    def accounting(self) -> dict[str, int]:
        """Sample counts; `lost` = dispatched - consumed - dropped - still buffered or in flight,
        which must stay 0."""
        out = dict(self.counts)
        pending = sum(p.samples for p in [*self.ready.values(), *self.inflight.values()])
        dropped = sum(v for k, v in self.counts.items() if k.startswith("samples/dropped/"))
        out["samples/pending"] = pending
        out["samples/lost"] = (self.counts["samples/dispatched"] - self.counts["samples/consumed"]
                               - dropped - pending)
        return out

    async def snapshot(self) -> dict:
        """Everything needed to continue: counters, and the buffered pieces (their tables fetched)
        and in-flight pieces (their prompts, to generate again)."""
        pieces = []
        for piece in sorted([*self.ready.values(), *self.inflight.values()], key=lambda p: p.seq):
            table = None
            if piece.seq in self.ready:
                table = await piece.table
            pieces.append({"seq": piece.seq, "prompts": piece.prompts, "version": piece.version,
                           "table": table, "info": piece.info, "groups": piece.groups, "samples": piece.samples})
        return {"seq": self.seq, "trained": self.trained, "admitted": self.admitted, "filtered": self.filtered,
                "counts": dict(self.counts), "pieces": pieces}

    async def stop(self) -> None:
        """Stop producing. Pieces still buffered or in flight are dropped as "run_ended", so the
        accounting closes (dispatched = consumed + dropped); a checkpoint taken before this keeps
        them, and a resumed run generates them again under the same seq."""
        self._stopped = True
        self._wake.set()
        for task in [self.producer, *self.tasks]:
            if task is not None:
                task.cancel()
        await asyncio.gather(*[t for t in [self.producer, *self.tasks] if t is not None], return_exceptions=True)
        left = [*self.ready.values(), *self.inflight.values()]
        if left:
            self.counts["samples/dropped/run_ended"] += sum(p.samples for p in left)
            self.admitted -= sum(p.groups for p in left)
            self.ready.clear()
            self.inflight.clear()
