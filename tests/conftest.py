"""Test-wide settings and the fixtures the `coevo run` integration tests share.

Ray reads the environment at import, so it is set before anything imports ray. Each integration
run is its own `coevo` process with an embedded cluster on loopback, token auth with a throwaway
token (nothing written to ~/.ray), Ray's session files in a short private temp dir, and a warm-up
cache shared by the session's runs (the first run pays for the SFT warm-up)."""

import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# Embedded test clusters bind to loopback only, never to the machine's address.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# Tests never fetch from a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def ray_env():
    temp = tempfile.mkdtemp(prefix="coevo-", dir="/tmp")  # short: Unix socket paths are limited
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update({
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        "RAY_TMPDIR": temp,
        "RAY_USAGE_STATS_ENABLED": "0",
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "PATH": os.pathsep.join([str(BIN), env.get("PATH", "")]),
    })
    yield env
    shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="session")
def warm_cache(tmp_path_factory) -> Path:
    """One warm-up cache for every integration run of the session."""
    return tmp_path_factory.mktemp("warmup-cache")
