"""The prompt splits a run trains and evaluates on, and the error every dataset problem raises."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa


class DatasetError(ValueError):
    """A dataset problem; the message names the file, row and column at fault."""


@dataclass
class PromptSet:
    train: pa.Table
    eval: pa.Table
    name: str
