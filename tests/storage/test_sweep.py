from __future__ import annotations

import multiprocessing
import os
import time

from nexus_cache._storage import new_temp, pid_alive, sweep_stale_temps
from nexus_cache._storage._names import host_tag, parse_temp_name, temp_name

from . import _workers


def _touch(path, age_s=0.0):
    path.write_bytes(b"x")
    t = time.time_ns() - int(age_s * 1e9)
    os.utime(path, ns=(t, t))


def _dead_pid():
    p = multiprocessing.get_context("spawn").Process(target=_workers.exit_now)
    p.start()
    p.join()
    return p.pid


def test_names_round_trip():
    name = temp_name("pre-")
    assert name.startswith("pre-")
    assert parse_temp_name(name) == (host_tag(), os.getpid())
    assert parse_temp_name("entry-file") is None


def test_sweep_rules(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    old_foreign = tmp / "whatever.tmp"
    _touch(old_foreign, age_s=7200)
    fresh_foreign = tmp / "fresh-unknown"
    _touch(fresh_foreign)
    fd, mine = new_temp(tmp)  # our own, alive, fresh
    os.close(fd)
    dead = _dead_pid()
    assert not pid_alive(dead)
    dead_temp = tmp / f"{host_tag()}-{dead}-00ff.tmp"
    _touch(dead_temp)
    other_host = tmp / f"0badc0de-{dead}-00ff.tmp"  # pid means nothing on another host
    _touch(other_host)
    live_parent = tmp / f"{host_tag()}-{os.getppid()}-00ff.tmp"
    _touch(live_parent)
    (tmp / "subdir").mkdir()

    assert sweep_stale_temps(tmp) == 2
    left = set(os.listdir(tmp))
    assert left == {fresh_foreign.name, mine.name, other_host.name, live_parent.name, "subdir"}
    # a zero threshold removes every file, fresh or not, but never directories
    assert sweep_stale_temps(tmp, older_than_s=-1) == 4
    assert os.listdir(tmp) == ["subdir"]


def test_sweep_missing_dir(tmp_path):
    assert sweep_stale_temps(tmp_path / "nope") == 0
