"""The shared-memory tile of the kernels that walk a page or a stream serially.

A Parquet PLAIN string page (4-byte length prefixes) and a Snappy or LZ4
stream (tags) can only be walked front to back: where the next item starts
depends on the item before. One thread walking global memory pays a load
latency per step. So these kernels run one block per page or stream: the
block copies ``TILE_BYTES`` of it, coalesced, into shared memory; then one
thread walks the items that start inside the tile from shared memory; the
next tile starts where the walk stopped (so a length prefix or tag that
straddles the tile's edge is read again, whole, at the next tile's start).
:func:`byte_at` reads a byte outside the tile (an item's tail past its
edge, a long run of LZ4 length bytes) from global memory, so the walk reads
exactly the bytes the serial walk read and the tile only makes it faster:
the results and the refusals do not depend on where the tiles fall.
"""

from __future__ import annotations

__all__ = ["TILE_BYTES", "TILE_SOURCE"]

#: bytes of a page or stream in shared memory at a time (a third of the 48 KiB
#: a block may take statically: several blocks stay resident on each SM)
TILE_BYTES = 16384

#: the C helpers (after this, a kernel declares ``__shared__ unsigned char
#: tile[TILE_BYTES]``)
TILE_SOURCE = (
    f"#define TILE_BYTES {TILE_BYTES}LL\n"
    + r"""
// Bytes [t0, t1) of `global` held in `shared`; every other byte is read from
// `global` itself (the caller bounds every position by the stream's end).
struct Tile {
    const unsigned char* shared;
    long long t0, t1;
    const unsigned char* global;
};

__device__ __forceinline__ unsigned char byte_at(const Tile& t, const long long pos)
{
    return (pos >= t.t0 && pos < t.t1) ? t.shared[pos - t.t0] : t.global[pos];
}

// Every thread of the block: bytes [t0, t1) of `global` into `shared`
// (consecutive threads read consecutive bytes: coalesced). Nothing when t1 <= t0.
__device__ __forceinline__ void load_tile(
    unsigned char* shared, const unsigned char* global, const long long t0, const long long t1)
{
    for (long long i = t0 + threadIdx.x; i < t1; i += blockDim.x) shared[i - t0] = global[i];
}
"""
)
