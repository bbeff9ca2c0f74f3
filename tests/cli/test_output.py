"""The shared output helpers: tables, JSON, sizes, times, progress."""

from __future__ import annotations

import io
import json

from nexus_cache.cli._output import Table, age, emit, progress, size, utc


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_emit_json_keeps_raw_numbers() -> None:
    out = io.StringIO()
    emit({"bytes": 1536}, Table(["x"]), as_json=True, file=out)
    assert json.loads(out.getvalue()) == {"bytes": 1536}


def test_emit_table_is_plain_text_off_a_terminal() -> None:
    out = io.StringIO()
    table = Table(["NAME", "SIZE"], right=("SIZE",), footer="1 entry")
    table.add("a-long-name", size(1536))
    emit(None, table, as_json=False, file=out)
    text = out.getvalue()
    assert "\x1b[" not in text  # no colour codes in a pipe
    assert all(line == line.rstrip() for line in text.splitlines())
    assert "1.5 KiB" in text
    assert text.endswith("1 entry\n")


def test_emit_table_without_rows_prints_only_the_footer() -> None:
    out = io.StringIO()
    emit(None, Table(["A"], title="problems", footer="checked 3: 3 ok"), as_json=False, file=out)
    assert out.getvalue() == "checked 3: 3 ok\n"


def test_sizes_and_times() -> None:
    assert size(None) == "-"
    assert size(0) == "0 B"
    assert size(10 * 2**30) == "10.0 GiB"
    assert utc(0) == "1970-01-01T00:00:00Z"
    now = 10**18
    assert age(now - 5 * 10**9, now_ns=now) == "5s"
    assert age(now - 7200 * 10**9, now_ns=now) == "2h"
    assert age(now - 3 * 86400 * 10**9, now_ns=now) == "3d"
    assert age(now + 10**9, now_ns=now) == "0s"  # clock skew: never negative


def test_progress_is_silent_off_a_terminal() -> None:
    err = io.StringIO()
    with progress("work", 3, file=err) as advance:
        for _ in range(3):
            advance(1)
    assert err.getvalue() == ""


def test_progress_draws_on_a_terminal() -> None:
    err = FakeTerminal()
    with progress("verifying", 2, file=err) as advance:
        advance(1)
        advance(1)
    assert "verifying" in err.getvalue()
