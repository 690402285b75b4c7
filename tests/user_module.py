"""A Python module a user writes (reward functions, loss controls), put on sys.path for a test
module's fixtures: what `fn: module:function` settings import."""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def on_path(tmp_path_factory, name: str, source: str) -> Iterator[str]:
    """Write `source` (dedented) as module `name` in a fresh directory on sys.path while open;
    yields the module's name."""
    path = tmp_path_factory.mktemp(name)
    (path / f"{name}.py").write_text(textwrap.dedent(source))
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(path))
        yield name
