"""In-process pin sharing: one pin file per process and key, removed by the last reader."""

from __future__ import annotations

import threading
from pathlib import Path

from nexus_cache.lakehouse.store._pins import create_pin, live_pins

from ._helpers import make_cache, write_old_file


def _pin_files(root: Path) -> list[Path]:
    return sorted((root / "pins").glob("*.pin"))


def test_overlapping_reads_share_one_pin_file(tmp_path: Path) -> None:
    src = write_old_file(tmp_path / "src" / "a.bin", b"x" * 4096)
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache:
        cache.read(str(src))  # fill
        assert _pin_files(root) == []
        f1 = cache.open(str(src))
        files = _pin_files(root)
        assert len(files) == 1
        f2 = cache.open(str(src))
        assert _pin_files(root) == files  # joined, not a second file
        f1.close()
        assert _pin_files(root) == files  # f2 still reads: still pinned
        result = cache.prune(0)
        assert result.removed == 0
        assert result.pinned_skipped == 1
        assert f2.read() == b"x" * 4096
        f2.close()
        assert _pin_files(root) == []
        # the next reader gets a fresh file
        with cache.open(str(src)):
            assert len(_pin_files(root)) == 1
        assert _pin_files(root) == []


def test_release_is_idempotent_and_counts_per_reader(tmp_path: Path) -> None:
    pins = tmp_path / "pins"
    a, b = create_pin(pins, "k"), create_pin(pins, "k")
    assert a.path == b.path
    a.release()
    a.release()  # a second release must not drop b's share
    assert live_pins(pins) == {"k": 1}
    b.release()
    assert live_pins(pins) == {}


def test_threads_pinning_one_key_leave_no_file(tmp_path: Path) -> None:
    pins = tmp_path / "pins"
    held = create_pin(pins, "k")
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            for _ in range(300):
                create_pin(pins, "k").release()
                create_pin(pins, "other").release()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert live_pins(pins) == {"k": 1}  # the held pin survived all the churn
    held.release()
    assert list(pins.iterdir()) == []
