"""A directory of raw compiled binaries, safe to share between threads and processes."""

from __future__ import annotations

import errno
import os
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import xxhash

from nexus_cache._sizes import parse_size
from nexus_cache._storage import (
    UnlinkResult,
    atomic_write,
    check_owned_regular,
    ensure_private_dir,
    lstat_key,
    rename_into_place,
    stage_temp,
    stat_key,
    sweep_stale_temps,
    unlink_if_unchanged,
)
from nexus_cache.errors import CacheIntegrityError, CacheSecurityError, ConfigError
from nexus_cache.program._caps import validate_cap
from nexus_cache.program._counters import OpCounters
from nexus_cache.program._identify import identify_cache_path
from nexus_cache.program._integrity import (
    FANOUT,
    PLAIN_READ_FLAGS,
    READ_FLAGS,
    SIDECAR_SUFFIX,
    XATTR_NAME,
    entry_digest,
    entry_verdict,
    make_record,
    make_sidecar,
    probe_carrier,
    publish_times,
    read_rest,
)
from nexus_cache.program._paths import default_filestream_root
from nexus_cache.program._report import EntryInfo, VerifyReport
from nexus_cache.program._resource import (
    CacheStats,
    ProgramCacheResource,
    ProgramCacheValue,
    as_key_bytes,
    value_to_store,
)
from nexus_cache.program.filestream import _scan, _stamps
from nexus_cache.program.filestream._evict import FileStreamEviction
from nexus_cache.program.filestream._evictq import CandidateQueue
from nexus_cache.program.filestream._readmemo import SEEN_SLOTS, MemoEntry, VerifiedMemo
from nexus_cache.program.filestream._usage import UsageCounter
from nexus_cache.program.filestream._verify import verify_entries

__all__ = ["FileStreamProgramCache"]

_S_IFMT, _S_IFREG = 0o170000, 0o100000
_LOW_WATER = 0.9  # stores above this fraction of the cap evict (in batches)
# A store evicts what it needs to get under the cap plus at most this many
# more, so no single store pays for draining to the low-water mark; the next
# stores above the mark carry on (each store adds one entry, evicts up to 64).
_EVICT_EXTRA = 64
_DEFAULT_MEMORY_BYTES = 32 << 20
# A hit stamps the entry's atime unless a read already stamped it (atime after
# mtime) less than this long ago: the first read after a write always promotes
# the entry, re-reads are ordered to 1 s, which eviction (least recently read
# first, over minutes to days) cannot tell from exact, and a hot entry costs
# no metadata write (utime dirties the inode: a journal entry) per hit.
_STAMP_WINDOW_NS = 1_000_000_000
# An uncapped object keeps no shared byte counter on its stores; it removes
# the counter at most this often instead (see UsageCounter.forget).
_FORGET_USAGE_NS = 1_000_000_000
_open, _close, _read, _fstat = os.open, os.close, os.read, os.fstat
_STAMPS = _stamps.QUEUE
_pending_stamps = _STAMPS.pending
_SEEN_MASK = SEEN_SLOTS - 1
_xxh3 = xxhash.xxh3_64_intdigest
_NS = 1_000_000_000
_crc32 = zlib.crc32
_utime, _time_ns = os.utime, time.time_ns


def _not_an_entry(path: str) -> CacheSecurityError:
    return CacheSecurityError(
        f"{path} is a directory where a cache entry belongs; refusing to touch it. "
        "Remove it (nexus-cache program-cache verify lists such paths)."
    )


def _refuse_foreign_dir(root: Path) -> None:
    """Refuse cuda.core's own cache directory and a lakehouse root: opening either
    would sweep the other cache's temps and mix two layouts that each cache's
    verify and pruning would misjudge (and delete)."""
    try:
        kind = identify_cache_path(root)
    except OSError:
        return  # unreachable path: ensure_private_dir below says why, in its words
    if kind == "lakehouse":
        raise CacheIntegrityError(
            f"{root} is a lakehouse cache root, not a program cache; point "
            "FileStreamProgramCache (or NEXUS_PROGRAM_CACHE_DIR) at another directory"
        )
    if kind == "cuda-core-filestream":
        raise CacheIntegrityError(
            f"{root} is cuda.core's own FileStreamProgramCache directory; nexus-cache "
            "does not share it. Point FileStreamProgramCache (or NEXUS_PROGRAM_CACHE_DIR) "
            "at another directory"
        )


class FileStreamProgramCache(ProgramCacheResource):
    """Compiled binaries as raw files under ``path`` (POSIX only).

    Layout: ``entries/<fan-out>/<name>`` holds the binary exactly as stored
    (cuobjdump and nvdisasm read it directly); the name is a 32-byte key's
    own hex, else a SHA-256 of the key (see ``_integrity.entry_location``);
    ``tmp/`` holds writes in flight; ``usage`` is the shared byte counter.

    Guarantees:

    * Thread- and process-safe. Writes go to a private temp file, are
      fsynced and renamed into place, so a reader sees the old or the new
      entry, never a torn one, and a crash leaves only a temp that the next
      open (or eviction) sweeps.
    * Integrity: an XXH3 check of the bytes, bound to the key, rides in the
      entry's metadata: the nanoseconds of its mtime where the filesystem
      keeps them, else the ``user.nexus.v2`` xattr, else a ``.sum`` sidecar
      (``record_carrier`` says which). A truncated, bit-flipped, rewritten
      or misplaced entry reads as a miss, is removed and is counted in
      ``stats().corrupt``.
    * LRU by access time: a hit queues a stamp of the entry's atime unless
      a read stamped it less than 1 s ago (re-reads are ordered to 1 s; the
      first read after a write always promotes); a background thread writes
      queued stamps about a second later, through an fd checked to be the
      inode read (a concurrent rewrite is never stamped), and everything
      queued is written before this process evicts or lists, and at exit
      (``_stamps``). Eviction removes the least recently read first.
    * ``max_size_bytes`` is a best-effort cap shared by all processes: a
      store that takes the shared counter over the cap evicts (one process
      at a time) back under it plus at most 64 more, least recently read
      first, from a candidate list kept from one scan; later stores above
      90% of the cap evict their own bounded batch from that list, and a
      fresh scan waits until the list is used up. An entry larger
      than the cap is not stored and evicts nothing (``stats().oversize``).
      Uncapped objects keep no counter on their stores; they remove it (at
      most once a second) so capped objects rebuild it from a scan.
    * Security: the root is created 0700; a root or entry that is a symlink
      or belongs to another user raises :class:`CacheSecurityError`.
    * Fast repeat hits: up to ``memory_bytes`` (default 32 MiB, ``0`` to
      disable) of entries this object has read and verified stay in memory.
      A repeat hit still ``lstat``s the entry and goes back to disk if it
      was deleted, rewritten or modified in place, so other processes'
      writes are seen exactly as without the memo; it never returns bytes
      that failed, or skipped, the integrity check. (An in-place
      modification is seen through its new mtime; on kernels older than
      6.13, whose mtimes are coarse, one landing in the same clock tick as
      the entry's last write goes unnoticed until the entry is re-read
      from disk, while the memo keeps serving the verified bytes.)
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        max_size_bytes: int | str | None = None,
        memory_bytes: int | str = _DEFAULT_MEMORY_BYTES,
    ) -> None:
        self._max = validate_cap("max_size_bytes", max_size_bytes)
        if isinstance(memory_bytes, str):  # the one size grammar, as for max_size_bytes
            memory_bytes = parse_size(memory_bytes, name="memory_bytes", allow_zero=True)
        if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int) or memory_bytes < 0:
            raise ConfigError(
                f"memory_bytes must be an int >= 0 or a size string such as '64M' "
                f"(0 disables the in-memory memo), got {memory_bytes!r}"
            )
        self._memo = VerifiedMemo(memory_bytes) if memory_bytes else None
        # The memo's first-read table (cleared in place, so bound once), or None.
        self._seen = self._memo.seen if self._memo is not None else None
        root = Path(path).expanduser() if path is not None else default_filestream_root()
        # Absolute now: every later open/rename uses this string, and a relative
        # one would follow the process's working directory (after a chdir, hits
        # became misses and stores built an unchecked second tree there).
        root = root.absolute()
        _refuse_foreign_dir(root)
        self._root = ensure_private_dir(root)
        self._entries = str(ensure_private_dir(self._root / "entries"))
        self._tmp = str(ensure_private_dir(self._root / "tmp"))
        self._prefix = self._entries + "/"
        # entries/<fan-out>/ of every fan-out, built once: a read adds the name.
        self._dirs = tuple(self._prefix + sub + "/" for sub in FANOUT)
        self._uid = os.geteuid()
        self._counts = OpCounters()
        self._hit = self._counts.hit  # bound once: the read path's last call
        sweep_stale_temps(self._tmp)
        self._carrier = probe_carrier(self._tmp)
        self._by_mtime = self._carrier == "mtime"
        self._sidecars = self._carrier == "sidecar"
        self._usage = UsageCounter(str(self._root / "usage"))
        self._candidates = CandidateQueue()
        self._eviction = FileStreamEviction(
            self._root,
            self._entries,
            self._tmp,
            usage=self._usage,
            candidates=self._candidates,
            counts=self._counts,
            sidecars=self._sidecars,
        )
        if self._max is not None:
            self._usage.initialise(self._eviction.scan_total)

    # -- properties ---------------------------------------------------------
    @property
    def path(self) -> Path:
        return self._root

    @property
    def max_size_bytes(self) -> int | None:
        return self._max

    @property
    def record_carrier(self) -> str:
        """Where integrity records live: ``"mtime"`` (the entry's mtime carries
        the check), ``"xattr"`` or ``"sidecar"`` (``.sum`` files)."""
        return self._carrier

    @property
    def uses_xattrs(self) -> bool:
        """Whether integrity records live in xattrs."""
        return self._carrier == "xattr"

    def _entry_path(self, digest: bytes) -> str:
        """``entries/<fan-out>/<name>`` of the entry ``digest`` names (``entry_location``)."""
        return self._dirs[_crc32(digest) & 255] + digest.hex()

    def _path_for(self, kb: bytes) -> str:
        return self._entry_path(entry_digest(kb))

    # -- read ---------------------------------------------------------------
    def __getitem__(self, key: bytes | str) -> bytes:
        data = self.get(key)
        if data is None:  # stored bytes are never None
            raise KeyError(key)
        return data

    def get(self, key: bytes | str, default: bytes | None = None) -> bytes | None:
        """The stored bytes, or ``default`` when the key is absent (or its entry
        fails the integrity check: then it is removed and counted as corrupt)."""
        # The read path users take (cuda.core's Program.compile(cache=...) and
        # cached_compile call get): kept in one frame, stdlib calls bound once.
        kb = key if key.__class__ is bytes else as_key_bytes(key)
        memo = self._memo
        if memo is not None:
            # Keyed by the key itself: a repeat hit hashes nothing.
            entry = memo.lookup(kb)
            if entry is not None:
                memo.touch(kb)
                data = self._memo_hit(memo, kb, entry)
                if data is not None:
                    self._hit()
                    return data
        # entry_location(), inline; the CRC-32 picks the fan-out and is the
        # key tag of the integrity check (see _integrity).
        digest = kb if len(kb) == 32 else entry_digest(kb)
        tag = _crc32(digest)
        path = self._dirs[tag & 255] + digest.hex()
        try:
            fd = _open(path, READ_FLAGS)
        except FileNotFoundError:
            self._count_miss()
            return default
        except PermissionError:
            # The kernel refuses O_NOATIME on a file we do not own: open it
            # plainly, and the ownership check below refuses it by name.
            fd = _open(path, PLAIN_READ_FLAGS)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise CacheSecurityError(
                    f"cache entry {path} is a symbolic link; refusing to follow it. "
                    "Remove it (nexus-cache program-cache verify lists such entries)."
                ) from None
            raise
        try:
            st = _fstat(fd)
            if st.st_uid != self._uid or st.st_mode & _S_IFMT != _S_IFREG:
                check_owned_regular(path, st)
            size = st.st_size
            data = _read(fd, size)
            if len(data) != size:
                data = read_rest(fd, data, size)
            mtime = st.st_mtime_ns
            if self._by_mtime:
                # The mtime carrier's check (see _integrity): the mtime's
                # nanoseconds are entry_check(data, digest) mod 10^9. The one
                # hash a read pays.
                ok: bool | None = mtime % _NS == (_xxh3(data) ^ tag) % _NS
            else:
                ok = entry_verdict(self._carrier, fd, path, st, data, digest)
                if ok is None:
                    self._count_miss()
                    return default
            if not ok:
                self._drop_corrupt(path, st, kb)
                return default
            keep = False
            seen = self._seen
            if seen is not None:
                # The memo keeps a version on its second disk read: its
                # first-read table (see VerifiedMemo.seen), inline; its slot
                # from the tag's bits above the fan-out's.
                slot = tag >> 8 & _SEEN_MASK
                if seen[slot] != mtime:
                    seen[slot] = mtime
                else:
                    seen[slot] = 0
                    keep = True
            atime = st.st_atime_ns
            # Never read since written (the common first read: no clock
            # read), or last stamped outside the window.
            if atime <= mtime or not 0 <= _time_ns() - atime < _STAMP_WINDOW_NS:
                if keep:
                    # Stamped now, through the fd (same inode, so a rewriter's
                    # fresh file is never stamped; mtime kept: it carries the
                    # check), so the memo records the ctime our stamp leaves.
                    _utime(fd, ns=(_time_ns(), mtime))
                    st = _fstat(fd)
                else:
                    # Queued, written beside the read (see _stamps.QUEUE):
                    # one stamp per path, the latest version read.
                    _pending_stamps[path] = st
                    if not _STAMPS.scheduled:
                        _STAMPS.schedule()
            if keep and memo is not None:  # keep is only set where the memo is on
                memo.put(kb, MemoEntry(path, st.st_ino, size, mtime, st.st_ctime_ns, data))
        finally:
            _close(fd)
        self._hit()
        return data

    def _memo_hit(self, memo: VerifiedMemo, kb: bytes, entry: MemoEntry) -> bytes | None:
        """The memo's bytes if the entry on disk is still the one they were read from."""
        path = entry.path
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            memo.discard(kb)
            return None  # the disk path reports the miss
        if (
            st.st_ino != entry.ino
            or st.st_size != entry.size
            or st.st_mtime_ns != entry.mtime_ns
            or st.st_ctime_ns != entry.ctime_ns
            or st.st_uid != self._uid
            or st.st_mode & _S_IFMT != _S_IFREG
        ):
            memo.discard(kb)
            return None  # rewritten, modified or tampered with: read and verify again
        now = _time_ns()
        atime = st.st_atime_ns
        if atime <= entry.mtime_ns or not 0 <= now - atime < _STAMP_WINDOW_NS:
            # At most once a second per entry, so written now: the memo must
            # learn the ctime our stamp leaves, or its next hit reads as changed.
            ctime = _stamps.stamp_now(path, entry.ino, entry.mtime_ns, now)
            if ctime is not None:
                entry.ctime_ns = ctime
            elif lstat_key(path) != (entry.ino, entry.size, entry.mtime_ns):
                memo.discard(kb)  # replaced or removed after our lstat
        return entry.data

    def _count_miss(self) -> None:
        self._counts.miss()

    def _drop_corrupt(self, path: str, st: os.stat_result, kb: bytes | None = None) -> None:
        # Without the key (verify) the memo is left alone: its lstat guard
        # sees the removal on the next hit.
        if self._memo is not None and kb is not None:
            self._memo.discard(kb)
        self._counts.miss(corrupt=1)
        if self._unlink_counted(path, st) and self._sidecars:
            _scan.remove_sidecar(path)

    def _drop_outdated(self, path: str, st: os.stat_result) -> None:
        """Remove an entry an earlier version wrote (verify): never read, not corrupt."""
        if self._unlink_counted(path, st):
            _scan.remove_sidecar(path)  # its .sum, if that version wrote one

    def _unlink_counted(self, path: str, st: os.stat_result) -> bool:
        """Remove ``path`` if it is still the file ``st`` describes; subtract its bytes."""
        with self._usage.hold() as held:
            outcome = unlink_if_unchanged(path, stat_key(st), aside_dir=self._tmp)
            if outcome is UnlinkResult.REMOVED:
                held.add(-st.st_size)
        return outcome is UnlinkResult.REMOVED

    # -- write ---------------------------------------------------------------
    def __setitem__(self, key: bytes | str, value: ProgramCacheValue) -> None:
        kb = key if key.__class__ is bytes else as_key_bytes(key)
        data = value_to_store(value)
        digest = entry_digest(kb)
        path = self._entry_path(digest)
        size = len(data)
        cap = self._max
        if cap is not None and size > cap:
            self._store_oversize(path, kb, size, cap)
            return
        carrier = self._carrier
        xattr = (XATTR_NAME, make_record(data, digest)) if carrier == "xattr" else None
        times = publish_times(data, digest, _time_ns()) if carrier == "mtime" else None
        # The bytes are written and fsynced before any lock is taken.
        tmp, ino = stage_temp(
            self._tmp,
            data,
            xattr=xattr,
            times_ns=times,
            want_inode=self._sidecars,
        )
        total: int | None = None
        try:
            if cap is None:
                # No cap to enforce: skip the counter (see UsageCounter.forget).
                rename_into_place(tmp, path)
            else:
                # lstat, rename and count under the counter's lock: two processes
                # rewriting one key never both count the bytes they replaced.
                with self._usage.hold() as held:
                    old = lstat_key(path)
                    rename_into_place(tmp, path)
                    total = held.add(size - (old.size if old is not None else 0))
        except IsADirectoryError:
            raise _not_an_entry(path) from None
        if self._sidecars:
            sidecar = make_sidecar(ino, data, digest)
            atomic_write(path + SIDECAR_SUFFIX, sidecar, tmp_dir=self._tmp)
        if self._memo is not None:
            self._memo.discard(kb)
        self._counts.stored()
        if cap is None:
            self._usage.forget(_FORGET_USAGE_NS)
            return
        if total is None:  # counter removed behind our back: rebuild it
            total = self._usage.initialise(self._eviction.scan_total)
        low = int(cap * _LOW_WATER)
        # Over the cap always evicts; between low water and the cap only while
        # the last scan's list lasts (a fresh scan waits for the cap).
        if total > cap or (total > low and len(self._candidates)):
            self._eviction.evict_batch(total, cap, low, keep=path, extra=_EVICT_EXTRA)

    def _store_oversize(self, path: str, kb: bytes, size: int, cap: int) -> None:
        # Not stored, nothing else evicted; the superseded entry under this
        # key goes, so a reader never gets bytes older than the last store.
        self._remove_counted(path, kb)
        self._counts.skipped_oversize(self, size, cap)

    def _remove_counted(self, path: str, kb: bytes) -> bool:
        """Remove the entry at ``path`` and subtract its bytes, under the counter's lock."""
        with self._usage.hold() as held:
            old = lstat_key(path)
            if old is None or not self._remove(path):
                return False
            held.add(-old.size)
        if self._memo is not None:
            self._memo.discard(kb)
        return True

    def _remove(self, path: str) -> bool:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        except IsADirectoryError:
            raise _not_an_entry(path) from None
        except PermissionError:
            if os.path.isdir(path):  # EPERM: unlink of a directory on some systems
                raise _not_an_entry(path) from None
            raise
        if self._sidecars:
            _scan.remove_sidecar(path)
        return True

    def prune(self, max_bytes: int) -> tuple[int, int]:
        """Evict least recently read entries until at most ``max_bytes`` remain.

        Returns ``(entries removed, bytes removed)``. Stat-guarded like eviction.
        """
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ConfigError(f"max_bytes must be an int >= 0, got {max_bytes!r}")
        return self._eviction.evict_to(max_bytes)

    # -- delete / size ------------------------------------------------------
    def __delitem__(self, key: bytes | str) -> None:
        kb = as_key_bytes(key)
        if not self._remove_counted(self._path_for(kb), kb):
            raise KeyError(key)

    def __len__(self) -> int:
        """Entries this cache would serve: regular files we own (as ``stats().entries``);
        symlinks, non-files and foreign-owned files are refused, so not counted."""
        return len(_scan.scan(self._entries).entries)

    def clear(self) -> None:
        """Remove every entry present at the start; entries rewritten meanwhile stay."""
        if self._memo is not None:
            self._memo.clear()
        with self._usage.hold() as held:
            result = _scan.scan(self._entries)
            freed = 0
            for entry in result.entries:
                outcome = unlink_if_unchanged(entry.path, entry.key, aside_dir=self._tmp)
                if outcome is UnlinkResult.REMOVED:
                    freed += entry.key.size
                if outcome is not UnlinkResult.CHANGED and self._sidecars:
                    _scan.remove_sidecar(entry.path)
            held.add(-freed)
        sweep_stale_temps(self._tmp)

    def stats(self) -> CacheStats:
        result = _scan.scan(self._entries)
        return self._counts.snapshot(len(result.entries), result.total_bytes)

    # -- administration (CLI) -----------------------------------------------
    def iter_entries(self) -> Iterator[EntryInfo]:
        """Every entry, least recently read first."""
        result = _scan.scan(self._entries)
        for e in sorted(result.entries, key=lambda e: e.atime_ns):
            yield EntryInfo(os.path.basename(e.path), e.key.size, e.atime_ns, e.key.mtime_ns)

    def verify(self, *, progress: Callable[[int], None] | None = None) -> VerifyReport:
        """Check every entry's bytes against its record; remove the corrupt ones.

        ``progress(1)`` is called once per entry checked (for progress bars).
        """
        return verify_entries(
            self._entries,
            carrier=self._carrier,
            drop_corrupt=self._drop_corrupt,
            drop_outdated=self._drop_outdated,
            progress=progress,
        )

    def __repr__(self) -> str:
        return f"FileStreamProgramCache({str(self._root)!r}, max_size_bytes={self._max})"
