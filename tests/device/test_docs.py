"""docs/device.md and the code state the same equation, fraction and gauge names."""

from __future__ import annotations

import re
from pathlib import Path

import nexus_cache.device.ledger as ledger_module
from nexus_cache.device import GAUGES, MANAGED_CAPACITY_FRACTION, REPORT_COLUMNS, DeviceLedger

DOC = (Path(__file__).resolve().parents[2] / "docs" / "device.md").read_text()


def _equation(text: str) -> list[str]:
    return [
        re.sub(r"\s+", " ", line.split("(")[0]).strip()
        for line in text.splitlines()
        if "<=" in line and "R + E + P + D + Q" in line
    ]


def test_capacity_equation_is_the_same_in_doc_and_code() -> None:
    doc, code = _equation(DOC), _equation(ledger_module.__doc__ or "")
    assert code == ["G + R + E + P + D + Q <= M", "R + E + P + D + Q <= C"]
    assert doc == code


def test_equation_is_what_the_ledger_enforces() -> None:
    ledger = DeviceLedger(0, 100, 60)
    ledger.admit_grant("g", 30)  # G = 30
    ledger.reserve(10).publish(10)  # E = 10
    ledger.reserve(20)  # R = 20: cache 30, G + cache 60
    ledger.reserve(30)  # cache 60 = C exactly, G + cache 90 <= M
    snap = ledger.snapshot()
    assert snap.cache_charged_bytes == 60
    assert snap.free_managed_bytes == 10
    ledger.admit_grant("h", 10)  # G + cache = 100 = M exactly


def test_fraction_gauges_and_columns_documented() -> None:
    assert f"**{MANAGED_CAPACITY_FRACTION}**" in DOC
    for gauge, (field, prom, _) in GAUGES.items():
        assert f"| `{field}` | `{gauge}` | `{prom}` |" in DOC
    for column in REPORT_COLUMNS:
        name = column.removeprefix("source_").removeprefix("graph_")
        assert f"`{name}`" in DOC, column
