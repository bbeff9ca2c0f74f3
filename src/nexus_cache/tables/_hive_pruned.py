"""A local Hive directory listed with a filter: pruned partitions are never entered.

The data files sit in the deepest partition directories (the *leaves*: the
depth of the first object in path order). Every directory above the leaves
is listed, so every ``key=value`` name of every level is seen; the leaves
are decided by their partition values with the filter
(:func:`~nexus_cache.tables.pruning.partition_test`, the decision file
pruning makes) and only the kept ones are entered and their files stat'ed.

The schema is the one the full listing gives, whatever the filter: the
partition types are inferred from the names of every leaf as if each holds
an object, then checked against the kept leaves that do; where a skipped
leaf's name could change a key's type or presence (an empty ``day=x``
beside ``day=1``), that leaf is looked into (one scandir, no stat). A kept
leaf that holds directories, or a type that turns out otherwise than
pruning assumed, falls back to the full listing (None). One assumption is
made of a skipped leaf: like its kept siblings, it holds objects and no
further partition directories.

What the directories above the leaves say (the first object, the leaves and
their names, the objects above them, the partition types) depends on no
filter: it is kept by the stat of every directory listed for it, taken before
each listing (device, inode, mtime and ctime: a directory's entry added,
removed or renamed changes them), and listed again when one differs. As with
a first object's schema, a directory that changed within
:data:`~nexus_cache.tables._hive._SETTLED_S` before it was listed, or that
holds a symbolic link, is not kept. The kept leaves are listed and their
objects stat'ed when a filter first resolves; the layout then keeps that
snapshot for the filter (its raw form as given) while the same proof holds
for the kept leaves: each leaf's stat from before it was listed (settled, no
link), the first object's schema, and every object's size, stat'ed again on
each resolution. A repeated filter so skips the listing of its leaves and
building its snapshot, not the stat of its objects.
"""

from __future__ import annotations

import functools
import os
import time
from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa

from nexus_cache._lru import BoundedLRU
from nexus_cache.tables._hive import (
    _SETTLED_S,
    _data_files,
    _data_schema,
    _is_int32,
    _listing,
    _Pairs,
    _partition_shape,
    _partition_types,
    _segment_at,
    _sized,
    _typed_partition,
    _with_partitions,
)
from nexus_cache.tables.snapshot import TableSnapshot

if TYPE_CHECKING:
    from nexus_cache.tables.filters import TableFilter

__all__ = ["resolve_pruned"]

_Leaf = tuple[str, _Pairs]  # a path (a directory's ends with '/') and its segments


#: what proves a directory's listing unchanged: ``(device, inode, mtime_ns, ctime_ns)``
_DirStat = tuple[int, int, int, int]


def _dir_stat(directory: str) -> _DirStat | None:
    """``directory``'s :data:`_DirStat`; None when it cannot be stat'ed."""
    try:
        st = os.stat(directory)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns


class _Tree:
    """The listings of one resolution, each directory scanned once, with the stat each
    directory had before it was listed (:attr:`proof`; None once one cannot prove its
    listing: not stat'ed, changed within :data:`_SETTLED_S`, or holding a link)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[list[os.DirEntry[str]], list[os.DirEntry[str]]]] = {}
        self._proven: dict[str, _DirStat] = {}
        self.proof: dict[str, _DirStat] | None = {}

    def scan(self, directory: str) -> tuple[list[os.DirEntry[str]], list[os.DirEntry[str]]]:
        found = self._seen.get(directory)
        if found is None:
            before = _dir_stat(directory)
            files, dirs, volatile = _listing(directory)
            found = self._seen[directory] = files, dirs
            if before is not None and not volatile and _settled(before):
                self._proven[directory] = before
                if self.proof is not None:
                    self.proof[directory] = before
            else:
                self.proof = None
        return found

    def listed(self, directory: str) -> bool:
        return directory in self._seen

    def proven(self, directory: str) -> _DirStat | None:
        """The stat ``directory`` had before it was listed, where that stat proves the
        listing (settled, and no ``*.parquet`` link, dangling ones included, nor an
        entry that vanished while listed); None otherwise."""
        return self._proven.get(directory)

    def first_object(self, directory: str, depth: int = 0) -> tuple[str, int] | None:
        """The first object under ``directory`` in path order, and its depth."""
        files, dirs = self.scan(directory)
        ordered = sorted(
            [(f.name, f.path, False) for f in files] + [(d.name + "/", d.path, True) for d in dirs]
        )
        for _, path, is_dir in ordered:
            if not is_dir:
                return path, depth
            found = self.first_object(path, depth + 1)
            if found is not None:
                return found
        return None

    def holds_object(self, directory: str) -> bool:
        files, dirs = self.scan(directory)
        return bool(files) or any(self.holds_object(d.path) for d in dirs)


def _with(pairs: _Pairs, name: str, path: str) -> _Pairs:
    found = _segment_at(name, path)
    return pairs if found is None else (*pairs, found)


def _evidence(segments: list[_Pairs]) -> tuple[tuple[str, pa.DataType, bool], ...]:
    """Each key (in order of first appearance), its type, and whether it has a value
    that is not null."""
    return _evidence_of(tuple(segments))


@functools.lru_cache(maxsize=64)
def _evidence_of(segments: tuple[_Pairs, ...]) -> tuple[tuple[str, pa.DataType, bool], ...]:
    """:func:`_evidence`, remembered: a pure function of the names."""
    types = _partition_types(segments)
    present = {k for pairs in segments for k, v in pairs if v is not None}
    return tuple((k, t, k in present) for k, t in types.items())


def _exact_leaves(
    tree: _Tree, above: list[_Leaf], leaves: list[_Leaf]
) -> tuple[list[_Leaf], dict[str, pa.DataType]]:
    """The leaves whose names give the partition keys and types the objects give, and
    those types: the leaves that may decide them are looked into (those listed
    already first, then those whose value is not an integer) until the ones found
    holding an object (and the objects ``above`` the leaves) witness every key and
    type; an empty one is dropped. Most tables need one look, at the leaf that
    the search for the first object listed already."""
    every = _evidence(_ordered(above + leaves))
    order = [leaf for leaf in leaves if tree.listed(leaf[0][:-1])]
    if any(pa.types.is_string(t) and present for _, t, present in every):
        order += [x for x in leaves if not all(v is None or _is_int32(v) for _, v in x[1])]
    order += leaves
    known = list(above)
    looked: set[str] = set()
    empty: set[str] = set()
    for leaf in order:
        if _evidence(_ordered(known)) == every:
            break
        if leaf[0] in looked:
            continue
        looked.add(leaf[0])
        if tree.holds_object(leaf[0][:-1]):
            known.append(leaf)
        else:
            empty.add(leaf[0])
            every = _evidence(_ordered(above + [x for x in leaves if x[0] not in empty]))
    if empty:
        leaves = [leaf for leaf in leaves if leaf[0] not in empty]
    return leaves, {k: t for k, t, _ in every}


def _ordered(items: list[_Leaf]) -> list[_Pairs]:
    """The segments of ``items`` in path order (a directory's path ends with '/')."""
    return [pairs for _, pairs in sorted(items, key=lambda item: item[0])]


def _settled(stat: _DirStat) -> bool:
    """Whether a directory last changed :data:`_SETTLED_S` or longer ago: a later
    change of its entries then gives it another mtime and ctime."""
    return time.time() - max(stat[2], stat[3]) / 1e9 >= _SETTLED_S


class _Layout:
    """What the directories above a Hive directory's leaves say, whatever the filter:
    its first object, the leaves (after :func:`_exact_leaves`) and the objects above
    them with their segments, and the partition types; ``proof``: every directory
    listed for it, with its stat from before the listing."""

    __slots__ = ("_decided", "_resolved", "_typed", "first", "leaves", "proof", "types", "upper")

    def __init__(
        self,
        first: str,
        leaves: tuple[_Leaf, ...],
        upper: tuple[tuple[str, _Pairs], ...],
        types: dict[str, pa.DataType],
        proof: tuple[tuple[str, _DirStat], ...],
    ) -> None:
        self.first = first
        self.leaves = leaves
        self.upper = upper
        self.types = types
        self.proof = proof
        self._typed: tuple[pa.Schema, list[pa.Field], pa.Schema, tuple[Any, ...]] | None = None
        #: the leaves each canonical filter keeps, by the filter's key (the filter
        #: itself held: it names the table schema, which gives the typed values)
        self._decided: BoundedLRU[str, tuple[TableFilter, tuple[int, ...]]] = BoundedLRU(
            _DECIDED_FILTERS
        )
        #: the snapshots resolved with it, by source and raw filter (:meth:`recall`)
        self._resolved: BoundedLRU[tuple[str, str], _Resolved] = BoundedLRU(_DECIDED_FILTERS)

    def recall(self, key: tuple[str, str], data_schema: pa.Schema) -> TableSnapshot | None:
        """The snapshot :meth:`remember` kept for ``key`` while its proof holds: the
        same first object's schema, each kept leaf's stat, every object's size."""
        found = self._resolved.get(key)
        if found is None:
            return None
        known = found.data_schema
        if known is not data_schema and not known.equals(data_schema, check_metadata=True):
            return None
        if any(_dir_stat(directory) != stat for directory, stat in found.leaves):
            return None
        if any(_size(f.path) != f.size for f in found.snapshot.files):
            return None
        return found.snapshot

    def remember(self, key: tuple[str, str], resolved: _Resolved) -> None:
        self._resolved.put(key, resolved)

    def holds(self) -> bool:
        """Whether every directory it was listed from has the stat it had then."""
        return all(_dir_stat(directory) == stat for directory, stat in self.proof)

    def typed(self, data_schema: pa.Schema) -> tuple[list[pa.Field], pa.Schema, tuple[Any, ...]]:
        """``(partition fields, table schema, each leaf's typed partition values)`` with
        the first object's ``data_schema``; remembered for the last one given."""
        found = self._typed
        if found is None or found[0] is not data_schema:
            fields, schema = _with_partitions(data_schema, self.types)
            shape = _partition_shape(fields)
            values = tuple(_typed_partition(pairs, shape) for _, pairs in self.leaves)
            found = self._typed = (data_schema, fields, schema, values)
        return found[1], found[2], found[3]

    def kept(self, flt: TableFilter, typed: tuple[Any, ...]) -> tuple[int, ...]:
        """The indices of the leaves whose partition values (``typed``, of
        :meth:`typed` for ``flt``'s schema) ``flt`` may need; remembered per canonical
        filter. A pure function of this layout and the filter: the filter's schema
        (checked equal when the filter is made canonical) fixes the partition fields,
        and with them the typed values of this layout's leaves."""
        decided = self._decided
        found = decided.get(flt.key)
        if found is not None and found[0] is flt:
            return found[1]
        from nexus_cache.tables.pruning import partition_test

        possible = partition_test(flt)
        kept = tuple(i for i, values in enumerate(typed) if possible(values))
        decided.put(flt.key, (flt, kept))
        return kept


class _Resolved(NamedTuple):
    """A filtered resolution kept by its layout: the first object's schema it was
    made with, each kept leaf's stat from before it was listed, and the snapshot."""

    data_schema: pa.Schema
    leaves: tuple[tuple[str, _DirStat], ...]
    snapshot: TableSnapshot


#: the longest raw filter (its ``repr``) a layout keeps a resolution for
_MAX_FILTER_KEY = 4096
_PLAIN = (str, int, float, bool, type(None))


def _filter_key(filter: Any) -> str | None:
    """``repr`` of a raw filter made of lists, tuples and plain scalars only (exact
    types: a subclass may print as something it is not), where it is short; None
    otherwise (such a filter is resolved afresh each time)."""
    pending, seen = [filter], 0
    while pending:
        item = pending.pop()
        seen += 1
        if type(item) in (list, tuple):
            pending.extend(item)
        elif type(item) not in _PLAIN or seen > _MAX_FILTER_KEY:
            return None
    key = repr(filter)
    return key if len(key) <= _MAX_FILTER_KEY else None


#: the filters whose kept leaves one layout remembers (:meth:`_Layout.kept`)
_DECIDED_FILTERS = 256

#: the layouts of local Hive directories by path, kept while :meth:`_Layout.holds`
_LAYOUTS: BoundedLRU[str, _Layout] = BoundedLRU(64)


def _layout(base: str, tree: _Tree) -> _Layout | None:
    """The layout of ``base``: the one kept while it holds, else listed now with
    ``tree`` (and kept when every directory listed proves its listing); None when
    ``base`` holds no object or holds objects at its top."""
    known = _LAYOUTS.get(base)
    if known is not None and known.holds():
        tree.proof = None  # what it lists now proves nothing kept
        return known
    first = tree.first_object(base)
    if first is None or first[1] == 0:
        return None  # no object (the full listing says so), or objects in the top directory
    upper: list[tuple[str, _Pairs]] = []  # objects above the leaves
    frontier: list[tuple[str, _Pairs]] = [(base, ())]
    for _ in range(first[1]):
        below: list[tuple[str, _Pairs]] = []
        for directory, pairs in frontier:
            files, dirs = tree.scan(directory)
            upper.extend((f.path, pairs) for f in files)
            below.extend((d.path, _with(pairs, d.name, d.path)) for d in dirs)
        frontier = below
    leaves: list[_Leaf] = [(path + "/", pairs) for path, pairs in frontier]
    above: list[_Leaf] = list(upper)
    leaves, types = _exact_leaves(tree, above, leaves)
    proof = tree.proof
    layout = _Layout(
        first[0], tuple(leaves), tuple(upper), types, () if proof is None else tuple(proof.items())
    )
    if proof is not None:
        _LAYOUTS.put(base, layout)
    return layout


def _size(path: str) -> int | None:
    """The size of the file on ``path`` (a link: its target's); None when it vanished."""
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def resolve_pruned(source: str, base: str, filter: Any) -> TableSnapshot | None:
    """The snapshot of local Hive directory ``base`` holding only the objects of the
    partitions ``filter`` may need; None where the full listing must decide."""
    from nexus_cache.tables.filters import canonical_filter

    tree = _Tree()
    layout = _layout(base, tree)
    if layout is None:
        return None
    data_schema = _data_schema(source, layout.first, None)
    raw_key = _filter_key(filter)
    key = None if raw_key is None else (source, raw_key)
    if key is not None:
        known = layout.recall(key, data_schema)
        if known is not None:
            return known
    fields, schema, typed = layout.typed(data_schema)
    if not fields:
        return None
    flt = canonical_filter(filter, schema)
    if flt is None:
        return None
    kept = layout.kept(flt, typed)
    entries: list[tuple[str, int, str | None]] = []
    segments: list[_Pairs] = []
    proof: list[tuple[str, _DirStat]] | None = [] if key is not None else None
    for i in kept:
        directory, pairs = layout.leaves[i]
        leaf = directory[:-1]
        files, dirs = tree.scan(leaf)
        if dirs:
            return None  # a leaf holds directories: the layout is not what was assumed
        if proof is not None:
            before = tree.proven(leaf)  # its stat before its listing proves it later
            if before is None:
                proof = None
            else:
                proof.append((leaf, before))
        for path, size in _sized(files):
            entries.append((path, size, None))
            segments.append(pairs)
    for path, pairs in layout.upper:
        found = _size(path)
        if found is not None:
            entries.append((path, found, None))
            segments.append(pairs)
    order = sorted(range(len(entries)), key=lambda i: entries[i][0])
    snapshot = TableSnapshot(
        kind="hive",
        location=source,
        version=None,
        schema=schema,
        partition_schema=pa.schema(fields),
        files=_data_files([entries[i] for i in order], [segments[i] for i in order], fields, None),
        filesystem=None,
        partitions_skipped=len(layout.leaves) - len(kept),
        pruned_with=flt,
    )
    if key is not None and proof is not None:
        layout.remember(key, _Resolved(data_schema, tuple(proof), snapshot))
    return snapshot
