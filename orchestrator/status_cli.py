"""`coevo status [--address ...]`: connect to a cluster and print its coevo runs (orchestrator.status)."""

from __future__ import annotations

import logging
import os
import sys

EXIT_NO_CLUSTER = 3


def status_main(address: str | None) -> int:
    import ray

    from orchestrator import cluster, status

    address = address or os.environ.get("RAY_ADDRESS") or "auto"
    dashboard = None
    if address.startswith(("http://", "https://")):  # the address `ray job submit` takes
        dashboard, address = address, gcs_of_dashboard(address)
        print(f"coevo status: {dashboard} is the dashboard's (job submission) address; reading the cluster "
              f"at its GCS address {address} (the default port: give --address HOST:PORT for another)", file=sys.stderr)
    unreachable = _unreachable(address)
    if unreachable:  # ray.init would retry for minutes
        print(f"error: coevo status: no Ray cluster at --address {address!r}: {unreachable}", file=sys.stderr)
        return EXIT_NO_CLUSTER
    cluster._token_auth_quietly()  # a cluster coevo started uses token auth; the token is the user's
    try:
        # a short-lived driver of its own: it reads the GCS and starts no workers
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False, configure_logging=False)
    except (ConnectionError, ValueError, RuntimeError) as e:
        print(f"error: coevo status: no Ray cluster at {address!r}: {e}", file=sys.stderr)
        return EXIT_NO_CLUSTER
    try:
        if dashboard and cluster.dashboard_url() not in (None, dashboard.rstrip("/")):
            print(f"error: coevo status: the cluster at {address} has its dashboard at {cluster.dashboard_url()}, "
                  f"not {dashboard}: give that cluster's GCS address (--address HOST:PORT)", file=sys.stderr)
            return EXIT_NO_CLUSTER
        print(status.format_runs(status.read_runs()))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        ray.shutdown()
    return 0


def gcs_of_dashboard(url: str, port: int = 6379) -> str:
    """The GCS address of the head whose dashboard is at `url` (Ray's default GCS port)."""
    from urllib.parse import urlparse

    host = urlparse(url).hostname or "127.0.0.1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _unreachable(address: str) -> str | None:
    """Why nothing answers at a `host:port` GCS address (None: it answers, or the address is
    another form, e.g. `auto`, which Ray resolves itself)."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or "/" in address or not port.isdigit():
        return None
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        return f"cannot connect to {host}:{port} ({e.strerror or e}); give the head node's GCS address (host:port)"
    return None
