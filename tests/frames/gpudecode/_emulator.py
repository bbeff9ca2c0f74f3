"""A host stand-in for the device, to run the device decoder's orchestration
(``gpudecode.device``: heap layout, page tables, groups, launches, reads
back) on a machine without a GPU.

``fake_cupy`` is NumPy whose arrays have CuPy's ``.get()``; ``KERNELS`` are
line-for-line Python ports of the CUDA kernels of ``gpudecode.kernels``
(one loop iteration per GPU thread; for the kernels that walk a page or a
stream, one per block, tile by tile as the kernel loads them: set
:data:`TILE_BYTES` here to walk in other tiles), taking the same arguments. The real
kernels run on a GPU in ``tests/gpu/test_gpudecode_gpu.py``; this checks
that the host side drives them with the right tables.

Each launch is checked as strictly as the GPU would need it, so the class of
bugs a Python port would hide fails here instead (:class:`LaunchError`):
every argument against the kernel's C signature (parsed from its source: a
pointer takes a contiguous device array of exactly that element type, a
scalar exactly that NumPy scalar type), the grid (at least one block, in
range, and covering every item in a kernel without a grid-stride loop),
and every index the ports take of a pointer argument (within the array; a
``const`` pointer is read-only), where NumPy would wrap a negative index or
clip a slice silently.
"""

from __future__ import annotations

import contextlib
import re
import weakref
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa

from nexus_cache.frames.gpudecode._inflated import inflated_size
from nexus_cache.frames.gpudecode._tile import TILE_BYTES
from nexus_cache.frames.gpudecode.kernels import kernel_source
from nexus_cache.frames.gpudecode.nvcomp import (
    ALIGNMENT,
    NvcompRefused,
    input_alignment,
    refuse_wrong_sizes,
)

#: reads back from the "device" so far (each ``get``: one copy, one wait)
READS = [0]

#: nvCOMP's algorithm -> PyArrow's codec of the same raw stream (nvCOMP's
#: stand-in on the host)
PYARROW_CODEC = {"Snappy": "snappy", "Zstd": "zstd", "LZ4": "lz4_raw", "Gzip": "gzip"}


def decompress_like_nvcomp(
    heap: Any, algorithm: str, jobs: Any, where: str, codecs: Any = None
) -> None:
    """nvCOMP's batched decompression of ``jobs`` within ``heap``, by PyArrow
    (each input at its algorithm's input alignment, where it lies in the
    file's image or copied, and each output at :data:`.nvcomp.ALIGNMENT`, as
    the heap layout places them):
    a stream the codec refuses raises NvcompRefused, as nvCOMP's error does, and
    the size each page really decompressed to (what nvCOMP reports) is checked
    against its header's as ``nvcomp.decompress_batch`` checks nvCOMP's."""
    sizes = []
    for source, size, out, want in jobs:
        assert source % input_alignment(algorithm) == 0
        assert out % ALIGNMENT == 0
        codec = PYARROW_CODEC[algorithm]
        stream = bytes(heap[source : source + size])
        try:
            got = pa.decompress(stream, want, codec=codec)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise NvcompRefused(f"{where}: {algorithm} pages failed ({exc})") from exc
        heap[out : out + want] = np.frombuffer(got.to_pybytes(), np.uint8)
        sizes.append(inflated_size(memoryview(stream), want, codec))
    refuse_wrong_sizes(algorithm, jobs, sizes, where)


class Array(np.ndarray):
    """A NumPy array with CuPy's ``get`` (counted in :data:`READS`)."""

    def get(self) -> np.ndarray:
        READS[0] += 1
        return np.asarray(self).copy()


#: the domains whose scope is entered, innermost last (they charge what is made)
_SCOPES: list[Domain] = []


def _wrap(a: Any) -> Array:
    """A new device array of ``a``'s values: an allocation of its own (its views
    keep it alive, as a CuPy array's keep its memory), charged to the domain
    whose scope is entered."""
    values = np.asarray(a)
    out = Array(values.shape, values.dtype)
    out[...] = values
    if _SCOPES:
        _SCOPES[-1].charge(out)
    return out


fake_cupy = SimpleNamespace(
    zeros=lambda n, dtype=float: _wrap(np.zeros(n, dtype)),
    ones=lambda n, dtype=float: _wrap(np.ones(n, dtype)),
    asarray=lambda a: _wrap(np.array(a)),
    arange=lambda n, dtype=None: _wrap(np.arange(n, dtype=dtype)),
    cumsum=lambda a, dtype=None: _wrap(np.cumsum(a, dtype=dtype)),
    concatenate=lambda arrays: _wrap(np.concatenate(arrays)),
    # the host has no stream to wait for
    cuda=SimpleNamespace(get_current_stream=lambda: SimpleNamespace(synchronize=lambda: None)),
)


class Domain:
    """What the device decoder and the column assembly ask of an allocation
    domain, on the emulated device (``limit_bytes``: the domain's limit).
    Every array the emulated CuPy makes inside :meth:`scope` is charged until
    the last reference to it (or a view of it) goes: :meth:`used_bytes`."""

    #: a device domain (the GPU engine takes it), its array module the emulated CuPy
    host_memory = False
    xp = fake_cupy

    def __init__(self, limit_bytes: int | None = None) -> None:
        self.limit_bytes = limit_bytes
        self._used = 0

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        _SCOPES.append(self)
        try:
            yield
        finally:
            _SCOPES.pop()

    def charge(self, array: Array) -> None:
        self._used += array.nbytes
        weakref.finalize(array, self._free, array.nbytes)

    def _free(self, nbytes: int) -> None:
        self._used -= nbytes

    def used_bytes(self) -> int:
        return self._used

    def empty(self, n: int, dtype: Any) -> Any:
        return fake_cupy.zeros(n, dtype)


def _last_at_most(starts: np.ndarray, n: int, x: int) -> int:
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if starts[mid] <= x:
            lo = mid
        else:
            hi = mid
    return lo


def hybrid_runs(
    data, start, end, bit_width, count, run_base, r_start, r_packed, r_value, r_count, error, n
):
    for s in range(int(n)):
        bw, e, want = int(bit_width[s]), int(end[s]), int(count[s])
        base, capacity = int(run_base[s]), int(end[s] - start[s] + 1)
        pos, done, runs = int(start[s]), 0, 0
        r_count[s] = 0
        if bw < 0 or bw > 32:
            error[0] = 1
            continue
        value_bytes = (bw + 7) // 8
        ok = True
        while done < want and ok:
            header = shift = 0
            while True:
                if pos >= e or shift >= 35:
                    ok = False
                    break
                b = int(data[pos])
                pos += 1
                header |= (b & 0x7F) << shift
                if not b & 0x80:
                    break
                shift += 7
            if not ok:
                break
            if header >> 32:
                ok = False
                break
            if header & 1:
                groups = header >> 1
                if groups == 0 or groups > ((1 << 31) - 1) // 8:
                    ok = False
                    break
                size, length = groups * bw, groups * 8
                if size > e - pos:
                    size = e - pos
                    length = size * 8 // bw
                    if length <= (groups - 1) * 8:
                        ok = False
                        break
                take = min(length, want - done)
                run = (done, 1, pos)
                pos += size
            else:
                length = header >> 1
                if length == 0:
                    ok = False
                    break
                take = min(length, want - done)
                if pos + value_bytes > e:
                    ok = False
                    break
                value = sum(int(data[pos + k]) << (8 * k) for k in range(value_bytes))
                if value >> bw:
                    ok = False
                    break
                run = (done, 0, value)
                pos += value_bytes
            if take:
                if runs >= capacity:
                    ok = False
                    break
                r_start[base + runs], r_packed[base + runs], r_value[base + runs] = run
                runs += 1
            done += take
        if not ok:
            error[0] = 1
            continue
        r_count[s] = runs


def hybrid_expand(
    data, size, out_base, n, run_base, r_count, r_start, r_packed, r_value, widths, out, total
):
    for i in range(int(total)):
        lo = _last_at_most(out_base, int(n), i)
        local = i - int(out_base[lo])
        first = int(run_base[lo])
        r = first + _last_at_most(r_start[first:], int(r_count[lo]), local)
        bw = int(widths[lo])
        if not r_packed[r]:
            value = int(r_value[r])
        elif bw == 0:
            value = 0
        else:
            bit = int(r_value[r]) * 8 + (local - int(r_start[r])) * bw
            byte = bit >> 3
            window = sum(int(data[byte + k]) << (8 * k) for k in range(8) if byte + k < int(size))
            value = (window >> (bit & 7)) & ((1 << bw) - 1)
        out[i] = value & 0xFFFFFFFF


def levels_validity(levels, max_def, valid, error, n):
    for i in range(int(n)):
        if levels[i] > max_def:
            error[0] = 1
        valid[i] = levels[i] == max_def


def plain_fixed(heap, page_values, dense_base, n_pages, dense, total):
    width = dense.dtype.itemsize
    for k in range(int(total)):
        lo = _last_at_most(dense_base, int(n_pages), k)
        src = int(page_values[lo]) + (k - int(dense_base[lo])) * width
        value = bytes(heap[src : src + width])
        dense[k] = np.frombuffer(value, dense.dtype)[0]


def dict_gather(indices, dictionary, first, base, size, n_pages, dense, error, total):
    for k in range(int(total)):
        p = _last_at_most(first, int(n_pages), k)
        if indices[k] >= size[p]:
            error[0] = 1
            dense[k] = 0
            continue
        dense[k] = dictionary[int(base[p]) + int(indices[k])]


def dict_strings(
    indices, d_start, d_length, first, base, size, n_pages, starts, lengths, error, total
):
    for k in range(int(total)):
        p = _last_at_most(first, int(n_pages), k)
        if indices[k] >= size[p]:
            error[0] = 1
            starts[k] = lengths[k] = 0
            continue
        at = int(base[p]) + int(indices[k])
        starts[k], lengths[k] = d_start[at], d_length[at]


class Tile:
    """The kernels' ``Tile`` (``_tile.py``): bytes ``[t0, t1)`` of ``data``
    (offset by ``base``) copied as ``load_tile`` copies them, every other byte
    read from ``data`` itself (bounded, as on the GPU)."""

    def __init__(self, data: Any, base: int, t0: int, t1: int) -> None:
        self.data, self.base, self.t0, self.t1 = data, base, t0, t1
        self.shared = np.array(data[base + t0 : base + t1]) if t1 > t0 else np.zeros(0, np.uint8)
        assert self.shared.size <= TILE_BYTES

    def byte_at(self, pos: int) -> int:
        if self.t0 <= pos < self.t1:
            return int(self.shared[pos - self.t0])
        return int(self.data[self.base + pos])


def plain_lengths(heap, p_start, p_end, dense_base, p_count, starts, lengths, error, n):
    for p in range(int(n)):  # one block per page
        end, base, count = int(p_end[p]), int(dense_base[p]), int(p_count[p])
        pos, k = int(p_start[p]), 0
        nxt = pos if count else -1
        while nxt >= 0:  # one tile at a time
            t0 = nxt
            t1 = min(t0 + TILE_BYTES, end)
            t = Tile(heap, 0, t0, t1)
            over = False
            while k < count and (pos < t1 or t1 == end):
                if pos + 4 > end:
                    error[0] = 1
                    over = True
                    break
                length = sum(t.byte_at(pos + j) << (8 * j) for j in range(4))
                if pos + 4 + length > end:
                    error[0] = 1
                    over = True
                    break
                starts[base + k], lengths[base + k] = pos + 4, length
                pos += 4 + length
                k += 1
            nxt = -1 if over or k == count else pos


def scatter_values(valid, position, dense, out, n):
    for r in range(int(n)):
        out[r] = dense[position[r]] if valid[r] else 0


def copy_strings(heap, row_start, offsets, out, n):
    for r in range(int(n)):
        a, b = int(offsets[r]), int(offsets[r + 1])
        out[a:b] = heap[int(row_start[r]) : int(row_start[r]) + b - a]


WALKING, VALID, REFUSED = 0, 1, 2


class Walk(SimpleNamespace):
    """The kernels' ``Walk``: pos, produced, want, begun."""


def _snappy_step(w: Walk, t: Tile, end: int) -> int:
    pos, want, produced = w.pos, w.want, w.produced
    if not w.begun:  # the preamble: a varint of at most 5 bytes
        length = shift = 0
        while True:
            if pos >= end or shift > 28:
                return REFUSED
            b = t.byte_at(pos)
            pos += 1
            length |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
        if length != want:
            return REFUSED
        w.begun, w.pos = True, pos
        return WALKING
    if pos >= end:
        return VALID if produced == want else REFUSED
    tag = t.byte_at(pos)
    pos += 1
    kind = tag & 3
    if kind == 0:
        length = (tag >> 2) + 1
        if length > 60:
            extra = length - 60
            if end - pos < extra:
                return REFUSED
            length = sum(t.byte_at(pos + k) << (8 * k) for k in range(extra)) + 1
            pos += extra
        if length > end - pos or length > want - produced:
            return REFUSED
        pos += length
    else:
        if kind == 1:
            if end - pos < 1:
                return REFUSED
            length = 4 + ((tag >> 2) & 7)
            offset = ((tag >> 5) << 8) | t.byte_at(pos)
            pos += 1
        elif kind == 2:
            if end - pos < 2:
                return REFUSED
            length = (tag >> 2) + 1
            offset = t.byte_at(pos) | t.byte_at(pos + 1) << 8
            pos += 2
        else:
            if end - pos < 4:
                return REFUSED
            length = (tag >> 2) + 1
            offset = sum(t.byte_at(pos + k) << (8 * k) for k in range(4))
            pos += 4
        if offset == 0 or offset > produced or length > want - produced:
            return REFUSED
    w.produced, w.pos = produced + length, pos
    return WALKING


def _check(step, heap, in_start, in_size, out_size, refused, n):
    """``CODEC_check``: one block per section, walked tile by tile."""
    for j in range(int(n)):
        base, end = int(in_start[j]), int(in_size[j])
        w = Walk(pos=0, produced=0, want=int(out_size[j]), begun=False)
        status, nxt = WALKING, 0
        while nxt >= 0:
            t0 = nxt
            t1 = min(t0 + TILE_BYTES, end)
            t = Tile(heap, base, t0, t1)
            while status == WALKING and (w.pos < t1 or t1 == end):
                status = step(w, t, end)
            nxt = w.pos if status == WALKING else -1
            if status != WALKING:
                refused[j] = 0 if status == VALID else 1


def snappy_check(heap, in_start, in_size, out_size, refused, n):
    _check(_snappy_step, heap, in_start, in_size, out_size, refused, n)


def _lz4_extend(t, end, pos, length):
    while True:
        if pos >= end:
            return False, pos, length
        b = t.byte_at(pos)
        pos += 1
        length += b
        if b != 255:
            return True, pos, length


def _lz4_step(w: Walk, t: Tile, end: int) -> int:
    pos, want, produced = w.pos, w.want, w.produced
    if want == 0:
        return VALID if end == 1 and t.byte_at(0) == 0 else REFUSED
    if pos >= end:
        return REFUSED
    token = t.byte_at(pos)
    pos += 1
    literals = token >> 4
    if literals == 15:
        ok, pos, literals = _lz4_extend(t, end, pos, literals)
        if not ok:
            return REFUSED
    if literals > end - pos or literals > want - produced:
        return REFUSED
    pos += literals
    produced += literals
    if pos == end:
        return VALID if produced == want else REFUSED
    if produced > want - 12 or pos > end - 8:
        return REFUSED
    offset = t.byte_at(pos) | t.byte_at(pos + 1) << 8
    pos += 2
    if offset == 0 or offset > produced:
        return REFUSED
    match = token & 15
    if match == 15:
        ok, pos, match = _lz4_extend(t, end, pos, match)
        if not ok:
            return REFUSED
    match += 4
    if match > want - 5 - produced:
        return REFUSED
    w.produced, w.pos = produced + match, pos
    return WALKING


def lz4_check(heap, in_start, in_size, out_size, refused, n):
    _check(_lz4_step, heap, in_start, in_size, out_size, refused, n)


KERNELS = {
    f.__name__: f
    for f in (
        hybrid_runs,
        hybrid_expand,
        levels_validity,
        plain_fixed,
        dict_gather,
        dict_strings,
        plain_lengths,
        scatter_values,
        copy_strings,
        snappy_check,
        lz4_check,
    )
}


class LaunchError(AssertionError):
    """A launch the GPU would reject, misread, or fault on."""


class _Bounded(np.ndarray):
    """A kernel's view of a pointer argument: an integer index or a slice
    outside the array raises :class:`LaunchError` (a GPU would read or write
    out of bounds), where NumPy would wrap or clip."""

    def _check(self, key: Any) -> None:
        n = self.shape[0]
        if isinstance(key, slice):
            start = 0 if key.start is None else int(key.start)
            stop = n if key.stop is None else int(key.stop)
            if key.step not in (None, 1) or not 0 <= start <= n or not 0 <= stop <= n:
                raise LaunchError(f"slice [{key.start}:{key.stop}] of a {n}-item argument")
        elif isinstance(key, (int, np.integer)):
            if not 0 <= int(key) < n:
                raise LaunchError(f"index {int(key)} of a {n}-item argument")
        else:
            raise LaunchError(f"a kernel port indexes with {type(key).__name__}")

    def __getitem__(self, key: Any) -> Any:
        self._check(key)
        return super().__getitem__(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._check(key)
        super().__setitem__(key, value)


#: C pointee / scalar type of a kernel parameter -> NumPy dtype
_C_TYPES = {
    "unsigned char": np.dtype(np.uint8),
    "int": np.dtype(np.int32),
    "unsigned int": np.dtype(np.uint32),
    "long long": np.dtype(np.int64),
}
_MAX_GRID_X = (1 << 31) - 1


def signature(name: str, element_bytes: int | None = None) -> list[tuple[str, bool, bool]]:
    """The parameters of kernel ``name`` as ``(C type, pointer, const)``."""
    source = kernel_source(name, element_bytes)
    found = re.search(r'extern "C" __global__ void ' + name + r"\((.*?)\)", source, re.S)
    assert found is not None, name
    params = []
    for raw in found.group(1).split(","):
        words = raw.replace("__restrict__", "").replace("*", " * ").split()[:-1]
        const = "const" in words
        pointer = "*" in words
        ctype = " ".join(w for w in words if w not in ("const", "*"))
        params.append((ctype, pointer, const))
    return params


def _check_arg(
    name: str, i: int, arg: Any, param: tuple[str, bool, bool], elem: int | None
) -> Any:
    ctype, pointer, const = param
    where = f"{name} argument {i} ({'const ' if const else ''}{ctype}{'*' if pointer else ''})"
    if not pointer:
        if type(arg) is not _C_TYPES[ctype].type:
            raise LaunchError(f"{where}: got {type(arg).__name__}, not {_C_TYPES[ctype]}")
        return arg
    if not isinstance(arg, Array) or arg.ndim != 1 or not arg.flags.c_contiguous:
        raise LaunchError(f"{where}: not a contiguous 1-d device array: {type(arg).__name__}")
    if ctype == "ELEM_T":
        if elem is None or arg.dtype.itemsize != elem:
            raise LaunchError(f"{where}: {arg.dtype} for {elem}-byte elements")
    elif arg.dtype != _C_TYPES[ctype]:
        raise LaunchError(f"{where}: got {arg.dtype}")
    view = np.asarray(arg).view(_Bounded)
    if const:
        view.flags.writeable = False
    return view


def kernel_function(name: str, element_bytes: int | None = None) -> Any:
    """The emulated kernel ``name``, called like a ``cupy.RawKernel``, each
    launch checked (see the module notes)."""
    kernel = KERNELS[name]
    params = signature(name, element_bytes)
    grid_stride = "gridDim.x" in kernel_source(name, element_bytes)

    def launch(grid: Any, block: Any, args: tuple[Any, ...]) -> None:
        if len(grid) != 1 or len(block) != 1 or len(args) != len(params):
            raise LaunchError(f"{name}: grid {grid}, block {block}, {len(args)} arguments")
        blocks, threads = grid[0], block[0]
        if not (type(blocks) is int and type(threads) is int):
            raise LaunchError(f"{name}: grid {grid} and block {block} take Python ints")
        if not (1 <= blocks <= _MAX_GRID_X and 1 <= threads <= 1024):
            raise LaunchError(f"{name}: grid {blocks} x block {threads} is not launchable")
        checked = [
            _check_arg(name, i, a, p, element_bytes)
            for i, (a, p) in enumerate(zip(args, params, strict=True))
        ]
        items = int(args[-1])  # every kernel's last parameter: its item count
        if not grid_stride and blocks * threads < items:
            raise LaunchError(f"{name}: {blocks} x {threads} threads for {items} items")
        kernel(*checked)

    return launch
