"""A query in the server, from its ticket to its last batch.

Its id, ticket, state and the cancel event that its client going away, the
``cancel`` action, the status page or the server stopping sets.
"""

from __future__ import annotations

import dataclasses
import threading

__all__ = ["RunningQuery"]


@dataclasses.dataclass(eq=False)
class RunningQuery:
    """A query in the server, from its ticket to its last batch."""

    query_id: str
    ticket: bytes
    started: float  # time.monotonic()
    cancel: threading.Event = dataclasses.field(default_factory=threading.Event)
    #: waiting (for a running-query slot), executing or streaming
    state: str = "waiting"
    #: cancelled by the server stopping (not by its client)
    by_server: bool = False
