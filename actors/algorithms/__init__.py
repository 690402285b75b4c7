"""Algorithm registries by name; add your own with the `register` decorators.

- ADVANTAGES: outcome advantage estimators, `(rewards [N], groups [N]) -> [N]` (advantages.py).
- POLICY_LOSSES: `(logp, old_logp, adv, clip_eps=..., mask=None) -> (loss [B, T], stats)`: ppo_clip
  (losses.py), gspo, gmpo, cispo, topr (policy_losses.py).
- OFF_POLICY: off-policy corrections, `(logp, behavior_logp, *, proximal_logprobs=None, is_cap=2.0)
  -> (anchor, weight, truncated)`: none / tis / decoupled_ppo; each composes with any policy loss
  (`losses.corrected`: weight * policy_loss(logp, anchor, adv)).
- KL_ESTIMATORS: `(logp, ref_logp) -> [B, T]`: k1 / k2 / k3 (`algorithm.kl_estimator`; which
  divergence each one's gradient follows: losses.py).
- PREFERENCE_LOSSES: pairwise losses with one keyword interface (preference.py).

value.py: the critic's clipped value loss (a plain function; the `value` learner objective calls it).
"""

from actors.registry import Registry

# each registry imports the modules of its built-ins on its first lookup
ADVANTAGES = Registry("advantage estimator", plugins=("actors.algorithms.advantages",))
POLICY_LOSSES = Registry("policy loss", plugins=("actors.algorithms.losses", "actors.algorithms.policy_losses"))
OFF_POLICY = Registry("off-policy correction", plugins=("actors.algorithms.losses",))
KL_ESTIMATORS = Registry("KL estimator", plugins=("actors.algorithms.losses",))
PREFERENCE_LOSSES = Registry("preference loss", plugins=("actors.algorithms.preference",))
