"""Ray actor names: `<run>/<role>/<index>`, so `ray list actors`, the dashboard's actors page and
`coevo status` show which run and role an actor serves. The run is the run directory's name, set
for the time a run builds its pools (`RUN.set`); a nested run (a reward-model warm-up) sets its own.
Names live in the driver's job namespace (Ray's default, one per driver connection), so a run that
restarts after a lost learner, or two runs of the same name, never collide. Within one driver, a
role built again (a stage's temporary pool, then the run's own) gets `<index>.<n>`: Ray frees a
killed actor's name asynchronously."""

from __future__ import annotations

import contextvars

RUN: contextvars.ContextVar[str | None] = contextvars.ContextVar("coevo_run", default=None)
_issued: set[tuple[str, str]] = set()  # (namespace, name) given out by this process


def actor_name(role: str, index: int) -> str | None:
    """The name for replica `index` of `role` in the current run; None outside a run (tests that
    build a pool directly), which leaves the actor unnamed."""
    run = RUN.get()
    if run is None:
        return None
    import ray

    namespace = ray.get_runtime_context().namespace
    name, n = f"{run}/{role}/{index}", 1
    while (namespace, name) in _issued:
        n += 1
        name = f"{run}/{role}/{index}.{n}"
    _issued.add((namespace, name))
    return name
