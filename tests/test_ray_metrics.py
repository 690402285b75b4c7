"""The exported metric names, the shipped Grafana dashboard, actor names and the status table,
without Ray (tests/test_status.py watches a real run)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchestrator import names, status
from orchestrator.ray_metrics import METRICS, scale_event

DASHBOARD = Path(__file__).resolve().parents[1] / "dashboards" / "coevo_grafana.json"
PROMQL_WORDS = {"sum", "by", "rate", "histogram_quantile", "le", "run", "role", "replica", "state", "direction",
                "avg", "max", "min", "on", "or", "and", "vector", "increase", "without", "irate"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers outside label matchers, range
    selectors and strings that are not PromQL functions, keywords or label names."""
    expr = re.sub(r'"[^"]*"', '""', expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr))
    return {w for w in words if w not in PROMQL_WORDS}


def test_metric_names_are_parsed_from_promql() -> None:
    expr = 'histogram_quantile(0.95, sum by (le, run) (rate(ray_coevo_staleness_bucket{run=~"$run"}[$__rate_interval])))'
    assert metric_names(expr) == {"ray_coevo_staleness_bucket"}
    assert metric_names('1 - ray_a{role="x"} / on() ray_b') == {"ray_a", "ray_b"}


def test_every_dashboard_panel_reads_only_metrics_coevo_exports() -> None:
    exported = {n for m in METRICS.values() for n in m.exported()}
    dashboard = json.loads(DASHBOARD.read_text())
    read, panels = set(), 0
    for panel in dashboard["panels"]:
        exprs = [t["expr"] for t in panel["targets"]]
        assert exprs, f"{DASHBOARD.name}: panel {panel['title']!r} has no query"
        for expr in exprs:
            found = metric_names(expr)
            assert found, f"{DASHBOARD.name}: panel {panel['title']!r}: no metric in {expr!r}"
            unknown = found - exported
            assert not unknown, (f"{DASHBOARD.name}: panel {panel['title']!r} reads {sorted(unknown)}, which "
                                 f"orchestrator/ray_metrics.py does not export")
            read |= found
        panels += 1
    # and every metric coevo defines has a panel
    assert not {m.name for m in METRICS.values() if not set(m.exported()) & read}
    assert panels >= 12
    assert dashboard["templating"]["list"][1]["definition"] == "label_values(ray_coevo_step, run)"


def test_exported_names_follow_rays_prometheus_naming() -> None:
    assert METRICS["coevo_failures"].exported() == ["ray_coevo_failures_total"]
    assert METRICS["coevo_staleness"].exported() == ["ray_coevo_staleness_bucket", "ray_coevo_staleness_sum",
                                                     "ray_coevo_staleness_count"]
    assert METRICS["coevo_scale_events"].tags == ("run", "role", "direction")


def test_scale_event_refuses_an_unknown_direction() -> None:
    with pytest.raises(ValueError, match=r"direction 'sideways' is not 'up' or 'down' \(run 'r1', role 'generator'\)"):
        scale_event("r1", "generator", "sideways")


def test_actor_names_are_run_role_index_and_unique_within_a_driver(monkeypatch) -> None:
    import ray

    class Ctx:
        namespace = "ns-test"

    monkeypatch.setattr(ray, "get_runtime_context", lambda: Ctx())
    assert names.actor_name("generator", 0) is None  # outside a run: unnamed
    token = names.RUN.set("grpo-20260101-000000")
    try:
        assert names.actor_name("generator", 0) == "grpo-20260101-000000/generator/0"
        assert names.actor_name("generator", 1) == "grpo-20260101-000000/generator/1"
        # the role built again in this driver (a stage's pool, then the run's): Ray may still hold the old name
        assert names.actor_name("generator", 0) == "grpo-20260101-000000/generator/0.2"
    finally:
        names.RUN.reset(token)


def _record(**over) -> dict:
    rec = {"run": "try1", "run_dir": "/runs/try1", "recipe": "grpo", "job_id": "02000000", "namespace": "ns",
           "state": "running", "updated": 100.0, "step": 7, "max_steps": 50, "staleness_max": 1, "lag_max": 0,
           "samples_per_s": 12.5, "tokens_per_s": 300.0, "reward": 0.25, "accuracy": 0.5, "accuracy_step": 6,
           "roles": {"generator": {"kind": "generator", "live": 2, "min": 1, "max": 4, "versions": [6, 7],
                                   "busy": 0.93, "failures": 1, "retries": 2, "actors_alive": 2}}}
    rec.update(over)
    return rec


def test_status_table_shows_roles_replicas_versions_throughput_and_accuracy() -> None:
    text = status.format_runs([_record()], now=103.0)
    assert "try1  [running, updated 3s ago]  recipe grpo  job 02000000  step 7/50" in text
    assert "12.5 samples/s  300 tokens/s  reward 0.25  accuracy 0.500 (step 6)  staleness max 1" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("generator"))
    assert row.split() == ["generator", "generator", "2/1/4", "2", "6,7", "0.93", "1", "2"]
    assert status.format_runs([]) == "no coevo runs on this cluster"


def _cluster(monkeypatch, records: dict, alive: list[tuple[str, str]]) -> None:
    """A GCS store holding `records` (key -> bytes) and an actor table of `alive` (job, name)."""
    from ray._private import state
    from ray.experimental import internal_kv

    monkeypatch.setattr(internal_kv, "_internal_kv_list", lambda prefix, namespace: [k for k in records if k.startswith(prefix.encode())])
    monkeypatch.setattr(internal_kv, "_internal_kv_get", lambda key, namespace: records.get(key))
    table = {str(i): {"Name": name, "JobID": job, "State": "ALIVE"} for i, (job, name) in enumerate(alive)}
    monkeypatch.setattr(state, "actors", lambda: table)


def test_status_counts_live_actors_and_marks_a_run_whose_actors_are_gone(monkeypatch) -> None:
    live, dead = _record(), _record(run="try2", job_id="03000000", updated=50.0)
    _cluster(monkeypatch, {b"run/02000000/try1": json.dumps(live).encode(), b"run/03000000/try2": json.dumps(dead).encode()},
             [("02000000", "try1/generator/0"), ("02000000", "try1/generator/1.2"), ("03000000", "other/generator/0")])
    runs = status.read_runs()
    assert [(r["run"], r["state"], r["roles"]["generator"]["actors_alive"]) for r in runs] == [
        ("try1", "running", 2), ("try2", "gone", 0)]


def test_status_names_a_record_that_is_not_json(monkeypatch) -> None:
    _cluster(monkeypatch, {b"run/02000000/try1": b"{not json"}, [])
    with pytest.raises(ValueError, match=r"record at GCS key 'run/02000000/try1' \(namespace 'coevo'\) is not JSON"):
        status.read_runs()


def test_coevo_status_names_an_address_where_no_cluster_answers(tmp_path) -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "status", "--address", f"127.0.0.1:{port}"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 3
    assert f"no Ray cluster at --address '127.0.0.1:{port}': cannot connect to 127.0.0.1:{port}" in proc.stderr


def test_coevo_status_given_the_dashboard_address_reads_the_gcs_at_its_host(tmp_path) -> None:
    """`--address http://HOST:8265` (what `ray job submit` takes) is not refused with Ray's RAY_ADDRESS
    advice: it says what it reads instead, the GCS at HOST:6379, and names that when nothing answers."""
    import subprocess
    import sys

    from orchestrator.status_cli import gcs_of_dashboard

    assert gcs_of_dashboard("http://10.0.0.5:8265") == "10.0.0.5:6379"
    assert gcs_of_dashboard("https://head.example:443/") == "head.example:6379"
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "status", "--address", "http://nohost.invalid:8265"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 3 and "RAY_ADDRESS" not in proc.stderr and "Traceback" not in proc.stderr
    assert "http://nohost.invalid:8265 is the dashboard's (job submission) address" in proc.stderr
    assert "no Ray cluster at --address 'nohost.invalid:6379': cannot connect" in proc.stderr
