"""Tables on an 80-column terminal keep whole timestamps and sizes, and every name."""

from __future__ import annotations

import io
import re

import pytest

from nexus_cache.cli._output import Table, emit

STAMP = "2026-12-03T14:56:23Z"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_narrow_terminal_keeps_whole_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("NO_COLOR", "1")
    table = Table(
        ["PROGRAM", "TYPE", "TARGET", "SIZE", "LAST USE (UTC)", "AGE", "ENTRY"],
        right=("SIZE", "AGE"),
        whole=("TARGET", "SIZE", "LAST USE (UTC)", "AGE"),
    )
    name = "nexus_demo: saxpy<double>, saxpy<float>"
    table.add(name, "cubin", "sm_90", "5.4 KiB", STAMP, "5m", "70aed2522609")
    out = _Terminal()
    emit(None, table, as_json=False, file=out)
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", out.getvalue())
    assert max(len(line) for line in text.splitlines()) <= 80
    assert STAMP in text
    assert "5.4 KiB" in text
    assert "…" not in text  # long names fold onto more lines instead
