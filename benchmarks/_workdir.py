"""Where a benchmark or a profile keeps its files: the ``--workdir`` given (kept
after the run, so the next run reuses its data), else a temporary directory that
is removed when the run ends, on errors too."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["workdir", "workdir_label"]


@contextlib.contextmanager
def workdir(given: str | Path | None, prefix: str) -> Iterator[Path]:
    """The run's directory: ``given`` (made if missing, kept), else a new
    temporary one named ``prefix...``, removed on leaving."""
    if given is not None:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield Path(tmp)


def workdir_label(given: str | Path | None, work: Path) -> str:
    """How a run's header names its directory."""
    return f"workdir {work}" if given is not None else "temporary workdir, removed"
