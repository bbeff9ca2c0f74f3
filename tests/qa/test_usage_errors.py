"""Usage errors are one line on stderr and exit 2, in every group (README: Command line)."""

from __future__ import annotations

import pytest

from nexus_cache.cli.main import main


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["no-such-command"],
        ["program-cache", "prune", "--max-bytes", "1.5G"],
        ["program-cache", "ls", "--limit", "-3"],
        ["lakehouse", "bogus"],
        ["lakehouse", "prune", "--max-bytes", "nan"],
        ["device", "report", "--backend", "nope"],
        ["device", "report", "--cache-cap-bytes", "-1"],
        ["device", "report", "--backend", "host", "--device", "\u0660"],  # Arabic-Indic 0
        ["program-cache", "ls", "--limit", "1_0"],
        ["lakehouse", "stats", "--recent", "\uff15"],  # fullwidth 5
        ["lakehouse", "stats", "--recent", "-1"],
    ],
)
def test_usage_errors_are_one_line_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, out.err
    assert lines[0].startswith("nexus-cache")
    assert "error: " in lines[0]
    assert "--help" in lines[0]


def test_help_still_shows_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["program-cache", "prune", "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("usage: nexus-cache program-cache prune")


def test_device_report_cap_over_capacity_names_the_option_in_iec(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = main(["device", "report", "--backend", "host", "--cache-cap-bytes", "100T"])
    assert rc == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "--cache-cap-bytes 100.0 TiB exceeds the managed capacity" in err
    assert "GiB" in err
    assert "109951162777600" not in err
