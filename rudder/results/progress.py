"""A progress bar for long collects (rich), or none."""
from __future__ import annotations


class _NoBar:
    def advance(self) -> None:
        pass

    def stop(self) -> None:
        pass


class _Bar:
    def __init__(self, total: int):
        from rich.progress import Progress

        self._p = Progress(transient=True)
        self._p.start()
        self._task = self._p.add_task("collecting runs", total=total)

    def advance(self) -> None:
        self._p.advance(self._task)

    def stop(self) -> None:
        self._p.stop()


def progress(enabled: bool, total: int):
    return _Bar(total) if enabled and total > 1 else _NoBar()
