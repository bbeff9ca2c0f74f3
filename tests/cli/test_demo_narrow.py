"""The demo's output on an 80-column terminal: no line wider, no cell split
over two lines, and no GPU wording on the host backend."""

from __future__ import annotations

import io
import re

import pytest

from nexus_cache.cli.main import main

_QUERIES = ("scan", "count", "pagerank", "pagerank-q2", "bfs", "jaccard")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_demo_fits_80_columns_without_splitting_a_cell(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("NO_COLOR", "1")
    out = _Terminal()
    monkeypatch.setattr("sys.stdout", out)
    assert main(["demo", "--scale", "5", "--backend", "host"]) == 0
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", out.getvalue())
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    # each query is one line of the table: a cell folded onto a second line
    # would add a line that starts with blanks and no query name
    rule = [i for i, line in enumerate(lines) if line.strip().startswith("───")]
    body = lines[rule[0] + 1 : rule[0] + 1 + len(_QUERIES)]
    assert [line.split()[0] for line in body] == list(_QUERIES)
    assert not lines[rule[0] + 1 + len(_QUERIES)].strip()  # the table ends there
    for line in body:
        assert len(line.split()) == 7, line  # every cell whole, in its own column
    header = lines[rule[0] - 1].split()
    assert header == ["query", "cold", "warm", "speedup", "lakehouse", "source", "graph"]
    device_row = lines[rule[1] + 1].split()
    assert device_row[:2] == ["0", "(host)"]
    assert len(device_row) == 12  # device, four sizes (number and unit), two counts
    assert "GPU" not in text  # the host backend compiles no GPU kernel


def test_the_warm_up_line_names_what_each_backend_compiles() -> None:
    from nexus_cache.cli import demo
    from nexus_cache.service.demo import DemoReport

    def line(backend: str) -> str:
        report = DemoReport(backend, 16, 1 << 20, 1 << 20, (), (), None, warmup_s=9.5)
        return demo._warmup_line(report)

    gpu, host = line("cuda"), line("host")
    assert gpu.startswith("compile/warm-up: 9.50s before the cold run")
    assert "GPU kernels" in " ".join(gpu.split())
    assert "GPU" not in host
    assert "Numba" in host
    assert max(len(x) for x in (gpu + host).splitlines()) <= 80
