"""``verify`` of a FileStream program cache: check every entry against its record.

Kept apart from :mod:`nexus_cache.program.filestream._cache` (the read and write
paths). Reads each entry once through a no-follow open; what it cannot vouch
for is reported, never served. Thread- and process-safe (removal of a corrupt
entry is the cache's stat-guarded ``drop_corrupt``).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from nexus_cache.program._integrity import (
    entry_relpath,
    entry_verdict,
    is_outdated,
    name_digest,
    open_entry,
    read_rest,
)
from nexus_cache.program._report import VerifyReport
from nexus_cache.program.filestream import _scan

__all__ = ["verify_entries"]


def verify_entries(
    entries: str,
    *,
    carrier: str,
    drop_corrupt: Callable[[str, os.stat_result], None],
    drop_outdated: Callable[[str, os.stat_result], None],
    progress: Callable[[int], None] | None = None,
) -> VerifyReport:
    """Check every entry under ``entries``; ``drop_corrupt(path, stat)`` each corrupt one.

    An entry an earlier version of nexus-cache wrote (an older record, or a
    place the current layout never reads) is never served; it is listed as
    outdated and removed with ``drop_outdated(path, stat)``.

    ``carrier`` says where the integrity records live (``"mtime"``,
    ``"xattr"`` or ``"sidecar"``; see :mod:`nexus_cache.program._integrity`).
    ``progress(1)`` is called once per entry checked.
    """
    report = VerifyReport()
    result = _scan.scan(entries)
    report.refused.extend(result.refused)
    for e in result.entries:
        if progress is not None:
            progress(1)
        report.checked += 1
        name = os.path.basename(e.path)
        try:
            fd = open_entry(e.path)
        except FileNotFoundError:
            continue
        try:
            st = os.fstat(fd)
            if not e.path.endswith("/" + entry_relpath(name)):
                verdict: bool | None = False
                outdated = True  # where no read looks: an earlier layout's
            else:
                data = read_rest(fd, b"", st.st_size)
                verdict = entry_verdict(carrier, fd, e.path, st, data, name_digest(name))
                outdated = verdict is not True and is_outdated(fd, e.path)
        finally:
            os.close(fd)
        if outdated:
            report.outdated.append(name)
            drop_outdated(e.path, st)
        elif verdict is None:
            report.unverified.append(name)
        elif verdict:
            report.ok += 1
        else:
            report.corrupt.append(name)
            drop_corrupt(e.path, st)
    return report
