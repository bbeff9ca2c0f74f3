"""Tables print data literally: no rich markup, nulls as ``null``, control characters escaped."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nexus_cache.cli._output import Table, emit
from nexus_cache.cli.main import main

MARKUP = ["[red]x[/red]", "a[b]c", "[/]", "[bold]"]


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [False, True])
def test_cells_columns_and_titles_are_never_markup(terminal: bool) -> None:
    out = FakeTerminal() if terminal else io.StringIO()
    table = Table(["[/]", "a[b]c"], title="[bold]t[/bold]", footer="[/] footer")
    for value in MARKUP:
        table.add(value, value)
    emit(None, table, as_json=False, file=out)
    text = out.getvalue()
    for value in [*MARKUP, "[bold]t[/bold]", "[/] footer"]:
        assert value in text


@pytest.mark.parametrize("terminal", [False, True])
def test_none_prints_as_null_not_blank(terminal: bool) -> None:
    out = FakeTerminal() if terminal else io.StringIO()
    table = Table(["k", "v"])
    table.add("a", None)
    emit(None, table, as_json=False, file=out)
    line = next(line for line in out.getvalue().splitlines() if " a " in f" {line} ")
    assert "null" in line


def test_control_characters_are_escaped() -> None:
    out = FakeTerminal()
    table = Table(["v"])
    table.add("x\x1b]0;owned\x07y\x1b[31mz")
    emit(None, table, as_json=False, file=out)
    text = out.getvalue()
    assert "]0;owned" in text
    assert "\x07" not in text
    assert "\x1b]" not in text
    assert "\x1b[31m" not in text
    assert "\\x1b]0;owned\\x07y\\x1b[31mz" in text


@pytest.fixture
def hostile_parquet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("NEXUS_DEVICE_BACKEND", "host")
    path = tmp_path / "[red]dir" / "x.parquet"
    path.parent.mkdir()
    pq.write_table(
        pa.table({"[/]": [*MARKUP, None], "n": [1, None, 3, 4, 5]}),
        path,
    )
    return path


def test_scan_prints_markup_and_nulls_literally(
    hostile_parquet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["scan", str(hostile_parquet)]) == 0
    text = capsys.readouterr().out
    for value in MARKUP:
        assert value in text
    assert "[/]" in text.strip().splitlines()[0]  # the column name
    assert text.count("null") == 2  # the two null cells, not blanks


def test_scan_json_keeps_nulls_as_json_null(
    hostile_parquet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["scan", str(hostile_parquet), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["columns"] == ["[/]", "n"]
    assert data["head"][1] == {"[/]": "a[b]c", "n": None}
    assert data["head"][4] == {"[/]": None, "n": 5}


def test_scan_out_footer_names_the_path_literally(
    hostile_parquet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = hostile_parquet.parent / "a[b]out.parquet"
    assert main(["scan", str(hostile_parquet), "--out", str(out)]) == 0
    assert f"written to {out}" in capsys.readouterr().out


def test_evidence_report_names_files_literally(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from nexus_cache.service.evidence import AdmissionLog

    AdmissionLog(tmp_path)
    (tmp_path / "attempt-a[b]c[bold].json").write_text("not json")
    assert main(["evidence", "verify", str(tmp_path)]) == 1
    text = capsys.readouterr().out
    assert "attempt-a[b]c[bold].json" in text


def test_error_lines_escape_control_characters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NEXUS_DEVICE_BACKEND", "host")
    missing = tmp_path / "no\x1b]0;owned\x07such.parquet"
    assert main(["lakehouse", "read", str(missing)]) == 2  # quotes the path as given
    err = capsys.readouterr().err
    assert err.startswith("nexus-cache: error: ")
    assert "\x1b" not in err
    assert "\x07" not in err
    assert "no\\x1b]0;owned\\x07such.parquet" in err


def test_lakehouse_read_shows_the_location_literally(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "[bold]a[b]c.parquet"
    pq.write_table(pa.table({"x": [1]}), path)
    assert main(["lakehouse", "read", str(path)]) == 0
    assert "[bold]a[b]c.parquet" in " ".join(capsys.readouterr().out.split())


def test_cluster_worker_addresses_print_once_literally() -> None:
    from nexus_cache.cli.cluster import _table

    out = io.StringIO()
    emit(
        None,
        _table([{"worker": "tcp://[::1]:4000 [red]w", "service": None}]),
        as_json=False,
        file=out,
    )
    text = out.getvalue()
    assert "tcp://[::1]:4000 [red]w" in text
    assert "\\[" not in text  # not escaped twice
