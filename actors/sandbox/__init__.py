"""The code sandbox: where coevo runs what it does not trust (a policy's programs, for code_tests'
unit tests and the environments' Python tool, and user reward functions), confined by the kernel.
docs/security.md says what each layer stops and what the sandbox does not promise.

Its interface is the names below; the rest of coevo imports them from here (`from actors.sandbox
import RewardPool`), never the modules behind them. Each is resolved on first use, so the zygote
(`python -m actors.sandbox.worker`) starts without importing the rest of the package.

- RewardPool, Scored: a pool of zygote-forked worker processes (their own sessions, `nobody`, no
  capabilities, Landlock, rlimits, killed with their process groups on timeout, JSON-only replies)
  that run functions by name or `module:function` over samples (pool.py, worker.py, limits.py,
  mountns.py). The verifier's reward functions and the Python tool (actors/envs/sandbox.py) use it.
- run_confined, run_test, audit_hook_on, limit_reason: one fresh `python -I -S -B` process under every
  kernel layer, watched from outside (run.py; run_test runs one of code_tests' tests, whose harness
  is harness.py and whose verdict the parent takes in asserts.py).
- check, LAYERS, ALLOW_ENV, allowed_missing, remember_rules: those kernel layers and which of them
  hold here (child.py).
- plan_test, bound_names, setup_constants, whitelisted_imports: code_tests' tests, parsed in the
  parent before anything runs (asserts.py).
"""

from __future__ import annotations

import importlib

# name -> (module of this package, its name there)
_EXPORTS = {
    "RewardPool": ("pool", "RewardPool"), "Scored": ("worker", "Scored"),
    "run_confined": ("run", "run_confined"), "run_test": ("run", "run_test"),
    "audit_hook_on": ("run", "audit_hook_on"), "limit_reason": ("run", "_limit"),
    "check": ("child", "check"), "LAYERS": ("child", "LAYERS"), "ALLOW_ENV": ("child", "ALLOW_ENV"),
    "allowed_missing": ("child", "allowed_missing"), "remember_rules": ("child", "remember_rules"),
    "plan_test": ("asserts", "plan_test"), "bound_names": ("asserts", "bound_names"),
    "setup_constants": ("asserts", "setup_constants"), "whitelisted_imports": ("asserts", "whitelisted_imports"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'actors.sandbox' has no attribute {name!r}; its interface: {__all__}")
    module, attr = _EXPORTS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
