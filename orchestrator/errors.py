"""One clear line for failures that Ray wraps in layers: which role failed, and why."""

from __future__ import annotations

import re

import ray


def actor_error_message(exc: BaseException) -> str:
    text = str(exc)
    if isinstance(exc, ray.exceptions.RayActorError):
        init = re.search(r"ray::(\w+)\.__init__", text)
        if init:
            return f"the {init.group(1)} actor failed to start: {text.strip().splitlines()[-1]}"
        name = re.search(r"class_name: (\w+)", text)
        pid = re.search(r"\tpid: (\d+)", text)
        detail = re.search(r"Worker exit detail: (.+?\.)", text)
        return (f"the {name.group(1) if name else 'a Ray'} actor died"
                f"{f' (pid {pid.group(1)})' if pid else ''}: "
                f"{detail.group(1) if detail else 'see the Ray logs'} The run cannot go on without it.")
    if isinstance(exc, ray.exceptions.RayTaskError):
        cause = exc.cause
        while isinstance(cause, ray.exceptions.RayTaskError) and cause.cause is not None:
            cause = cause.cause  # a failed input of a failed task: report the first failure
        return f"{type(cause).__name__}: {cause}"
    return f"{type(exc).__name__}: {exc}"
