"""Console progress: a rich progress bar on a terminal, plain lines in logs (CI, Ray jobs)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def duration(seconds: float) -> str:
    seconds = round(max(0.0, seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 600:
        return f"{seconds // 60} min {seconds % 60} s" if seconds % 60 else f"{seconds // 60} min"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def estimate(spent: float, done: int, total: int, at_most: bool) -> str:
    """Time spent and, at the rate so far, what is left of `total` steps: "about" for a fixed number
    of steps; for work that ends early at a target, its rate and the latest it ends (its budget)."""
    if done <= 0:
        return f"{duration(spent)} so far"
    rate = spent / done
    left = duration(rate * max(0, total - done))
    if not at_most:
        return f"{duration(spent)} so far, about {left} left"
    return f"{duration(spent)} so far, {rate:.2g} s/step; ends at its target, at the latest in {left}"


class RunProgress:
    def __init__(self, console: Console | None = None):
        self.console = console or Console(highlight=False)
        self.live = self.console.is_terminal
        self.bar: Progress | None = None
        self.task = None

    def start(self, title: str, total: int, completed: int = 0) -> None:
        self.stop()
        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("{task.fields[info]}"),
                            console=self.console, disable=not self.live)
        self.bar.start()
        self.task = self.bar.add_task(title, total=total, completed=completed, info="")

    def update(self, completed: int, info: str, force_line: bool = False) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=completed, info=info)
        if not self.live and force_line:
            self.console.print(f"{self.bar.tasks[0].description if self.bar else ''} {completed}: {info}",
                               soft_wrap=True)

    def print(self, message: str) -> None:
        # soft_wrap: no line breaks inserted into logs, so paths and messages stay whole for grep
        self.console.print(message, soft_wrap=True)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
