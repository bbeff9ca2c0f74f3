"""The package loads neither deltalake nor pyiceberg until a table of theirs is resolved."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_package_loads_no_table_library() -> None:
    code = (
        "import sys, nexus_cache.tables as t\n"
        "t.resolve_table, t.read_table, t.canonical_filter, t.plan_scan, t.filter_mask\n"
        "print(sorted(m for m in ('deltalake', 'pyiceberg', 'nexus_cache.service',"
        " 'nexus_cache.device', 'cupy') if m in sys.modules))\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert found.stdout.strip() == "[]"
