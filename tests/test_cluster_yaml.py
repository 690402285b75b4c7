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
