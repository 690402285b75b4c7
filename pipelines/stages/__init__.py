"""The stages a recipe runs before its RL loop (orchestrator.stages): SFT, reward-model, judging and
self-verification warm-ups."""
