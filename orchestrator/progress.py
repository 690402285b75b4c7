"""Console progress: a rich progress bar on a terminal, plain lines in logs (CI, Ray jobs)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


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
