"""Advantage estimators and policy losses by name; add your own with the `register` decorators."""

from actors.registry import Registry

ADVANTAGES = Registry("advantage estimator")
POLICY_LOSSES = Registry("policy loss")

from actors.algorithms import advantages, losses  # noqa: E402,F401  (register built-ins)
