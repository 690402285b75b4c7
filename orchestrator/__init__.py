"""coevo control plane: config, the Arrow batch contract, the async loop, metrics, checkpoints, CLI."""

__version__ = "0.1.0"
