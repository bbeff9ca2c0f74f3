"""``verify`` on a live root: entries other processes remove meanwhile are not bad."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from nexus_cache.lakehouse import LakehouseRoot

from ._helpers import entry_files, make_cache, write_old_file

_CLEAR = (
    "import sys; from nexus_cache.lakehouse import LakehouseRoot; "
    "LakehouseRoot(sys.argv[1]).clear()"
)


def test_entries_removed_by_another_process_during_verify_are_not_reported_bad(
    tmp_path: Path,
) -> None:
    root = tmp_path / "c"
    cache = make_cache(root, policy="fill_before_read")
    for i in range(3):
        cache.read(str(write_old_file(tmp_path / f"{i}.parquet", os.urandom(5000 + i))))
    assert cache.wait_for_fills(timeout=30)
    cleared = []

    def clear_once(_n: int) -> None:
        # Another process clears the root (as retention would) after the pass
        # listed the entries and before it checks the first one.
        if not cleared:
            done = subprocess.run(
                [sys.executable, "-c", _CLEAR, str(root)],
                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            cleared.append(True)

    result = LakehouseRoot(root).verify(progress=clear_once)
    assert entry_files(root) == []
    assert result.checked == 3
    assert result.bad == {}  # was: "data missing" / "identity record missing" for each
    cache.close()
