"""rollout.vllm_sleep_level: the Generator sleeps its engine for the learner's step and never
generates from discarded weights. vLLM's CPU build cannot sleep, so the real HF backend stands in,
wrapped to do what vLLM's sleep levels do to the weights (docs/vllm.md: not run on a GPU here)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pyarrow as pa
import pytest
import ray
import torch

from actors import modeling
from actors.generation.hf import HFBackend
from actors.generator import Generator
from actors.weights import WeightMismatchError, export_state
from orchestrator.colocation import sleep_generators
from orchestrator.config import ConfigError, load_config, validate_config

PROMPTS = pa.table({"prompt_id": ["a", "b"], "prompt": ["12+7=", "3+45="]})


class Sleepy:
    """The HF backend with vLLM's sleep semantics: level 1 offloads the weights and wake_up restores
    them; level 2 discards them, and wake_up leaves garbage (NaN here) until the next load."""
    can_sleep = True

    def __init__(self, backend: HFBackend, events: list):
        self.backend, self.events, self.offloaded = backend, events, None

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def sleep(self, level: int) -> None:
        self.events.append(f"sleep {level}")
        params = list(self.backend.model.parameters())
        self.offloaded = [p.detach().clone() for p in params] if level == 1 else None
        for p in params:
            p.data.fill_(float("nan"))

    def wake_up(self) -> None:
        self.events.append("wake")
        if self.offloaded is not None:
            for p, saved in zip(self.backend.model.parameters(), self.offloaded):
                p.data.copy_(saved)

    def load_weights(self, payload: dict, version: int) -> None:
        self.events.append(f"load {version}")
        self.backend.load_weights(payload, version)

    def generate(self, *args, **kwargs):
        self.events.append("generate")
        return self.backend.generate(*args, **kwargs)


def config():
    return validate_config({"seed": 0, "rollout": {"max_new_tokens": 8}, "rewards": [{"name": "integer_match"}],
                            "train": {"threads": 1}})


def sleepy_generator(level: int) -> tuple[Generator, list]:
    generator, events = Generator(config(), None), []
    generator.backend = Sleepy(generator.backend, events)
    # the config allows a sleep level with rollout.backend=vllm only, which this machine cannot sleep
    generator.config = generator.config.model_copy(update={"vllm_sleep_level": level})
    return generator, events


def greedy(generator) -> list:
    table, info = generator.generate(PROMPTS, greedy=True)
    return [table.column("response_ids").to_pylist(), info["version"]]


def test_level_2_wakes_then_loads_the_new_version_and_never_generates_from_discarded_weights():
    generator, events = sleepy_generator(2)
    cfg = config()
    old, new = (modeling.build(cfg.model, seed)[0] for seed in (0, 7))
    generator.update_weights(1, export_state(old, 1))
    assert generator.sleep() and generator.sleep()  # asleep already: one sleep
    assert all(torch.isnan(p).all() for p in generator.backend.model.parameters())
    generator.update_weights(2, export_state(new, 2))
    assert events == ["load 1", "sleep 2", "wake", "load 2"]
    reference = Generator(cfg, None)
    reference.update_weights(2, export_state(new, 2))
    assert greedy(generator) == greedy(reference)

    # a generation before the next update is refused, and so is one after a refused update
    generator.sleep()
    with pytest.raises(RuntimeError, match=r"replica 0 slept at rollout.vllm_sleep_level=2, which discards its "
                                           r"weights, and has not been sent a version since \(it held 2\)"):
        generator.generate(PROMPTS, greedy=True)
    bad = export_state(old, 3)
    del bad["state"]["model.norm.weight"]
    with pytest.raises(WeightMismatchError):
        generator.update_weights(3, bad)
    with pytest.raises(RuntimeError, match="slept at rollout.vllm_sleep_level=2"):
        generator.generate(PROMPTS, greedy=True)
    generator.update_weights(3, export_state(new, 3))
    assert greedy(generator)[0] == greedy(reference)[0] and generator.version == 3


def test_level_1_wakes_with_its_weights_for_a_generation_before_any_update():
    generator, events = sleepy_generator(1)
    before = greedy(generator)
    generator.sleep()
    assert greedy(generator) == before
    assert events == ["generate", "sleep 1", "wake", "generate"]


def test_a_backend_that_cannot_sleep_warns_once_and_keeps_its_memory(caplog):
    cfg = config()
    generator = Generator(cfg, None)
    generator.config = generator.config.model_copy(update={"vllm_sleep_level": 2})
    assert generator.sleep() is False and not generator.asleep
    with caplog.at_level(logging.WARNING, logger="coevo"):
        sleepless = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"vllm_sleep_level": 2})})
        Generator(sleepless, None)
    assert [r.getMessage() for r in caplog.records] == [
        "rollout.vllm_sleep_level=2: generator replica 0 cannot sleep on cpu (vLLM's CPU build ignores "
        "sleep/wake_up); it keeps its memory while the learner trains"]


def test_the_loop_sleeps_the_live_generators_its_channels_publish_to():
    asked = []

    def replica(name, index, answer, alive=True):
        async def sleep():
            asked.append((name, index))
            if isinstance(answer, BaseException):
                raise answer
            return answer
        return SimpleNamespace(index=index, alive=alive, handle=SimpleNamespace(sleep=SimpleNamespace(remote=sleep)))

    def pool(name, kind, *replicas):
        return SimpleNamespace(name=name, spec=SimpleNamespace(kind=kind), replicas=list(replicas))

    gen = pool("generator", "generator", replica("generator", 0, True), replica("generator", 1, True, alive=False))
    judge = pool("judge", "generator", replica("judge", 0, True))
    scorer = pool("reward_model", "scorer", replica("reward_model", 0, True))
    ctx = SimpleNamespace(channels={"policy": SimpleNamespace(targets=[gen, judge]),
                                    "rm": SimpleNamespace(targets=[scorer]),
                                    "again": SimpleNamespace(targets=[gen])})
    assert asyncio.run(sleep_generators(ctx)) is True
    assert asked == [("generator", 0), ("judge", 0)]
    judge.replicas = [replica("judge", 0, False)]  # a build that cannot sleep: the loop stops asking
    assert asyncio.run(sleep_generators(ctx)) is False
    judge.replicas = [replica("judge", 0, ray.exceptions.RayActorError())]  # died: the pool restarts it
    assert asyncio.run(sleep_generators(ctx)) is True
    judge.replicas = [replica("judge", 0, RuntimeError("cuMem failed"))]
    with pytest.raises(RuntimeError, match="cuMem failed"):
        asyncio.run(sleep_generators(ctx))


def test_sleep_levels_are_checked_against_the_backend_and_async_mode():
    with pytest.raises(ConfigError, match=r"rollout.vllm_sleep_level=1 applies to rollout.backend=vllm, not 'hf'"):
        load_config(None, ["rollout.vllm_sleep_level=1"])
    with pytest.raises(ConfigError, match=r"rollout.vllm_sleep_level: Input should be less than or equal to 2"):
        load_config(None, ["rollout.backend=vllm", "rollout.vllm_sleep_level=3"])
    with pytest.raises(ConfigError, match=r"rollout.vllm_sleep_level=2 sleeps the generators while the learner "
                                          r"trains, but train.max_staleness=1 overlaps generation with training"):
        load_config(None, ["rollout.backend=vllm", "rollout.vllm_sleep_level=2", "train.max_staleness=1",
                           "algorithm.off_policy=tis"])
    assert load_config(None, ["rollout.backend=vllm", "rollout.vllm_sleep_level=2"]).rollout.vllm_sleep_level == 2
