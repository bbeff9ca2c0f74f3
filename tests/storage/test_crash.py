from __future__ import annotations

import multiprocessing
import os
import signal

from nexus_cache._storage import sweep_stale_temps

from . import _workers

CTX = multiprocessing.get_context("spawn")


def test_sigkill_mid_write_leaves_no_visible_entry_and_temp_is_swept(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    final = tmp_path / "entries" / "e"
    ready = CTX.Event()
    p = CTX.Process(target=_workers.write_half_then_hang, args=(str(tmp), ready))
    p.start()
    assert ready.wait(30)
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)
    assert p.exitcode == -signal.SIGKILL
    assert not final.exists()
    leftovers = os.listdir(tmp)
    assert len(leftovers) == 1  # the torn temp, invisible to readers of entries/
    assert sweep_stale_temps(tmp) == 1  # its writer is dead: no need to wait an hour
    assert os.listdir(tmp) == []
