"""The GPU engine of :func:`~nexus_cache.frames.decode_parquet`: which columns
the page decoder takes, and their device columns.

``NEXUS_DECODE_ENGINE`` (or the ``engine`` argument) chooses: ``host`` (the
default) decodes every column on the host threads; ``gpu`` decodes every
supported column chunk with the page-decode kernels
(:mod:`nexus_cache.frames.gpudecode`) and refuses a domain that is not a
CUDA one; ``auto`` does the same where it can (the domain's memory is device
memory and CuPy imports) and decodes on the host otherwise, and also leaves
to the host a column whose pages nvCOMP would decompress unchecked (Zstd,
Gzip) or could not decompress at all (:func:`_auto_reason`), and a file
whose row group needs more heap than a limited domain leaves a decode
(:func:`_too_large_for`). A column goes
to the GPU only when every chunk of it that the read covers is supported
(footer and page headers agree, see ``gpudecode.support``); otherwise the
host decodes it, and ``DecodeStats.paths`` says why. The pages of a GPU
column are decompressed on the device by nvCOMP (the ``gpudecode`` extra);
under ``gpu``, where nvCOMP does not import or lacks the codec, on the host,
and the column's path says ``"gpu (host decompression)"``. Device columns
are allocated in the decode's domain. Thread-safe: a call keeps its state in
its own objects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from nexus_cache._env import parse_choice, raw, read
from nexus_cache._sizes import format_size
from nexus_cache.errors import BackendUnavailableError
from nexus_cache.frames._builder import check_dictionary_length
from nexus_cache.frames._variables import DECODE_ENGINE, ENGINES
from nexus_cache.frames.column import ColumnKind, DeviceColumn, column_kind, storage_dtype
from nexus_cache.frames.frame import _to_host
from nexus_cache.frames.gpudecode.device import DeviceChunk, decode_chunks_on_device, mergeable
from nexus_cache.frames.gpudecode.nvcomp import device_algorithm
from nexus_cache.frames.gpudecode.pages import ChunkSpec, Page, chunk_specs, read_pages
from nexus_cache.frames.gpudecode.stream_check import CHECK_KERNELS
from nexus_cache.frames.gpudecode.support import unsupported_reason

__all__ = [
    "ENGINES",
    "ENV_DECODE_ENGINE",
    "PagePlan",
    "decode_page_columns",
    "engine_setting",
    "join_chunks",
    "plan_page_columns",
    "preload_decode_kernels",
]

ENV_DECODE_ENGINE = DECODE_ENGINE.name

ChunkDecoder = Callable[[Any, ChunkSpec, Any, Sequence[Page]], DeviceChunk]


def engine_setting(engine: str | None) -> tuple[str, str]:
    """``(engine, shown)``: the validated engine (the argument, else
    ``NEXUS_DECODE_ENGINE``, else ``host``) and the setting that chose it."""
    if engine is None:
        text = raw(DECODE_ENGINE)
        if text is None:
            return str(read(DECODE_ENGINE)), "the default"
        return str(read(DECODE_ENGINE)), f"{ENV_DECODE_ENGINE}={text!r}"
    return parse_choice(engine, "engine", ENGINES), f"engine={engine!r}"


def _auto_reason(spec: ChunkSpec) -> str | None:
    """Why ``auto`` leaves a chunk to the host although the GPU engine could
    decode it, or None: its pages would reach nvCOMP unchecked (Zstd, Gzip:
    nvCOMP's decompressors of those assume valid input), or be decompressed
    on the host for the GPU (nvCOMP missing or without the codec), which is
    slower than the host engine's threads."""
    if spec.codec == "UNCOMPRESSED":
        return None
    algorithm = device_algorithm(spec.codec)
    if algorithm is None:
        return f"codec {spec.codec} is not decompressed by nvCOMP here (engine gpu takes it)"
    if algorithm not in CHECK_KERNELS:
        return (
            f"codec {spec.codec} is not checked before nvCOMP reads it "
            "(engine gpu takes it, for trusted files)"
        )
    return None


def _device_reason(domain: Any) -> str | None:
    """Why the kernels cannot run for ``domain``, or None."""
    if domain.host_memory:
        return "the domain's memory is host memory"
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "CuPy does not import"
    return None


def preload_decode_kernels(domain: Any, engine: str | None = None) -> list[Any] | None:
    """Load every page-decode kernel on the current device when the engine
    (``engine``, else ``NEXUS_DECODE_ENGINE``) would run them for ``domain``:
    the ``KernelLoad`` of each kernel this call loaded. None when the engine
    decodes on the host there (``host``, or ``auto`` without a CUDA domain);
    ``gpu`` without one raises BackendUnavailableError, as a decode would."""
    value, shown = engine_setting(engine)
    if value == "host":
        return None
    reason = _device_reason(domain)
    if reason is not None:
        if value == "gpu":
            raise BackendUnavailableError(
                f"{shown} needs a CUDA allocation domain and CuPy, but {reason}; "
                f"set {ENV_DECODE_ENGINE} to auto or host"
            )
        return None
    from nexus_cache.frames.gpudecode.kernels import preload_kernels

    return preload_kernels()


@dataclass
class PagePlan:
    """The columns the page decoder takes (name -> its chunks, one per row group,
    as (bytes, spec, pages)) and every column's path for ``DecodeStats.paths``:
    ``"gpu"``, ``"gpu (host decompression)"`` (nvCOMP missing, or lacking the
    codec), or ``"host: "`` and the reason. The pages of ``gpu`` are those
    :func:`plan_page_columns` checked supported: :func:`decode_page_columns`
    does not check them again."""

    gpu: dict[str, list[tuple[Any, ChunkSpec, Sequence[Page]]]] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)


def _column_reason(
    pf: pq.ParquetFile,
    buffer: Any,
    groups: Sequence[int],
    f: pa.Field,
    source: str,
    auto: bool = False,
) -> tuple[str | None, list[tuple[Any, ChunkSpec, Sequence[Page]]]]:
    leaves = [j for j in range(len(pf.schema)) if pf.schema.column(j).path.split(".")[0] == f.name]
    if len(leaves) != 1 or pf.schema.column(leaves[0]).path != f.name:
        return "nested column", []
    chunks: list[tuple[Any, ChunkSpec, Sequence[Page]]] = []
    for g, spec in zip(groups, chunk_specs(pf, groups, leaves[0], source), strict=True):
        if spec.arrow_type != f.type:
            return f"read as {f.type}", []
        why = _auto_reason(spec) if auto else None
        if why is not None:
            return f"{why} in row group {g}", []
        data = memoryview(buffer)[spec.start : spec.start + spec.size]
        pages = read_pages(data, spec)
        reason = unsupported_reason(spec, pages)
        if reason is not None:
            return f"{reason} in row group {g}", []
        chunks.append((data, spec, pages))
    return None, chunks


def _gpu_path(chunks: Sequence[tuple[Any, ChunkSpec, Sequence[Page]]]) -> str:
    """``gpu``, or ``gpu (host decompression)`` when a chunk's pages cannot be
    decompressed on the device."""
    for _, spec, _ in chunks:
        if spec.codec != "UNCOMPRESSED" and device_algorithm(spec.codec) is None:
            return "gpu (host decompression)"
    return "gpu"


def plan_page_columns(
    engine: str | None,
    domain: Any,
    pf: pq.ParquetFile,
    buffer: Any,
    groups: Sequence[int],
    schema: pa.Schema,
    source: str,
) -> PagePlan:
    """Which columns of ``schema`` the page decoder takes, from the footer and
    the page headers of ``buffer`` (the whole file's bytes; None for a streamed
    source). Raises ConfigError for an unknown engine and BackendUnavailableError
    for ``gpu`` where the kernels cannot run."""
    value, shown = engine_setting(engine)
    plan = PagePlan()
    reason = f"engine host, {shown}" if value == "host" else _device_reason(domain)
    if reason is not None and value == "gpu":
        raise BackendUnavailableError(
            f"{shown} needs a CUDA allocation domain and CuPy, but {reason}; "
            f"set {ENV_DECODE_ENGINE} to auto or host"
        )
    if reason is None and buffer is None:
        reason = "the source is streamed, not mapped"
    for f in schema:
        why, chunks = (
            (reason, [])
            if reason
            else _column_reason(pf, buffer, groups, f, source, auto=value == "auto")
        )
        if why is None and groups:
            plan.gpu[f.name] = chunks
            plan.paths[f.name] = _gpu_path(chunks)
        else:
            plan.paths[f.name] = f"host: {why or 'no row groups'}"
    too_large = _too_large_for(domain, plan, groups) if value == "auto" else None
    if too_large is not None:
        # auto never needs more device memory than the host engine would
        for name in plan.gpu:
            plan.paths[name] = f"host: {too_large}"
        plan.gpu.clear()
    return plan


def _heap_room(domain: Any) -> int | None:
    """The most heap bytes a decode into ``domain`` may hold at once where memory
    bounds it: an eighth of a limited domain (a cache cap, a grant), a quarter
    of the device's free memory; None where neither is known."""
    limit = getattr(domain, "limit_bytes", None)
    free = _free_device_bytes()
    bounds = [
        b
        for b in (limit // 8 if limit else None, None if free is None else free // 4)
        if b is not None
    ]
    return min(bounds) if bounds else None


def _too_large_for(domain: Any, plan: PagePlan, groups: Sequence[int]) -> str | None:
    """Why ``auto`` leaves the plan's GPU columns to the host: a row group whose
    chunks of them need more heap than :func:`_heap_room` allows (the GPU engine
    decodes such a row group alone, in a heap the domain may not hold, where the
    host engine needs room for the decoded columns only); else None."""
    if not plan.gpu:
        return None
    room = _heap_room(domain)
    if room is None:
        return None
    for k, g in enumerate(groups):
        need = sum(
            chunks[k][1].size + chunks[k][1].uncompressed_size for chunks in plan.gpu.values()
        )
        if need > room:
            return (
                f"row group {g} needs {format_size(need)} of device memory to decode "
                f"on the GPU, more than this domain leaves a decode ({format_size(room)}); "
                "engine gpu takes it"
            )
    return None


def _same_as_before(domain: Any, dictionaries: Sequence[DeviceChunk]) -> list[bool]:
    """Whether each dictionary equals the one before it (the first: False),
    compared on the device and read back in one copy."""
    same = [False] * len(dictionaries)
    pairs = [
        k
        for k in range(1, len(dictionaries))
        if dictionaries[k].length == dictionaries[k - 1].length
        and int(dictionaries[k].data.size) == int(dictionaries[k - 1].data.size)
    ]
    if not pairs:
        return same
    flags = []
    with domain.scope():  # the comparisons' temporaries are the domain's too
        for k in pairs:
            a, b = dictionaries[k - 1], dictionaries[k]
            flags.append(((a.offsets == b.offsets).all() & (a.data == b.data).all()).reshape(1))
        equal = _to_host(domain.xp.concatenate(flags))
    for k, flag in zip(pairs, equal, strict=True):
        same[k] = bool(flag)
    return same


def _dictionaries(
    domain: Any, f: pa.Field, chunks: Sequence[DeviceChunk]
) -> tuple[DeviceColumn, list[int]]:
    """The dictionary of a dictionary column ``f`` joined from its chunks' as the
    host path joins them (a chunk whose dictionary equals the one before it
    reuses it; otherwise its dictionary is appended), and the shift of each
    chunk's indices (past the dictionaries before its own)."""
    dictionaries = [c.dictionary for c in chunks if c.dictionary is not None]
    assert len(dictionaries) == len(chunks), "every chunk of a dictionary column has one"
    kept: list[DeviceChunk] = []
    bases: list[int] = []
    length = base = 0
    for d, same in zip(dictionaries, _same_as_before(domain, dictionaries), strict=True):
        if not same:
            base = length
            kept.append(d)
            length += d.length
        bases.append(base)
    check_dictionary_length(f, length)
    return join_chunks(domain, pa.field("values", f.type.value_type), kept), bases


def join_chunks(domain: Any, f: pa.Field, chunks: Sequence[DeviceChunk]) -> DeviceColumn:
    """One column of ``f`` from its chunks in row order, allocated in ``domain``
    (one chunk is used as it is; string offsets are rebased past the chunks
    before; a dictionary column's dictionaries are joined as the host path
    joins them, its indices shifted to match)."""
    kind = column_kind(f.type, f.name)
    dictionary, bases = None, [0] * len(chunks)
    if kind is ColumnKind.DICTIONARY:
        dictionary, bases = _dictionaries(domain, f, chunks)
    if len(chunks) == 1:
        c = chunks[0]
        return DeviceColumn(f, c.length, c.data, c.offsets, c.validity, dictionary)
    rows = sum(c.length for c in chunks)
    with domain.scope():
        validity = None
        if any(c.validity is not None for c in chunks):
            validity = domain.empty(rows, np.dtype(np.bool_))
        offsets = None
        if kind is ColumnKind.BINARY:
            offsets = domain.empty(rows + 1, storage_dtype(f.type))
            offsets[:1] = 0
            data = domain.empty(sum(int(c.data.size) for c in chunks), np.dtype(np.uint8))
        elif kind is ColumnKind.DICTIONARY:
            data = domain.empty(rows, np.dtype(f.type.index_type.to_pandas_dtype()))
        else:
            data = domain.empty(rows, storage_dtype(f.type))
        row = base = 0
        for c, shift in zip(chunks, bases, strict=True):
            n = c.length
            if validity is not None:
                validity[row : row + n] = True if c.validity is None else c.validity
            if offsets is not None:
                size = int(c.data.size)
                offsets[row + 1 : row + n + 1] = c.offsets[1:] + offsets.dtype.type(base)
                data[base : base + size] = c.data
                base += size
            else:
                data[row : row + n] = c.data
                if shift and n:
                    data[row : row + n] += data.dtype.type(shift)
            row += n
    return DeviceColumn(f, rows, data, offsets, validity, dictionary)


#: Row groups are decoded together, one heap for several, until their chunks
#: hold this many bytes (compressed and decompressed, what the heap takes):
#: each heap costs a few reads back, one stream check and one nvCOMP call
#: per codec, and one round of launches per column (its chunks of the heap's
#: row groups decoded as one), so the fewer heaps the better: every page of a
#: batch is walked, decompressed and decoded by the same launches, which
#: keeps the device busy where one row group's pages would not. A row group
#: larger than this is decoded alone. A domain with a limit gets at most an
#: eighth of it, and no heap takes more than a quarter of the device's free
#: memory.
HEAP_BATCH_BYTES = 4 << 30


def _free_device_bytes() -> int | None:
    """The current device's free memory, or None where CuPy cannot say."""
    try:
        import cupy

        return int(cupy.cuda.runtime.memGetInfo()[0])
    except (ImportError, AttributeError, RuntimeError):
        return None


def _batches(
    row_groups: Sequence[list[tuple[Any, ChunkSpec, Sequence[Page]]]], budget: int
) -> list[list[list[tuple[Any, ChunkSpec, Sequence[Page]]]]]:
    """Consecutive row groups (each its chunks) in batches of at most ``budget``
    bytes of heap, one row group at least."""
    out: list[list[list[tuple[Any, ChunkSpec, Sequence[Page]]]]] = []
    held = 0
    for row_group in row_groups:
        size = sum(spec.size + spec.uncompressed_size for _, spec, _ in row_group)
        if out and held + size <= budget:
            out[-1].append(row_group)
            held += size
        else:
            out.append([row_group])
            held = size
    return out


def decode_page_columns(
    plan: PagePlan,
    schema: pa.Schema,
    domain: Any,
    decode: ChunkDecoder | None = None,
    transfer: Any = None,
    stages: dict[str, float] | None = None,
) -> dict[str, DeviceColumn]:
    """The device column of every column the plan gives the page decoder.

    By default consecutive row groups' chunks are decoded together, up to
    :data:`HEAP_BATCH_BYTES` at a time (:func:`decode_chunks_on_device`: one
    heap, its pieces copied through ``transfer``'s pinned staging when given,
    one nvCOMP call per codec with one codec per algorithm for the whole
    call, each column's chunks of the batch decoded as one where
    :func:`~.gpudecode.device.mergeable` allows; its stage times added to
    ``stages`` when given); ``decode`` decodes one chunk at a time instead."""
    names = [f.name for f in schema if f.name in plan.gpu]
    pieces: dict[str, list[DeviceChunk]] = {name: [] for name in names}
    if decode is None and names:  # (no column for the GPU: nothing to size, no CuPy to ask)
        codecs: dict[Any, Any] = {}  # one nvCOMP codec per algorithm for the whole file
        groups = len(plan.gpu[names[0]])
        # a small domain (a cache cap, a grant) takes no more than an eighth
        # of itself in one heap
        room = _heap_room(domain)
        budget = HEAP_BATCH_BYTES if room is None else min(HEAP_BATCH_BYTES, room)
        row_groups = [[plan.gpu[name][k] for name in names] for k in range(groups)]
        for batch in _batches(row_groups, budget):
            # items row group by row group; each column's chunks of the batch
            # decoded as one where they may be (one round of launches a column)
            owners: list[str] = []
            columns: list[list[int]] = []
            for j, name in enumerate(names):
                mine = [k * len(names) + j for k in range(len(batch))]
                if mergeable([row_group[j][1] for row_group in batch]):
                    columns.append(mine)
                else:
                    columns.extend([i] for i in mine)
                owners.extend([name] * (len(columns) - len(owners)))
            got = decode_chunks_on_device(
                [c for row_group in batch for c in row_group],
                domain,
                transfer,
                stages,
                codecs,
                columns=columns,
                checked=True,  # plan_page_columns checked these pages
            )
            for name, piece in zip(owners, got, strict=True):
                pieces[name].append(piece)
    elif decode is not None:
        for name in names:
            pieces[name] = [
                decode(data, spec, domain, pages) for data, spec, pages in plan.gpu[name]
            ]
    out: dict[str, DeviceColumn] = {}
    for f in schema:
        if f.name in pieces:
            out[f.name] = join_chunks(domain, f, pieces.pop(f.name))
    return out
