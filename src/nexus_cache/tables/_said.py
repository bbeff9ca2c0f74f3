"""One line of what a table library's error says.

deltalake appends its native backtrace to a message (a numbered frame per
line) and pydantic, under pyiceberg, spreads one error over several lines;
an error of ours carries one line of it, cut to a length a terminal shows.
"""

from __future__ import annotations

import re

__all__ = ["said"]

_FRAME = re.compile(r"^\s*\d+:\s")  # "   0: <unknown>", the start of a backtrace
_LIMIT = 300


def said(exc: BaseException) -> str:
    """``exc``'s message on one line: its lines up to a backtrace, joined, at most
    300 characters."""
    kept = []
    for line in str(exc).splitlines():
        if _FRAME.match(line):
            break
        kept.append(line)
    text = " ".join(" ".join(kept).split())
    return text if len(text) <= _LIMIT else text[: _LIMIT - 3] + "..."
