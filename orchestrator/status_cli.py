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
        print(status.format_runs(status.read_runs()))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        ray.shutdown()
    return 0


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
