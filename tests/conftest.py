"""Test-wide settings. Ray reads these at import, so they are set before anything imports ray."""

import os

# Embedded test clusters bind to loopback only, never to the machine's address.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# Tests never fetch from a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
