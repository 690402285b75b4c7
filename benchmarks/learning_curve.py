"""Cold start of the default job to >= 80% held-out greedy accuracy on 2-digit addition.

Runs `coevo run` (the default recipe, `pipelines/grpo_addition.yaml`) as a subprocess with a fresh,
empty warm-up cache, so every repeat pays for Ray start-up, the SFT warm-up and GRPO. While it runs,
the proportional set size (PSS) of the subprocess and all its descendants (the embedded Ray's
gcs_server, raylet, dashboard/agent processes and the actor workers) is sampled every ~0.2 s; the
peak of the sum is reported, with a breakdown by process name. Reading a torch process's PSS costs
the kernel ~5-10 ms of page-table walking, so by default a process's PSS is re-read only when its
RSS moved by > 2 MiB or its last read is > 2 s old (PSS in between = last PSS + RSS change): about
5% of one core instead of ~20%. `--exact-pss` reads every process at every sample.

    python benchmarks/learning_curve.py                       # one repeat
    python benchmarks/learning_curve.py --repeats 3
    python benchmarks/learning_curve.py --repeats 3 -- train.max_steps=100 rollout.samples_per_prompt=4

PSS splits each shared page among the processes that map it, so the sum over the run's processes
counts shared libraries (libtorch, ...) once; the pages are also shared with any other process on the
machine mapping the same files (another Ray run, a test), which lowers this run's PSS a little. Peak
USS (private pages only) and RSS (shared pages counted in every process) are recorded as bounds.

Prints a markdown table (one row per repeat, then min/median/max) and writes the raw numbers,
the per-step learning curve and machine info to benchmarks/results/raw/learning_curve_<label>.json, and
the table to its section of the summary benchmarks/results/learning_curve.md.
Timings share the machine with whatever else runs on it: each repeat records the load average and
how much of the machine's CPU time went to other processes while it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from summary import raw_path, write as write_summary  # noqa: E402

TARGET = 0.8
GIB = 1024 ** 3


# --------------------------------------------------------------------------- process-tree memory

def process_label(proc: psutil.Process) -> str:
    """A stable, human name for a process of the run: the driver, a Ray daemon, or a Ray worker by
    actor class (`ray::LearnerActor.sft_steps` -> `ray::LearnerActor`)."""
    try:
        cmdline = proc.cmdline()
    except (psutil.Error, OSError):
        return "?"
    if not cmdline:  # kernel thread or exiting process
        try:
            return proc.name()
        except (psutil.Error, OSError):
            return "?"
    head = cmdline[0]
    if head.startswith("ray::"):  # Ray workers rename themselves (setproctitle)
        return head.split()[0].split(".")[0]
    base = os.path.basename(head)
    if base.startswith("python"):
        script = next((a for a in cmdline[1:] if not a.startswith("-")), "")
        if script.endswith("/coevo") or script == "coevo":
            return "coevo (driver)"
        parts = Path(script).parts
        if "dashboard" in parts:  # dashboard/dashboard.py, dashboard/agent.py, runtime_env/agent/main.py
            tail = "/".join(parts[parts.index("dashboard"):])
            return f"ray {tail}"
        if "runtime_env" in parts:
            return "ray runtime_env/agent"
        if script.endswith(("default_worker.py", "setup_worker.py")):
            return "ray worker (starting)"
        return f"python {os.path.basename(script)}" if script else base
    if base.endswith("coevo"):
        return "coevo (driver)"
    return base


PLACEHOLDER_LABELS = ("?", "ray worker (starting)", "ray::IDLE", "bash", "sh")


class TreeSampler(threading.Thread):
    """Every `interval` s: PSS of the root process and every descendant. Keeps each sample's PSS per
    process, so peaks per process name are computed at the end with each process's final name (a Ray
    worker loads torch before it renames itself after its actor). Processes once seen are kept while
    they live, so a daemon re-parented to init (or outliving the driver) still counts."""

    def __init__(self, root_pid: int, interval: float = 0.2, exact: bool = False,
                 refresh_mib: float = 2.0, max_age_s: float = 2.0):
        super().__init__(daemon=True)
        self.root = psutil.Process(root_pid)
        self.interval = interval
        # Reading PSS (/proc/PID/smaps_rollup) makes the kernel walk the process's page tables:
        # ~5-10 ms of CPU for each torch worker here, i.e. ~20% of a core at 5 Hz on a 2-core box.
        # Unless `exact`, a process's PSS is re-read only when its RSS (cheap: /proc/PID/statm) has
        # moved by more than refresh_mib since the last read, or that read is older than max_age_s;
        # in between, PSS = last PSS + the RSS change (new pages counted as private).
        self.exact, self.refresh, self.max_age_s = exact, refresh_mib * 2 ** 20, max_age_s
        self.last: dict[int, tuple[float, int, int, int]] = {}  # pid -> (t, rss, pss, uss) of the last read
        self.reads = self.estimates = 0
        self.discover_every_s, self.discovered_at = max(interval, 0.5), float("-inf")
        self.stop_event = threading.Event()
        self.procs: dict[int, psutil.Process] = {}
        self.labels: dict[int, str] = {}
        self.series: list[tuple[float, dict[int, int]]] = []  # (t, {pid: PSS bytes})
        self.uss_rss: list[tuple[int, int]] = []  # per sample: (sum of USS, sum of RSS) bytes
        self.cpu_s: dict[int, float] = {}  # last seen user+system CPU seconds per process
        self.sample_wall_s = 0.0
        self.sampler_cpu_s = 0.0  # this thread's own CPU time (mostly the kernel walking page tables)
        self.errors = 0
        self.t0 = time.monotonic()

    def _discover(self) -> None:
        found = [self.root]
        try:
            found += self.root.children(recursive=True)
        except psutil.Error:
            pass
        for p in found:
            if not p.is_running():
                continue
            known = self.procs.get(p.pid)
            if known is None or known.create_time() != p.create_time():  # new, or the pid was reused
                self.procs[p.pid] = p
                self.labels[p.pid] = process_label(p)
                self.last.pop(p.pid, None)
                continue
            # Re-read the name: a Ray worker may start as `bash`/`default_worker.py`, exec, turn into
            # ray::IDLE and then into its actor; keep the most specific name seen.
            label, old = process_label(p), self.labels[p.pid]
            if label != "?" and (label not in PLACEHOLDER_LABELS or old in PLACEHOLDER_LABELS
                                 or not old.startswith("ray::")):
                self.labels[p.pid] = label

    def sample(self) -> None:
        start = time.monotonic()
        if start - self.discovered_at >= self.discover_every_s:  # walks all of /proc: not every tick
            self._discover()
            self.discovered_at = start
        row, uss, rss = {}, 0, 0
        for pid, p in list(self.procs.items()):
            try:
                with p.oneshot():
                    cpu = p.cpu_times()
                    p_rss = p.memory_info().rss
                    last = self.last.get(pid)
                    if (self.exact or last is None or abs(p_rss - last[1]) > self.refresh
                            or start - last[0] > self.max_age_s):
                        mem = p.memory_full_info()
                        last = self.last[pid] = (start, mem.rss, mem.pss, mem.uss)
                        p_rss, p_pss, p_uss = mem.rss, mem.pss, mem.uss
                        self.reads += 1
                    else:
                        p_pss, p_uss = last[2] + p_rss - last[1], last[3] + p_rss - last[1]
                        self.estimates += 1
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
            except (psutil.AccessDenied, OSError):
                self.errors += 1
                continue
            self.cpu_s[pid] = cpu.user + cpu.system
            row[pid] = p_pss
            uss, rss = uss + p_uss, rss + p_rss
        self.series.append((round(start - self.t0, 3), row))
        self.uss_rss.append((uss, rss))
        self.sample_wall_s += time.monotonic() - start

    def alive(self) -> list[psutil.Process]:
        out = []
        for p in self.procs.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.Error:
                pass
        return out

    def run(self) -> None:
        cpu0 = time.thread_time()
        while not self.stop_event.is_set():
            self.sample()
            self.stop_event.wait(max(0.0, self.interval - (time.monotonic() - self.t0) % self.interval))
        self.sampler_cpu_s = time.thread_time() - cpu0

    def report(self) -> dict:
        """Peak of the summed PSS, its breakdown, and per-label / per-process peaks (bytes)."""
        totals = [sum(row.values()) for _, row in self.series]
        i = max(range(len(totals)), key=totals.__getitem__) if totals else None
        by_label_peak: dict[str, int] = {}
        by_pid_peak: dict[int, int] = {}
        for _, row in self.series:
            by_label: dict[str, int] = {}
            for pid, pss in row.items():
                by_label[self.labels[pid]] = by_label.get(self.labels[pid], 0) + pss
                by_pid_peak[pid] = max(by_pid_peak.get(pid, 0), pss)
            for label, pss in by_label.items():
                by_label_peak[label] = max(by_label_peak.get(label, 0), pss)
        at_peak: dict[str, int] = {}
        for pid, pss in (self.series[i][1].items() if i is not None else ()):
            at_peak[self.labels[pid]] = at_peak.get(self.labels[pid], 0) + pss
        return {"peak": totals[i] if totals else 0, "peak_at_s": self.series[i][0] if totals else None,
                "peak_uss": max((u for u, _ in self.uss_rss), default=0),
                "peak_rss": max((r for _, r in self.uss_rss), default=0),
                "at_peak": at_peak, "by_label": by_label_peak, "by_pid": by_pid_peak,
                "peak_processes": max((len(r) for _, r in self.series), default=0),
                "timeline": [(t, sum(r.values()), len(r)) for t, r in self.series]}


# --------------------------------------------------------------------------- one repeat

def wait_until_quiet(max_wait_s: float, busy_pct: float) -> dict:
    """Wait (at most max_wait_s) until the machine's CPU use over a 5 s window is below busy_pct."""
    start, busy = time.monotonic(), psutil.cpu_percent(interval=5)
    while busy >= busy_pct and time.monotonic() - start < max_wait_s:
        busy = psutil.cpu_percent(interval=5)
    return {"waited_s": round(time.monotonic() - start, 1), "cpu_busy_pct_at_start": busy}


def run_once(index: int, overrides: list[str], interval: float, keep: Path | None, timeout_s: float,
             exact_pss: bool = False, recipe: str | None = None) -> dict:
    """`recipe`: a recipe name or YAML file (None: the default job)."""
    work = Path(tempfile.mkdtemp(prefix="coevo-lc-"))
    run_dir, cache_dir, log_path = work / "run", work / "warmup-cache", work / "coevo.log"
    cache_dir.mkdir()
    cmd = [shutil.which("coevo") or "coevo", "run", *([recipe] if recipe else []), "--output-dir", str(run_dir),
           f"warmup.cache_dir={cache_dir}", *overrides]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0", "TERM": "dumb"}
    load_before = os.getloadavg()
    sys_cpu0 = psutil.cpu_times()
    print(f"[{index}] {' '.join(cmd)}", file=sys.stderr, flush=True)
    with log_path.open("w") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        sampler = TreeSampler(proc.pid, interval, exact=exact_pss)
        sampler.start()
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:  # let the driver shut Ray down, then end what is left of the tree
            print(f"[{index}] timed out after {timeout_s:.0f}s; interrupting", file=sys.stderr)
            proc.send_signal(signal.SIGINT)
            try:
                rc = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
            time.sleep(1)
            for p in sampler.alive():
                try:
                    p.kill()
                except psutil.Error:
                    pass
        wall_s = time.perf_counter() - t0
    # Ray daemons should be gone with the driver; give them a moment, then note any that linger.
    deadline = time.monotonic() + 10
    while sampler.alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    sampler.stop_event.set()
    sampler.join()
    leftovers = [f"{p.pid} {sampler.labels.get(p.pid, '?')}" for p in sampler.alive()]
    sys_cpu1 = psutil.cpu_times()
    busy = lambda c: c.user + c.nice + c.system + c.irq + c.softirq + getattr(c, "steal", 0.0)  # noqa: E731
    machine_cpu_s = busy(sys_cpu1) - busy(sys_cpu0)
    tree_cpu_s = sum(sampler.cpu_s.values())
    cpu_by_label: dict[str, float] = {}
    for pid, cpu in sampler.cpu_s.items():
        cpu_by_label[sampler.labels[pid]] = cpu_by_label.get(sampler.labels[pid], 0.0) + cpu

    rep = sampler.report()
    result: dict = {"repeat": index, "returncode": rc, "command": cmd, "wall_s": wall_s,
                    "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
                    "cpu_s_run_tree": tree_cpu_s, "cpu_s_machine": machine_cpu_s,
                    "cpu_s_by_label": dict(sorted(cpu_by_label.items(), key=lambda kv: -kv[1])),
                    "cpu_s_other_processes": max(0.0, machine_cpu_s - tree_cpu_s - sampler.sampler_cpu_s),
                    "peak_pss_gib": rep["peak"] / GIB, "peak_pss_at_s": rep["peak_at_s"],
                    "peak_uss_gib": rep["peak_uss"] / GIB, "peak_rss_gib": rep["peak_rss"] / GIB,
                    "peak_pss_breakdown_gib": _gib(rep["at_peak"]),
                    "peak_pss_by_label_gib": _gib(rep["by_label"]),
                    "peak_pss_by_process": sorted(
                        ({"pid": pid, "label": sampler.labels[pid], "peak_pss_gib": v / GIB}
                         for pid, v in rep["by_pid"].items()), key=lambda r: -r["peak_pss_gib"]),
                    "peak_processes": rep["peak_processes"], "pss_samples": len(sampler.series),
                    "pss_sample_interval_s": interval,
                    "pss_sampler_cpu_s": sampler.sampler_cpu_s,
                    "pss_mode": "exact" if exact_pss else
                                f"adaptive (re-read on RSS change > {sampler.refresh / 2**20:g} MiB or "
                                f"age > {sampler.max_age_s:g} s)",
                    "pss_reads": sampler.reads, "pss_estimates": sampler.estimates,
                    "pss_sampler_wall_share": sampler.sample_wall_s / max(wall_s, 1e-9),
                    "pss_sample_errors": sampler.errors, "processes_left_after_exit": leftovers,
                    "pss_timeline_gib": [(t, round(b / GIB, 4), n) for t, b, n in rep["timeline"][::5]]}
    summary_path, metrics_path = run_dir / "summary.json", run_dir / "metrics.jsonl"
    if rc != 0 or not summary_path.is_file():
        result["error"] = f"coevo exited {rc}"
        result["log_tail"] = log_path.read_text(errors="replace")[-4000:]
        print(f"[{index}] FAILED (rc={rc}); log tail:\n{result['log_tail']}", file=sys.stderr)
    else:
        result.update(_read_run(summary_path, metrics_path))
    if keep:
        dest = keep / f"repeat_{index}"
        shutil.copytree(run_dir, dest, dirs_exist_ok=True) if run_dir.exists() else None
        shutil.copy(log_path, keep / f"repeat_{index}.log")
    shutil.rmtree(work, ignore_errors=True)
    return result


def _gib(d: dict) -> dict:
    return {k: v / GIB for k, v in sorted(d.items(), key=lambda kv: -kv[1])}


def _read_run(summary_path: Path, metrics_path: Path) -> dict:
    s = json.loads(summary_path.read_text())
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    samples = sum(r.get("samples/count", 0) for r in rows)
    step_s = sum(r.get("time/step_s", 0.0) for r in rows)
    eval_s = sum(r.get("time/eval_s", 0.0) for r in rows)
    curve = [{"step": r["step"], "time_s": r.get("time_s"), "accuracy": r["eval/accuracy"],
              "reward_mean": r.get("reward/mean")} for r in rows if r.get("eval/accuracy") is not None]
    first_hit = next((c for c in curve if c["accuracy"] >= TARGET), None)
    acc = s.get("eval/accuracy")
    stage_means = {}
    for key in sorted({k for r in rows for k in r if k.startswith("time/") and k.endswith("_s")}):
        vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        stage_means[key] = {"sum": sum(vals), "mean": sum(vals) / len(vals), "n": len(vals)}
    return {"total_s": s.get("time/total_s"), "ray_start_s": s.get("time/ray_start_s"),
            "warmup_s": s.get("time/warmup_s"), "grpo_s": s.get("time/train_s"),
            "grpo_step_s_sum": step_s, "grpo_eval_s_sum": eval_s,
            "grpo_samples": samples, "grpo_samples_per_s": samples / step_s if step_s else None,
            "steps": s.get("steps"), "warmup_steps": s.get("warmup/steps"),
            "warmup_accuracy": s.get("warmup/accuracy"), "warm_start_accuracy": s.get("warm_start/accuracy"),
            "final_accuracy": acc,
            "reached_target": acc is not None and acc >= TARGET,
            "first_step_at_target": first_hit and first_hit["step"],
            "grpo_stage_time_s": stage_means, "eval_curve": curve}


# --------------------------------------------------------------------------- report

COLUMNS = [  # (header, key, format)
    ("wall s", "wall_s", "{:.1f}"), ("Ray start s", "ray_start_s", "{:.1f}"),
    ("warm-up s", "warmup_s", "{:.1f}"), ("GRPO s", "grpo_s", "{:.1f}"),
    ("other s", "other_s", "{:.1f}"), ("GRPO samples/s", "grpo_samples_per_s", "{:.0f}"),
    ("warm-up steps", "warmup_steps", "{}"), ("GRPO steps", "steps", "{}"),
    ("final acc", "final_accuracy", "{:.3f}"), (">= 0.8", "reached_target", "{}"),
    ("peak PSS GiB", "peak_pss_gib", "{:.2f}"),
]


def table(results: list[dict]) -> str:
    for r in results:  # driver import/set-up, actor creation, checkpoint, plots, Ray shutdown
        parts = [r.get(k) for k in ("ray_start_s", "warmup_s", "grpo_s")]
        r["other_s"] = r["wall_s"] - sum(parts) if all(p is not None for p in parts) else None
    fmt = lambda f, v: "-" if v is None else ("yes" if v is True else "no" if v is False else f.format(v))  # noqa: E731
    lines = ["| run | " + " | ".join(h for h, _, _ in COLUMNS) + " |",
             "|---|" + "---:|" * len(COLUMNS)]
    for r in results:
        lines.append(f"| {r['repeat']} | " + " | ".join(fmt(f, r.get(k)) for _, k, f in COLUMNS) + " |")
    if len(results) > 1:
        for name, fn in (("min", min), ("median", statistics.median), ("max", max)):
            cells = []
            for _, k, f in COLUMNS:
                vals = [r[k] for r in results if isinstance(r.get(k), (int, float)) and not isinstance(r[k], bool)]
                if k == "reached_target":
                    cells.append(f"{sum(bool(r.get(k)) for r in results)}/{len(results)}" if name == "median" else "")
                else:
                    cells.append(fmt(f, fn(vals)) if vals else "-")
            lines.append(f"| **{name}** | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine_info(modules=("torch", "ray", "transformers", "pyarrow", "psutil")) -> dict:
    """The machine and the versions of `modules`, recorded with every benchmark result."""
    versions = {}
    for mod in modules:
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            versions[mod] = None
    cpu_model = platform.processor()
    try:
        cpu_model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"hostname": platform.node(), "platform": platform.platform(), "cpu_model": cpu_model,
            "cpu_count_logical": os.cpu_count(), "cpu_count_physical": psutil.cpu_count(logical=False),
            "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "ram_gib": round(psutil.virtual_memory().total / GIB, 1), "python": platform.python_version(),
            "niceness": os.nice(0),  # under `nice`, other processes' load weighs far more on the timings
            **versions}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Anything after the options (or after --) is passed to `coevo run` "
                                       "as key=value overrides.")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--interval", type=float, default=0.2, help="PSS sampling period, seconds")
    p.add_argument("--exact-pss", action="store_true",
                   help="read every process's PSS at every sample (costs ~20%% of a core here)")
    p.add_argument("--label", help="results file suffix (default: <cpus>cpu-<ram>gib)")
    p.add_argument("--out", type=Path, help="results JSON path (default: benchmarks/results/raw/learning_curve_<label>.json)")
    p.add_argument("--keep", type=Path, help="copy each run directory and log here")
    p.add_argument("--timeout", type=float, default=1800, help="per-repeat limit, seconds")
    p.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                   help="before each repeat wait up to S seconds for the machine's CPU use to drop below "
                        "--quiet-pct (shared machines)")
    p.add_argument("--quiet-pct", type=float, default=30)
    p.add_argument("overrides", nargs="*", help="coevo run overrides, e.g. train.max_steps=100")
    args = p.parse_args(argv)

    info = machine_info()
    label = args.label or f"{info['cpu_count_logical']}cpu-{round(info['ram_gib'])}gib"
    out = args.out or raw_path(f"learning_curve_{label}.json")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    results = []
    for i in range(1, args.repeats + 1):
        quiet = wait_until_quiet(args.wait_quiet, args.quiet_pct) if args.wait_quiet else {}
        r = run_once(i, args.overrides, args.interval, args.keep, args.timeout, args.exact_pss)
        r.update(quiet)
        results.append(r)
        print(f"[{i}] wall {r['wall_s']:.1f}s  acc {r.get('final_accuracy')}  steps {r.get('steps')}  "
              f"peak PSS {r['peak_pss_gib']:.2f} GiB", file=sys.stderr, flush=True)

    md = table(results)
    print(md)
    ok = [r for r in results if "error" not in r]
    labels = sorted({k for r in ok for k in r["peak_pss_by_label_gib"]},
                    key=lambda k: -max(r["peak_pss_by_label_gib"].get(k, 0) for r in ok))
    for key, name in (("peak_uss_gib", "USS (private only)"), ("peak_rss_gib", "RSS (shared pages counted in full)")):
        vals = [r[key] for r in results]
        print(f"peak {name}: {min(vals):.2f} / {statistics.median(vals):.2f} / {max(vals):.2f} GiB (min/median/max)")
    print("\npeak PSS by process (GiB, max over repeats; each label's own peak, so they can sum past the total):")
    for k in labels:
        print(f"  {k:32s} {max(r['peak_pss_by_label_gib'].get(k, 0) for r in ok):.3f}")
    report = {"benchmark": "learning_curve", "target_accuracy": TARGET,
              "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "overrides": args.overrides, "machine": info, "table_markdown": md,
              "peak_pss_by_label_gib_max": {k: max(r["peak_pss_by_label_gib"].get(k, 0) for r in ok) for k in labels},
              "runs": results}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    summary = write_summary("learning_curve", out.stem, md, raw=[out], protocol=(
        f"cold `coevo run` to held-out accuracy {TARGET}, {args.repeats} repeat(s); overrides {args.overrides or 'none'}"))
    print(f"\nwrote {out} and {summary}", file=sys.stderr)
    return 0 if ok and all(r.get("reached_target") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
