"""Role kinds are declared by recipes: checked, given per-kind defaults, and used by the config's
cross-checks in place of role names."""

from __future__ import annotations

import pytest

from orchestrator.config import load_config
from orchestrator.roles import DEFAULT_TIMEOUT_S, RoleError, RoleSpec, resolve

CRITIC = '''
from orchestrator.roles import RoleSpec
from pipelines.grpo import GRPO


class Critic(GRPO):
    @classmethod
    def roles(cls, config, sources):
        return {"critic": RoleSpec("actors.reward_learner:RewardLearner", (None,), kind="learner")}
'''


def test_a_role_without_a_known_kind_is_refused() -> None:
    with pytest.raises(ValueError, match=r"role actor 'a:B': kind '' is not one of \['learner', 'generator', "):
        RoleSpec("a:B")
    with pytest.raises(ValueError, match="kind 'critic' is not one of"):
        RoleSpec("a:B", kind="critic")


def test_kind_defaults_and_the_config_override() -> None:
    learner = RoleSpec("a:B", kind="learner", max_restarts=5)
    assert learner.learner and learner.max_restarts == 0 and learner.timeout_s is None
    assert RoleSpec("a:B", kind="verifier").timeout_s == DEFAULT_TIMEOUT_S["verifier"] == 900.0
    cfg = load_config(None, ["roles.generator.timeout_s=5", "roles.verifier.timeout_s=0",
                             "roles.policy_learner.max_restarts=3"])
    gen = resolve(RoleSpec("a:B", kind="generator"), cfg.roles.get("generator"))
    assert gen.timeout_s == 5 and not gen.learner
    assert resolve(RoleSpec("a:B", kind="verifier"), cfg.roles.get("verifier")).timeout_s is None  # 0: no limit
    assert resolve(RoleSpec("a:B", kind="scorer"), None).timeout_s == 1800.0
    assert resolve(RoleSpec("a:B", kind="learner"), cfg.roles.get("policy_learner")).max_restarts == 0


def test_a_learner_named_critic_runs_as_ranks_and_a_class_that_cannot_is_named(tmp_path, monkeypatch) -> None:
    from orchestrator.pools import build_pools

    (tmp_path / "kinds_critic.py").write_text(CRITIC)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(None, ["recipe=kinds_critic:Critic", "roles.critic.replicas=2"])
    assert cfg.roles["critic"].replicas == 2  # RewardLearner is a Trainable: it forms a group
    assert load_config(None, ["recipe=kinds_critic:Critic"]).roles == {}
    # a learner class that is no Trainable is refused before any placement group or actor exists
    with pytest.raises(RoleError, match=r"roles.critic.replicas=2: Generator \(actors.generator:Generator\) "
                                        r"cannot run as ranks of a group \(it has no rendezvous\)"):
        build_pools({"critic": RoleSpec("actors.generator:Generator", kind="learner")}, cfg)


def test_verifiers_default_to_one_per_eight_generators_unless_set() -> None:
    from orchestrator.recipes import Sources, policy_roles

    def verifiers(*overrides: str) -> RoleSpec:
        cfg = load_config(None, list(overrides))
        return resolve(policy_roles(Sources())["verifier"], cfg.roles.get("verifier"), cfg)

    assert verifiers().replicas == 1  # generators left at the recipe's default
    assert verifiers("roles.generator.replicas=8").replicas == 1
    v = verifiers("roles.generator.replicas=32")
    assert (v.replicas, v.min_replicas, v.max_replicas, v.elastic) == (4, 4, 4, False)
    assert "one per 8 generator replicas" in v.note
    from types import SimpleNamespace

    from orchestrator.roles import Pool
    assert Pool.describe(SimpleNamespace(name="verifier", spec=v)) == (  # the run's start says why
        "verifier: 4 replicas (one per 8 generator replicas; set roles.verifier.replicas to choose)")
    assert Pool.describe(SimpleNamespace(name="verifier", spec=verifiers())) is None
    assert verifiers("roles.generator.replicas=9").replicas == 2
    assert verifiers("roles.generator.replicas={min: 1, max: 20}").replicas == 3  # an elastic pool's most
    assert verifiers("roles.generator.replicas=32", "roles.verifier.replicas=1").replicas == 1  # the user's
    assert verifiers("roles.generator.replicas=32", "roles.verifier.num_cpus=1").num_cpus == 1


def test_an_actor_that_fails_to_start_is_named_by_its_role() -> None:
    import asyncio

    import ray

    from orchestrator.pools import ready

    class Fine:
        async def ready(self) -> None:
            pass

    class Broken:
        async def ready(self) -> None:
            raise ray.exceptions.RayActorError()

    with pytest.raises(RoleError, match=r"^role 'generator': its actor failed to start"):
        asyncio.run(ready({"policy_learner": Fine(), "generator": Broken()}))
    asyncio.run(ready({"policy_learner": Fine()}))
