"""The stages a recipe runs before its RL loop (orchestrator.stages): SFT, reward-model, judging and
self-verification warm-ups."""

from __future__ import annotations

from pathlib import Path

from orchestrator.stages import Stage


class PolicyWarmup(Stage):
    """A warm-up that fine-tunes the previous stage's policy (`sources.policy`), cached under a key
    that holds it: `key(config, source)` is its cache path, `work(ctx, out_dir)` trains and saves."""

    key = work = None  # staticmethods of the subclass's module

    def cache_path(self, config, sources) -> Path:
        return self.key(config, sources.policy)

    async def train(self, ctx, out_dir: Path, sources) -> dict:
        return await self.work(ctx, out_dir)
