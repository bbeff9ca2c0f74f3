"""A directory of raw compiled binaries, safe to share between threads and processes."""

from __future__ import annotations

import errno
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

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
from nexus_cache.program import _fsscan
from nexus_cache.program._caps import validate_cap
from nexus_cache.program._counters import OpCounters
from nexus_cache.program._evictq import CandidateQueue
from nexus_cache.program._fsevict import FileStreamEviction
from nexus_cache.program._fsverify import verify_entries
from nexus_cache.program._integrity import (
    KEY_DIGEST_SIZE,
    SIDECAR_SUFFIX,
    XATTR_NAME,
    make_record,
    make_sidecar,
    open_entry,
    read_record,
    read_rest,
    record_matches,
    xattrs_supported,
)
from nexus_cache.program._memo import MemoEntry, VerifiedMemo
from nexus_cache.program._paths import default_filestream_root
from nexus_cache.program._report import EntryInfo, VerifyReport
from nexus_cache.program._resource import (
    CacheStats,
    ProgramCacheResource,
    ProgramCacheValue,
    as_key_bytes,
    as_value_bytes,
)
from nexus_cache.program._usage import UsageCounter

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
_sha256 = hashlib.sha256
_close, _read, _fstat = os.close, os.read, os.fstat
_getxattr, _utime, _time_ns = os.getxattr, os.utime, time.time_ns


def _not_an_entry(path: str) -> CacheSecurityError:
    return CacheSecurityError(
        f"{path} is a directory where a cache entry belongs; refusing to touch it. "
        "Remove it (nexus-cache program-cache verify lists such paths)."
    )


def _refuse_foreign_dir(root: Path) -> None:
    """Refuse cuda.core's own cache directory and a lakehouse root: opening either
    would sweep the other cache's temps and mix two layouts that each cache's
    verify and pruning would misjudge (and delete)."""
    from nexus_cache.program._catalog import identify_cache_path

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

    Layout: ``entries/<2 hex>/<SHA-256 of the key, hex>`` holds the binary
    exactly as stored (cuobjdump and nvdisasm read it directly); ``tmp/``
    holds writes in flight; ``usage`` is the shared byte counter.

    Guarantees:

    * Thread- and process-safe. Writes go to a private temp file, are
      fsynced and renamed into place, so a reader sees the old or the new
      entry, never a torn one, and a crash leaves only a temp that the next
      open (or eviction) sweeps.
    * Integrity: a CRC-32 and length ride beside each entry in the
      ``user.nexus.v1`` xattr (a ``.sum`` sidecar where the filesystem has no
      user xattrs). A truncated or bit-flipped entry reads as a miss, is
      removed and is counted in ``stats().corrupt``.
    * LRU by access time: a hit stamps the entry's atime through the open
      fd (same inode, so a concurrent rewrite is never stamped) unless a
      read stamped it less than 1 s ago (so re-reads are ordered to 1 s;
      the first read after a write always promotes); eviction removes the
      least recently read first.
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
        self._uid = os.geteuid()
        self._counts = OpCounters()
        sweep_stale_temps(self._tmp)
        self._xattr = xattrs_supported(self._tmp)
        self._usage = UsageCounter(str(self._root / "usage"))
        self._candidates = CandidateQueue()
        self._eviction = FileStreamEviction(
            self._root,
            self._entries,
            self._tmp,
            usage=self._usage,
            candidates=self._candidates,
            counts=self._counts,
            sidecars=not self._xattr,
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
    def uses_xattrs(self) -> bool:
        """Whether integrity records live in xattrs (else in ``.sum`` sidecars)."""
        return self._xattr

    def _path_for(self, kb: bytes) -> str:
        h = _sha256(kb).hexdigest()
        return self._prefix + h[:2] + "/" + h

    # -- read ---------------------------------------------------------------
    def __getitem__(self, key: bytes | str) -> bytes:
        kb = key if key.__class__ is bytes else as_key_bytes(key)
        memo = self._memo
        if memo is not None:
            # Keyed by the key itself: a repeat hit hashes nothing.
            entry = memo.get(kb)  # type: ignore[arg-type]
            if entry is not None:
                data = self._memo_hit(memo, kb, entry)  # type: ignore[arg-type]
                if data is not None:
                    self._counts.hit()
                    return data
        digest = _sha256(kb).digest()  # type: ignore[arg-type]
        h = digest.hex()
        path = self._prefix + h[:2] + "/" + h
        try:
            fd = open_entry(path)
        except FileNotFoundError:
            self._count_miss()
            raise KeyError(key) from None
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
            if self._xattr:
                try:
                    record: bytes = _getxattr(fd, XATTR_NAME)
                except OSError:
                    record = b""  # nothing vouches for the bytes: corrupt
            else:
                sidecar = read_record(fd, path, st.st_ino, False)
                if sidecar is None:
                    self._count_miss()
                    raise KeyError(key)
                record = sidecar
            if not record_matches(record, data, digest[:KEY_DIGEST_SIZE]):
                self._drop_corrupt(path, st, kb)  # type: ignore[arg-type]
                raise KeyError(key)
            now = _time_ns()
            atime = st.st_atime_ns
            if atime <= st.st_mtime_ns or not 0 <= now - atime < _STAMP_WINDOW_NS:
                # Same inode as the fstat above, so a rewriter's fresh file is
                # never stamped; mtime is kept so stat guards elsewhere stay valid.
                _utime(fd, ns=(now, st.st_mtime_ns))
                stamped = True
            else:
                stamped = False
            if memo is not None and memo.second_read(kb, (st.st_ino, size, st.st_mtime_ns)):
                # our own stamp moved the ctime
                ctime = _fstat(fd).st_ctime_ns if stamped else st.st_ctime_ns
                memo.put(kb, MemoEntry(path, st.st_ino, size, st.st_mtime_ns, ctime, data))
        finally:
            _close(fd)
        self._counts.hit()
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
            # Path-based, guarded by the lstat just above: if a rewrite lands in
            # between, its fresh file gets our atime and the old mtime, which
            # no guard or memo mistakes for the old file (they compare inodes).
            try:
                os.utime(path, ns=(now, entry.mtime_ns), follow_symlinks=False)
                after = os.lstat(path)
            except FileNotFoundError:
                memo.discard(kb)  # deleted after our lstat: this read happened before that
                return entry.data
            if after.st_ino == entry.ino:
                entry.ctime_ns = after.st_ctime_ns  # our stamp moved it
            else:
                memo.discard(kb)
        return entry.data

    def _count_miss(self) -> None:
        self._counts.miss()

    def _drop_corrupt(self, path: str, st: os.stat_result, kb: bytes | None = None) -> None:
        # Without the key (verify) the memo is left alone: its lstat guard
        # sees the removal on the next hit.
        if self._memo is not None and kb is not None:
            self._memo.discard(kb)
        self._counts.miss(corrupt=1)
        with self._usage.hold() as held:
            outcome = unlink_if_unchanged(path, stat_key(st), aside_dir=self._tmp)
            if outcome is UnlinkResult.REMOVED:
                held.add(-st.st_size)
        if outcome is UnlinkResult.REMOVED and not self._xattr:
            _fsscan.remove_sidecar(path)

    # -- write ---------------------------------------------------------------
    def __setitem__(self, key: bytes | str, value: ProgramCacheValue) -> None:
        kb = key if key.__class__ is bytes else as_key_bytes(key)
        data = value if value.__class__ is bytes else as_value_bytes(value)
        digest = _sha256(kb).digest()  # type: ignore[arg-type]
        h = digest.hex()
        path = self._prefix + h[:2] + "/" + h
        size = len(data)  # type: ignore[arg-type]
        cap = self._max
        if cap is not None and size > cap:
            self._store_oversize(path, kb, size, cap)  # type: ignore[arg-type]
            return
        xattr = (XATTR_NAME, make_record(data, digest[:KEY_DIGEST_SIZE])) if self._xattr else None  # type: ignore[arg-type]
        # The bytes are written and fsynced before any lock is taken.
        tmp, ino = stage_temp(self._tmp, data, xattr=xattr, want_inode=not self._xattr)  # type: ignore[arg-type]
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
        if not self._xattr:
            sidecar = make_sidecar(ino, data, digest[:KEY_DIGEST_SIZE])  # type: ignore[arg-type]
            atomic_write(path + SIDECAR_SUFFIX, sidecar, tmp_dir=self._tmp)
        if self._memo is not None:
            self._memo.discard(kb)  # type: ignore[arg-type]
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
        if not self._xattr:
            _fsscan.remove_sidecar(path)
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
        return len(_fsscan.scan(self._entries).entries)

    def clear(self) -> None:
        """Remove every entry present at the start; entries rewritten meanwhile stay."""
        if self._memo is not None:
            self._memo.clear()
        with self._usage.hold() as held:
            result = _fsscan.scan(self._entries)
            freed = 0
            for entry in result.entries:
                outcome = unlink_if_unchanged(entry.path, entry.key, aside_dir=self._tmp)
                if outcome is UnlinkResult.REMOVED:
                    freed += entry.key.size
                if outcome is not UnlinkResult.CHANGED and not self._xattr:
                    _fsscan.remove_sidecar(entry.path)
            held.add(-freed)
        sweep_stale_temps(self._tmp)

    def stats(self) -> CacheStats:
        result = _fsscan.scan(self._entries)
        return self._counts.snapshot(len(result.entries), result.total_bytes)

    # -- administration (CLI) -----------------------------------------------
    def iter_entries(self) -> Iterator[EntryInfo]:
        """Every entry, least recently read first."""
        result = _fsscan.scan(self._entries)
        for e in sorted(result.entries, key=lambda e: e.atime_ns):
            yield EntryInfo(os.path.basename(e.path), e.key.size, e.atime_ns, e.key.mtime_ns)

    def verify(self, *, progress: Callable[[int], None] | None = None) -> VerifyReport:
        """Check every entry's bytes against its record; remove the corrupt ones.

        ``progress(1)`` is called once per entry checked (for progress bars).
        """
        return verify_entries(
            self._entries, xattr=self._xattr, drop_corrupt=self._drop_corrupt, progress=progress
        )

    def __repr__(self) -> str:
        return f"FileStreamProgramCache({str(self._root)!r}, max_size_bytes={self._max})"
