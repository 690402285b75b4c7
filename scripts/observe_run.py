"""Watch a running coevo job the way an operator does, on a private one-node Ray cluster (loopback):
`coevo status`, a real Prometheus (Debian's `prometheus`) scraping Ray's metrics export port through
Ray's service-discovery file, every query of dashboards/coevo_grafana.json run against it, and a
headless Chromium screenshot of the Ray dashboard's actors page.

    python scripts/observe_run.py --out /tmp/observe.json [--screenshot docs/images/ray_actors.png]

Too slow for the test suite (~2 min): tests/test_status.py runs it with --no-prometheus.
One generator replica is killed by its name mid-run, so the failure and retry panels have data.
Exit status 1 if a query other than the scale-event panel's returns no series (no pool scales in
this run). The cluster runs without token auth (a browser cannot send the token header); it is
bound to 127.0.0.1 and stopped by PID at the end, as are the run and Prometheus.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DASHBOARD = REPO / "dashboards" / "coevo_grafana.json"
# panels a run of the default recipe on a fixed pool has nothing for
NO_DATA_EXPECTED = ("ray_coevo_scale_events_total",)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def wait_for(what: str, ok, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if ok():
                return
        except OSError:
            pass
        if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"{what} did not happen within {timeout:.0f}s\n{tail}")
        time.sleep(0.5)


def stop(proc: subprocess.Popen, sig=signal.SIGTERM, wait: float = 60) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def panel_queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target, with Grafana's variables given concrete values."""
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "1m").replace('"$run"', '".*"')
            out.append((panel["title"], expr))
    return out


def generator_failures(status_text: str) -> int:
    """The generator row's failures column in `coevo status`'s table (0 where there is no such row)."""
    for line in status_text.splitlines():
        cols = line.split()
        if len(cols) > 6 and cols[0] == "generator" and cols[6].isdigit():
            return int(cols[6])
    return 0


def kill_a_generator(address: str) -> str:
    """Kill replica 0 of the run's generator by its name (Ray restarts it): the operator's view of a
    failure. Returns the name."""
    import ray

    from orchestrator import status

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        rec = status.read_runs()[0]
        name = f"{rec['run']}/generator/0"
        ray.kill(ray.get_actor(name, namespace=rec["namespace"]), no_restart=False)
        return name
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file for the results")
    parser.add_argument("--screenshot", help="PNG path for the Ray dashboard's actors page (Chromium)")
    parser.add_argument("--no-prometheus", action="store_true", help="coevo status only")
    parser.add_argument("--steps", type=int, default=400, help="train.max_steps of the watched run")
    args = parser.parse_args(argv)

    temp = Path(tempfile.mkdtemp(prefix="coevo-obs-", dir="/tmp"))  # short: Unix socket paths are limited
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "PATH": os.pathsep.join([str(BIN), env.get("PATH", "")])})
    os.environ.update({k: v for k, v in env.items() if k.startswith("RAY_")})  # this process's own driver
    gcs, dash, metrics_port, prom_port = free_port(), free_port(), free_port(), free_port()
    address = f"127.0.0.1:{gcs}"
    results: dict = {"address": address, "dashboard": f"http://127.0.0.1:{dash}"}
    procs: list[subprocess.Popen] = []

    def spawn(cmd, log_name, **kw):
        log = open(temp / log_name, "w")
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **kw)
        procs.append(proc)
        return proc

    try:
        head = spawn([str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
                      "--dashboard-host", "127.0.0.1", "--include-dashboard", "true", "--port", str(gcs),
                      "--dashboard-port", str(dash), "--dashboard-agent-listen-port", str(free_port()),
                      "--ray-client-server-port", str(free_port()), "--metrics-export-port", str(metrics_port),
                      "--num-cpus", "2", "--temp-dir", str(temp), "--disable-usage-stats"], "ray_start.log")
        wait_for("the Ray dashboard", lambda: get(f"http://127.0.0.1:{dash}/api/version")[0] == 200, 120, head,
                 temp / "ray_start.log")
        run_dir = temp / "grpo-observe"
        run = spawn([str(BIN / "coevo"), "run", "--address", address, "--output-dir", str(run_dir),
                     "warmup.enabled=false", "data.arithmetic.digits=1", "data.eval_size=32",
                     "rollout.prompts_per_step=8", "rollout.samples_per_prompt=4", "rollout.max_new_tokens=3",
                     "train.threads=1", "train.eval_every=2", "train.checkpoint_every=0",
                     f"train.max_steps={args.steps}"], "coevo_run.log", cwd=str(REPO))
        metrics = run_dir / "metrics.jsonl"
        wait_for("3 train steps", lambda: len(metrics.read_text().splitlines()) >= 3, 300, run, temp / "coevo_run.log")

        results["killed"] = kill_a_generator(address)
        wait_for("the killed generator's failure in metrics.jsonl",
                 lambda: json.loads(metrics.read_text().splitlines()[-1]).get("role/generator/failures", 0) >= 1,
                 120, run, temp / "coevo_run.log")
        # the status record is published at most once a second (orchestrator.metrics.EXPORT_EVERY_S): the
        # row that counted the failure may not be in it yet, so ask again until it is (or a minute passed)
        deadline = time.monotonic() + 60
        while True:
            status = subprocess.run([str(BIN / "coevo"), "status", "--address", address], env=env,
                                    capture_output=True, text=True, timeout=120)
            if generator_failures(status.stdout) >= 1 or time.monotonic() > deadline:
                break
            time.sleep(1)
        results["status"] = {"rc": status.returncode, "stdout": status.stdout, "stderr": status.stderr[-2000:]}
        print(status.stdout)
        # the actors Ray lists, by name
        listed = subprocess.run([str(BIN / "ray"), "list", "actors", "--address", f"http://127.0.0.1:{dash}",
                                 "--format", "json", "--limit", "1000"], env=env, capture_output=True, text=True,
                                timeout=120)
        results["ray_list_actors"] = sorted(a.get("name") or "" for a in json.loads(listed.stdout or "[]")
                                            if a.get("state") == "ALIVE")
        if args.screenshot:
            shot = Path(args.screenshot).resolve()
            shot.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            f"--user-data-dir={temp / 'chromium'}", "--window-size=1600,1000",
                            "--virtual-time-budget=15000", f"--screenshot={shot}",
                            f"http://127.0.0.1:{dash}/#/actors"], env=env, capture_output=True, timeout=180)
            results["screenshot"] = str(shot) if shot.is_file() else None
        failed = []
        if not args.no_prometheus:
            sd = temp / "prom_metrics_service_discovery.json"
            wait_for("Ray's service-discovery file", sd.is_file, 60)
            (temp / "prometheus.yml").write_text(
                "global:\n  scrape_interval: 2s\n  evaluation_interval: 2s\n"
                "scrape_configs:\n  - job_name: ray\n    file_sd_configs:\n"
                f"      - files: ['{sd}']\n        refresh_interval: 5s\n")
            spawn(["prometheus", f"--config.file={temp / 'prometheus.yml'}", f"--storage.tsdb.path={temp / 'prom'}",
                   f"--web.listen-address=127.0.0.1:{prom_port}"], "prometheus.log")
            api = f"http://127.0.0.1:{prom_port}/api/v1/query?query="
            wait_for("Prometheus scraping coevo", lambda: json.loads(get(api + "ray_coevo_step")[1])["data"]["result"],
                     120, None, temp / "prometheus.log")
            time.sleep(30)  # rate() over 1m needs two scrapes of a changed counter/histogram
            results["queries"] = []
            for title, expr in panel_queries(json.loads(DASHBOARD.read_text())):
                body = json.loads(get(api + urllib.parse.quote(expr))[1])
                series = body["data"]["result"] if body.get("status") == "success" else None
                results["queries"].append({"panel": title, "expr": expr, "series": None if series is None else len(series),
                                           "sample": series[:3] if series else body.get("error")})
                expected = not any(m in expr for m in NO_DATA_EXPECTED)
                if expected and not series:
                    failed.append(title)
                print(f"{'ok ' if series else 'NO DATA' if not expected else 'FAIL'}  {len(series or [])} series  {title}: {expr}")
        results["failed_panels"] = failed
        stop(run, signal.SIGTERM, 120)  # it checkpoints and ends
        results["run_exit"] = run.returncode
        after = subprocess.run([str(BIN / "coevo"), "status", "--address", address], env=env, capture_output=True,
                               text=True, timeout=120)
        results["status_after"] = {"rc": after.returncode, "stdout": after.stdout, "stderr": after.stderr[-2000:]}
        return 1 if failed or status.returncode != 0 else 0
    finally:
        for proc in reversed(procs):
            stop(proc, signal.SIGTERM, 60)
        Path(args.out).write_text(json.dumps(results, indent=1, default=str))
        import shutil
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
