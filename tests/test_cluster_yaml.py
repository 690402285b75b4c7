"""cluster.yaml is a valid Ray autoscaler config (checked offline with Ray's own schema).

No cluster is started and nothing contacts AWS: `prepare_config` only merges the provider's
bundled defaults.yaml, and `validate_config` checks the result against Ray's ray-schema.json,
which forbids unknown keys — the same two steps `ray up` runs before it talks to the cloud.
"""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

CLUSTER_YAML = Path(__file__).resolve().parents[1] / "cluster.yaml"


@pytest.fixture(scope="module")
def raw_config() -> dict:
    with open(CLUSTER_YAML) as f:
        config = yaml.safe_load(f)
    assert isinstance(config, dict)
    return config


def _validated(config: dict) -> dict:
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def _all_setup_commands(config: dict) -> list[str]:
    commands = []
    for key in ("setup_commands", "head_setup_commands", "worker_setup_commands"):
        commands += config.get(key) or []
    for node_type in config["available_node_types"].values():
        commands += node_type.get("worker_setup_commands") or []
    return commands


def test_cluster_yaml_is_valid_ray_config(raw_config: dict) -> None:
    config = _validated(raw_config)

    assert config["cluster_name"] == "coevo"
    assert config["provider"]["type"] == "aws"

    node_types = config["available_node_types"]
    head_type = config["head_node_type"]
    assert head_type in node_types
    # The driver/orchestrator runs on the head, so it advertises real CPUs.
    assert node_types[head_type]["resources"].get("CPU", 0) > 0

    workers = {name: nt for name, nt in node_types.items() if name != head_type}
    gpu_workers = [n for n, nt in workers.items() if nt["resources"].get("GPU", 0) >= 1]
    cpu_workers = [
        n
        for n, nt in workers.items()
        if nt["resources"].get("CPU", 0) > 0 and nt["resources"].get("GPU", 0) == 0
    ]
    assert gpu_workers, "need a GPU worker type for generators/learners"
    assert cpu_workers, "need a CPU-only worker type for verifiers"
    for name in gpu_workers + cpu_workers:
        assert workers[name]["min_workers"] == 0
        assert workers[name]["max_workers"] >= 1
    assert sum(workers[n]["max_workers"] for n in workers) <= config["max_workers"]

    # Every node gets the project and installs it.
    assert config["file_mounts"].get("~/coevo") == "."
    installs = [c for c in _all_setup_commands(config) if "pip install" in c and "coevo" in c]
    assert installs, "no setup command installs coevo"
    assert any("coevo" in c and "pip install" in c for c in config["head_setup_commands"])
    for name in gpu_workers + cpu_workers:
        node_cmds = workers[name].get("worker_setup_commands", config["worker_setup_commands"])
        assert any("pip install" in c and "coevo" in c for c in node_cmds), name

    head_start = " ".join(config["head_start_ray_commands"])
    assert "ray start --head --port=6379" in head_start
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in head_start
    assert "--dashboard-host=0.0.0.0" in head_start
    assert "ray start --address=$RAY_HEAD_IP:6379" in " ".join(config["worker_start_ray_commands"])


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda c: c.__setitem__("max_wrokers", c.pop("max_workers")), id="top-level"),
        pytest.param(
            lambda c: c["available_node_types"][c["head_node_type"]].__setitem__("min_worker", 0),
            id="node-type",
        ),
        pytest.param(
            lambda c: c["available_node_types"][c["head_node_type"]].pop("resources"),
            id="missing-resources",
        ),
    ],
)
def test_validation_rejects_broken_config(raw_config: dict, mutate) -> None:
    broken = copy.deepcopy(raw_config)
    mutate(broken)
    with pytest.raises(jsonschema.ValidationError):
        _validated(broken)


def _node_setup(config: dict, name: str) -> list[str]:
    node = config["available_node_types"][name]
    if name == config["head_node_type"]:
        return config["setup_commands"] + config["head_setup_commands"]
    return config["setup_commands"] + node.get("worker_setup_commands", config["worker_setup_commands"])


def _pins(commands: list[str], package: str) -> set[str]:
    import re

    return {m for c in commands if "pip install" in c for m in re.findall(rf"\b{package}==([\w.+]+)", c)}


def test_every_node_type_pins_the_same_versions(raw_config: dict) -> None:
    for package in ("torch", "transformers"):
        pins = {name: _pins(_node_setup(raw_config, name), package) for name in raw_config["available_node_types"]}
        assert all(len(p) == 1 for p in pins.values()), f"{package} unpinned somewhere: {pins}"
        assert len(set.union(*pins.values())) == 1, f"{package} pinned differently: {pins}"


def test_verifiers_are_placed_on_cpu_workers_by_a_custom_resource(raw_config: dict) -> None:
    """Placement comes from resource requests: `cpu_worker` is declared only on the CPU worker type,
    and `roles.verifier.resources={cpu_worker: 1}` is a valid config that asks for it."""
    from orchestrator.config import load_config
    from orchestrator.roles import resolve
    from pipelines.grpo import GRPO
    from orchestrator.recipes import Sources

    declared = {name for name, nt in raw_config["available_node_types"].items() if nt["resources"].get("cpu_worker")}
    assert declared == {"worker.cpu"}
    assert raw_config["available_node_types"]["worker.cpu"]["resources"].get("GPU", 0) == 0
    assert "'roles.verifier.resources={cpu_worker: 1}'" in CLUSTER_YAML.read_text()
    config = load_config(None, ["roles.verifier.resources={cpu_worker: 1}"])
    spec = resolve(GRPO.roles(config, Sources())["verifier"], config.roles.get("verifier"), config)
    assert spec.resources == {"cpu_worker": 1.0}


def test_extras_referenced_in_cluster_yaml_exist() -> None:
    import re
    import tomllib

    extras = tomllib.loads((CLUSTER_YAML.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name in re.findall(r"coevo\[(\w+)\]", CLUSTER_YAML.read_text()):
        assert name in extras, f"cluster.yaml refers to the [{name}] extra, which pyproject.toml does not define"


def test_a_local_cluster_without_the_custom_resource_is_a_config_error(monkeypatch) -> None:
    """An embedded cluster never grows: a role asking for a resource it lacks is named before any
    actor waits for it forever (cluster_resources stands in for a started cluster's answer)."""
    import ray

    from orchestrator.cluster import check_resources
    from orchestrator.config import ConfigError, load_config
    from orchestrator.recipes import Sources
    from pipelines.grpo import GRPO

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0})
    config = load_config(None, ["roles.verifier.resources={cpu_worker: 1}"])
    with pytest.raises(ConfigError, match=r"1 cpu_worker \(the cluster has 0\).*/ resources"):
        check_resources(config, GRPO.roles(config, Sources()), local=True)
