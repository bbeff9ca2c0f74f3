"""The Python examples of the user docs run as written."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def python_block_after(doc: str, heading: str) -> str:
    """The first fenced ``python`` block after ``heading`` in ``doc``."""
    text = (DOCS / doc).read_text("utf-8")
    start = text.index(f"\n{heading}\n")
    match = re.compile(r"```python\n(.*?)```", re.DOTALL).search(text, start)
    assert match is not None, f"no python block after {heading!r} in {doc}"
    return match.group(1)


def test_device_quick_start_runs_and_prints_what_the_doc_says() -> None:
    code = python_block_after("device.md", "## Quick start")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/device.md", "exec"), {"__name__": "__doc_example__"})
    assert out.getvalue().splitlines() == [
        "sum = 5e+11",
        "resident, evictable: 4000256 bytes",
        "pinned in use: 0 bytes",
    ]
