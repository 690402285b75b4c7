"""The credit step: between scoring and learning, on the driver (as verl and prime-rl do), a scored
train batch becomes what a policy learner trains on, written as Arrow columns:

- `reward`: the reward sources aggregated (actors/rewards/aggregate.py), after the reward columns a
  recipe computes first (LaSeR's self-reward from the generators' `laser_logprob`);
- `advantages`: one float per response token: an outcome estimator's advantage (the registry,
  `algorithm.advantage`) on every token of the row, or GAE on a critic's `old_values` (recipe
  ppo); plus the process advantages of `token_rewards` times a weight (PRIME's
  `prime.process_weight`; 1 for a verifier's dense rewards); 0 on rows whose `reward_mask` is False;
- `returns`: GAE's returns, which the critic trains on.

The math is the pure functions of actors/algorithms; this module only feeds them the batch's tensors
and writes their results back. A recipe declares its credit step (`Recipe.credit`): which reward
columns come first, how advantages are estimated and the process weight. The loop runs it once per
train batch (orchestrator/loop.py) and checkpoints its state (the aggregator's running statistics,
LaSeR's offset c) with the loop state, so the learner keeps none of it and knows no recipe.
See docs/learner.md#the-credit-step.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from actors import batch as B


class Outcome:
    """One advantage per row from its scalar reward and its group (`algorithm.advantage`: grpo,
    rloo, ...), the same on every response token."""

    def __init__(self, config, name: str | None = None):
        from actors.algorithms import ADVANTAGES

        self.name = name or config.algorithm.advantage
        self.estimator = ADVANTAGES.get(self.name)
        self.config = config

    def __call__(self, table: pa.Table, rewards: torch.Tensor, groups: torch.Tensor,
                 r_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """(per-token advantages [N, R], the outcome advantage of each row [N], columns to add)."""
        outcome = estimate(self.estimator, rewards, groups, self.config)
        return outcome[:, None].expand(r_mask.shape).clone(), outcome, {}


class GAE:
    """PPO's advantages (Schulman et al. 2016), per response token, from the outcome reward and a
    critic's `old_values`, whitened over the batch's tokens if asked; the returns for the critic."""
    uses_values = True  # a credit step with these advantages runs an estimator that needs_values (gae)

    def __init__(self, gamma: float = 1.0, lam: float = 0.95, whiten: bool = True):
        self.gamma, self.lam, self.whiten = gamma, lam, whiten

    def __call__(self, table: pa.Table, rewards: torch.Tensor, groups: torch.Tensor,
                 r_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        from actors.algorithms.advantages import gae_advantages

        if "old_values" not in table.schema.names:
            raise B.BatchError("GAE needs the critic's per-token `old_values` column (its values_of, before the "
                               f"credit step); the batch has {table.schema.names}")
        values, _ = B.to_padded(table.column("old_values"), 0.0, torch.float32, width=r_mask.shape[1])
        adv, returns = gae_advantages(rewards, values, r_mask, self.gamma, self.lam)
        if self.whiten:
            valid = adv[r_mask]
            if len(valid) > 1:
                adv = torch.where(r_mask, (adv - valid.mean()) / (valid.std() + 1e-8), torch.zeros_like(adv))
        outcome = (adv * r_mask).sum(1) / r_mask.sum(1).clamp(min=1)
        return adv, outcome, {"returns": returns}


class RewardColumns:
    """Reward columns a recipe computes on the driver before aggregation (LaSeR's self-reward), with
    state the checkpoint keeps. Subclasses set `name` (its key in the credit step's state)."""

    name = "rewards"

    def __call__(self, table: pa.Table) -> pa.Table:
        return table

    def metrics(self) -> dict:
        return {}

    def advantage_scale(self, table: pa.Table) -> np.ndarray | None:
        """A factor per row on its advantages, after they are estimated (None: none)."""
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def check_advantages(config, advantages) -> None:
    """The one check that algorithm.advantage and the recipe's credit step go together: an estimator
    that needs a critic's values per token (gae) runs only where the credit step has them (GAE,
    recipe ppo), and such a credit step only with such an estimator. Config validation builds the
    recipe's credit step, so this is reported when the config loads."""
    from actors.algorithms import ADVANTAGES

    name = config.algorithm.advantage
    needs = getattr(ADVANTAGES.get(name), "needs_values", False)
    if needs and not getattr(advantages, "uses_values", False):
        raise ValueError(f"algorithm.advantage={name} needs a critic's values per token: recipe "
                         f"{config.recipe!r} estimates advantages from rewards alone (its credit step has no GAE)")
    if not needs and getattr(advantages, "uses_values", False):
        wanted = [n for n in ADVANTAGES.names() if getattr(ADVANTAGES.get(n), "needs_values", False)]
        raise ValueError(f"recipe {config.recipe} trains with algorithm.advantage={'/'.join(wanted)} (its critic's "
                         f"values), not {name!r}")


class Credit:
    """A recipe's credit step. `aggregate`/`sources`: the aggregation spec and reward sources (default:
    the config's); `advantages`: Outcome (default) or GAE; `process_weight`: the coefficient of the
    process advantages of `token_rewards`; `rewards`: RewardColumns that run before aggregation."""

    def __init__(self, config, aggregate: dict | None = None, sources: list[str] | None = None,
                 advantages=None, process_weight: float = 1.0, rewards: list[RewardColumns] = ()):
        from actors.rewards.aggregate import Aggregator

        self.aggregator = Aggregator(config.aggregate_spec() if aggregate is None else aggregate,
                                     sources=[r.name for r in config.rewards] if sources is None else sources)
        self.advantages = Outcome(config) if advantages is None else advantages
        check_advantages(config, self.advantages)
        self.process_weight = process_weight
        self.rewards = list(rewards)

    # ---- state: checkpointed with the loop ---------------------------------------------------------
    def state_dict(self) -> dict:
        return {"aggregator": self.aggregator.state_dict(), **{r.name: r.state_dict() for r in self.rewards}}

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict):
            raise ValueError(f"credit step state must be a dict, got {type(state).__name__}")
        self.aggregator.load_state_dict(state.get("aggregator", {}))
        for part in self.rewards:
            part.load_state_dict(state.get(part.name, {}))

    # ---- the step ----------------------------------------------------------------------------------
    def apply(self, *tables: pa.Table) -> tuple[pa.Table, dict]:
        """The train batch (its pieces concatenated, rows in order) with `reward`, `advantages` (and
        `returns` under GAE), and the metrics of its rewards and advantages."""
        from actors.algorithms.advantages import combine_advantages, process_advantages

        table = B.concat(list(tables))
        B.validate(table)
        for part in self.rewards:
            table = part(table)
        table, metrics = self.aggregator.apply(table)
        rewards = torch.from_numpy(table.column("reward").to_numpy().astype(np.float32))
        groups = torch.from_numpy(B.group_index(table))
        r_mask = B.response_mask(table)
        adv, outcome, columns = self.advantages(table, rewards, groups, r_mask)
        if "token_rewards" in table.schema.names:  # dense (process) rewards: per-token advantages
            # over the tokens that train (multi-turn episodes: the policy's, not the observations')
            mask = B.loss_mask(table).float()
            dense, _ = B.to_padded(table.column("token_rewards"), 0.0, torch.float32, width=r_mask.shape[1])
            process = process_advantages(dense, mask, groups)
            adv = combine_advantages(outcome, self.process_weight * process, mask)
        if "reward_mask" in table.schema.names:  # e.g. Parrot selection: dominated samples do not train
            active = torch.from_numpy(table.column("reward_mask").to_numpy(zero_copy_only=False).astype(bool))
            adv = adv * active[:, None]
        for part in self.rewards:  # e.g. judge_credit.fill_weight: the judge's share of the step
            scale = part.advantage_scale(table)
            if scale is not None:
                factor = torch.from_numpy(np.asarray(scale, np.float32))
                adv, outcome = adv * factor[:, None], outcome * factor
        lengths = r_mask.sum(1).numpy()
        columns = {"advantages": adv, **columns}
        for name, values in columns.items():
            table = B.replace_column(table, name, B.list_column(values[r_mask].numpy(), lengths, pa.float32()))
        for part in self.rewards:
            metrics.update(part.metrics())
        metrics.update(advantage_metrics(rewards, groups, outcome))
        return B.with_version(table), metrics

    async def run(self, tables: list) -> tuple[list, dict]:
        """The loop's call: the batch's pieces (object refs or tables) -> [one table ref], metrics.
        The arithmetic runs in a worker thread, so the event loop keeps dispatching rollouts."""
        import ray

        fetched = await asyncio.gather(*[_fetch(t) for t in tables])
        table, metrics = await asyncio.to_thread(self.apply, *fetched)
        return [ray.put(table)], metrics


def legacy_state(learner_dir: Path) -> dict | None:
    """The credit step's state in a checkpoint written before it left the learner: the policy
    learner's aggregator statistics and LaSeR's c, in its learner_state.pt (None: no such file)."""
    from actors.trainable import STATE_FILE

    path = Path(learner_dir) / STATE_FILE
    if not path.is_file():
        return None
    extra = torch.load(path, weights_only=False).get("extra", {})
    out = {"aggregator": extra["aggregator"]} if "aggregator" in extra else {}
    if extra.get("laser_c") is not None:
        out["laser"] = {"c": extra["laser_c"]}
    return out


async def _fetch(table):
    import ray

    return await table if isinstance(table, ray.ObjectRef) else table


def advantage_metrics(rewards: torch.Tensor, groups: torch.Tensor, outcome: torch.Tensor) -> dict:
    n_groups = int(groups.max()) + 1 if len(groups) else 0
    lo = torch.full((n_groups,), math.inf).scatter_reduce(0, groups, rewards, "amin")
    hi = torch.full((n_groups,), -math.inf).scatter_reduce(0, groups, rewards, "amax")
    return {"train/advantage_abs_mean": float(outcome.abs().mean()),
            # groups whose samples all got the same reward carry no group-relative signal
            "samples/uniform_reward_groups_frac": float((lo == hi).float().mean()) if n_groups else 0.0}


def estimate(estimator, rewards: torch.Tensor, groups: torch.Tensor, config) -> torch.Tensor:
    """An advantage estimator's output; one that takes a `config` keyword gets the run's config, so a
    recipe's own settings section can parametrise it (examples/pass_at_k.py)."""
    return estimator(rewards, groups, config=config) if _takes_config(estimator) else estimator(rewards, groups)


@functools.lru_cache(maxsize=None)
def _takes_config(estimator) -> bool:
    """Once per estimator, not per step."""
    try:
        return "config" in inspect.signature(estimator).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False
