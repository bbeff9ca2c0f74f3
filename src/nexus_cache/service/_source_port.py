"""The service's one door to the decoded-source cache.

A scan is decoded object by object into device frames
(:class:`~nexus_cache.frames.DeviceFrame`) in the attempt's allocation
domain. Each object with a proven lakehouse identity has a
:class:`~nexus_cache.device.SourceFrameKey` (its entry key, the projected
columns, the batch boundary) and goes through ``checkout_or_claim``:

* ``hit``: a copy of the resident frame (the entry stays pinned until the
  attempt releases its frames); no byte is read from the lakehouse. A table
  read *borrows* instead (``borrow=True``): its frame is a view of the
  resident frame, in the cache's domain, and its filter gathers the rows
  straight into the attempt's domain (see ``filter_frames``), so nothing is
  copied before the mask and no result shares a buffer with the entry;
* with a ``narrow`` (a filtered table read), a hit on the object's whole entry
  when it is resident; otherwise the key names the row groups the filter may
  need (from the object's footer), and an object with none is not decoded;
* ``miss-led``: this attempt decoded through the lakehouse and offered the
  frame to the cache (retained when it fits; the attempt keeps its own);
* ``miss-followed``: another attempt was decoding the same key; this one
  waited and took a copy;
* ``bypass`` with a reason: ``cache_cap_bytes=0`` on the device, or ``no
  proven identity (<why>: <what to change>)`` (the lakehouse could not prove
  what the object holds: a local file modified moments ago, a store without
  ETags or versions). A lakehouse root is not needed: identity is proven
  from the same stat / metadata evidence with or without one.

A stale lakehouse plan met while leading is this attempt's own failure: the
lead passes to a waiting attempt (which decodes with its own plan) and the
attempt is retried. Several objects give one status when they agree, else
``mixed(...)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from nexus_cache._lru import BoundedLRU
from nexus_cache.backends import AllocationDomain
from nexus_cache.device import (
    CheckoutStatus,
    DeviceResidentCaches,
    SourceCheckout,
    SourceFrameKey,
)
from nexus_cache.errors import ConfigError, SourceFormatError, StalePlanError
from nexus_cache.frames import DeviceFrame
from nexus_cache.lakehouse import ReadPlan
from nexus_cache.service._lake import SourcePlan, identity_problem, one_word

__all__ = [
    "BYPASS_COUNT",
    "Narrow",
    "SourceLoad",
    "SourceOutcome",
    "SourcePort",
    "concat_objects",
    "host_copy",
]

#: what the frames were decoded with: part of every key, so a change of
#: decoder never reuses frames of another
_DECODER = ("decoder", "nexus_cache.frames.decode_parquet/1")


@dataclasses.dataclass(frozen=True)
class SourceOutcome:
    """How the decoded-source cache answered one scan."""

    status: str
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason}


BYPASS_COUNT = SourceOutcome("bypass", "synthetic count source")


@dataclasses.dataclass
class SourceLoad:
    """The frames of one scan (one per object) and the checkouts that pin them."""

    frames: list[DeviceFrame] = dataclasses.field(default_factory=list)
    checkouts: list[SourceCheckout] = dataclasses.field(default_factory=list)
    outcome: SourceOutcome | None = None
    #: the row groups each frame holds, one per frame (None: all of its object's)
    holds: list[tuple[int, ...] | None] = dataclasses.field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(int(f.nbytes) for f in self.frames)

    def table(self, *, detach: bool, columns: Sequence[str] | None = None) -> pa.Table:
        """The frames as one host table. ``detach`` copies it out of the domain:
        on the host backend ``to_arrow`` shares the frames' buffers, which must
        not outlive the attempt. ``columns``: the scan's projection, in its order
        (the objects of a directory decode those of them they hold: a column one
        lacks is null in its rows); ConfigError for one that no object holds."""
        self.check_columns(columns)
        tables = [f.to_arrow() for f in self.frames]  # a frame of no columns keeps its rows
        table = tables[0] if len(tables) == 1 else concat_objects(tables)
        if columns is not None:
            table = table.select(list(columns))
        return host_copy(table) if detach else table

    def check_columns(self, columns: Sequence[str] | None) -> None:
        """ConfigError when a column of ``columns`` is in none of the frames (a
        frame lacks only those its object lacks)."""
        if columns is None or not self.frames:
            return
        held = {name for f in self.frames for name in f.column_names}
        missing = [c for c in columns if c not in held]
        if missing:
            raise ConfigError(
                f"columns {missing} are in none of the source's {len(self.frames)} Parquet "
                "objects; check the names against the objects' schemas"
            )

    def release(self) -> None:
        """Release every frame and checkout (unpinning hits). Idempotent."""
        for frame in self.frames:
            frame.release()
        self.frames.clear()
        for checkout in self.checkouts:
            if not checkout.released:
                checkout.release()
        self.checkouts.clear()


def host_copy(table: pa.Table) -> pa.Table:
    """An independent copy of ``table``: each column's chunks concatenated into new
    buffers (one copy, one chunk per column). With a dictionary column, whose
    concatenation may keep a dictionary shared, through one Arrow IPC buffer."""
    if table.num_columns and not any(pa.types.is_dictionary(t) for t in table.schema.types):
        columns = [pa.concat_arrays(c.chunks) if c.num_chunks else c for c in table.columns]
        return pa.Table.from_arrays(columns, schema=table.schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return pa.ipc.open_stream(sink.getvalue()).read_all()


_STATUS = {
    CheckoutStatus.HIT: "hit",
    CheckoutStatus.LEADER: "miss-led",
    CheckoutStatus.FOLLOWER: "miss-followed",
    CheckoutStatus.BYPASS: "bypass",
    CheckoutStatus.UNCACHED: "bypass",
}

#: decodes one planned object into the attempt's domain: only the row groups
#: given (None: all of them)
Decode = Callable[[ReadPlan, tuple[int, ...] | None], DeviceFrame]
#: the row groups of one planned object that a filter may need, from its footer
#: (None: all of them; empty: none)
Narrow = Callable[[ReadPlan], tuple[int, ...] | None]


class SourcePort:
    """Loads scans through the source cache of a device, where one exists. Thread-safe."""

    def __init__(self, caches: DeviceResidentCaches, wait_timeout_s: float) -> None:
        self._caches = caches
        self._timeout = wait_timeout_s
        #: the keys made before, by what each is made of (a key is immutable; making
        #: one validates it and hashes its fingerprint): a repeated scan makes none
        self._keys: BoundedLRU[tuple[Any, ...], SourceFrameKey] = BoundedLRU(4096)

    def _key(
        self,
        read_plan: ReadPlan,
        columns: Sequence[str] | None,
        batch_rows: int,
        decode_options: tuple[tuple[str, Any], ...],
    ) -> SourceFrameKey:
        """The whole-object key of ``read_plan``'s object (its identity key, the
        projected ``columns``, the batch boundary, the decode options)."""
        names = None if columns is None else tuple(columns)
        made_of = (read_plan.key, names, batch_rows, decode_options)
        key = self._keys.get(made_of)
        if key is None or key.location != read_plan.source:
            key = SourceFrameKey(
                (read_plan.key,),
                columns=names or (),
                batch_rows=batch_rows,
                decode_options=(_DECODER, ("all_columns", names is None), *decode_options),
                location=read_plan.source,
            )
            self._keys.put(made_of, key)
        return key

    def load(
        self,
        device_id: int,
        plan: SourcePlan,
        columns: Sequence[str] | None,
        batch_rows: int,
        domain: AllocationDomain,
        decode: Decode,
        load: SourceLoad,
        stop: Callable[[], None] | None = None,
        decode_options: tuple[tuple[str, Any], ...] = (),
        narrow: Narrow | None = None,
        borrow: bool = False,
    ) -> None:
        """Fill ``load`` with one frame per object of ``plan`` (release it in any case).

        ``stop`` is looked at while this query waits for another query's
        decode of the same frame (see ``checkout_or_claim``). ``decode_options``
        join each key: how ``decode`` builds a frame beyond its columns (a table
        read's partition and null columns).

        ``narrow`` (a filtered table read): an object whose whole entry is
        resident is a hit on it (any filter can be applied to it), with no
        footer read. Otherwise ``narrow`` picks the row groups the filter may
        need; they join the key (all of them: the whole-object key), and only
        they are decoded. An object with none is decoded empty and not cached.
        ``borrow``: a hit's frame is a view of the resident frame (in the
        cache's domain, pinned until ``load`` is released), not a copy; the
        caller builds its result in ``domain`` from it.
        """
        subdomain = self._caches.source_cache(device_id)
        statuses: list[str] = []
        reasons: list[str] = []
        try:
            for read_plan in plan.plans:
                if subdomain is None or read_plan.key is None:
                    groups = None if narrow is None else narrow(read_plan)
                    load.frames.append(decode(read_plan, groups))
                    load.holds.append(groups)
                    if groups != ():
                        statuses.append("bypass")
                        reasons.append(
                            "cache_cap_bytes=0"
                            if subdomain is None
                            else identity_problem(read_plan)
                        )
                    continue
                key = self._key(read_plan, columns, batch_rows, decode_options)
                groups = None
                checkout = (
                    None
                    if narrow is None
                    else subdomain.checkout_resident(key, domain=domain, borrow=borrow)
                )
                if narrow is not None and checkout is None:
                    groups = narrow(read_plan)
                    if groups == ():  # no row group may match: nothing to decode or cache
                        load.frames.append(decode(read_plan, groups))
                        load.holds.append(groups)
                        continue
                    if groups is not None:
                        key = dataclasses.replace(key, row_groups=groups)
                if checkout is None:
                    checkout = self._one(
                        subdomain, key, domain, read_plan, decode, groups, stop, borrow
                    )
                load.checkouts.append(checkout)
                load.holds.append(groups)
                frame = checkout.value
                if frame.domain is not domain:  # borrowed: a view to release, not the entry
                    frame = frame.view()
                load.frames.append(frame)
                status = _STATUS[checkout.status]
                statuses.append(status)
                if status == "bypass":
                    reasons.append(checkout.diagnostics.detail)
        finally:
            load.outcome = SourceOutcome(
                one_word(statuses),
                "; ".join(sorted(set(reasons))) or None,
            )

    def _one(
        self,
        subdomain: Any,
        key: SourceFrameKey,
        domain: AllocationDomain,
        read_plan: ReadPlan,
        decode: Decode,
        groups: tuple[int, ...] | None,
        stop: Callable[[], None] | None,
        borrow: bool,
    ) -> SourceCheckout:
        result = subdomain.checkout_or_claim(
            key, domain=domain, timeout=self._timeout, stop=stop, borrow=borrow
        )
        if isinstance(result, SourceCheckout):
            return result
        with result:  # an exception not resolved below fails the claim for every waiter
            try:
                frame = decode(read_plan, groups)
            except StalePlanError:
                result.abandon("stale lakehouse plan")  # our plan, not the key, is bad
                raise
            # a DeviceFrame is a device-cache value; this decode is ours alone and
            # never written again, so a host entry may share its memory
            return result.publish(frame, share=True)


def concat_objects(tables: list[pa.Table]) -> pa.Table:
    """The tables of a source's objects as one table.

    Objects written at different times often differ a little (an int32
    column that became int64, a column added later): types are widened and
    a column an object lacks is null there. Types that cannot be unified
    (an int column that became a string) raise :class:`SourceFormatError`.
    """
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        schemas = "; ".join(
            f"object {i}: " + ", ".join(f"{f.name} {f.type}" for f in t.schema)
            for i, t in enumerate(tables)
        )
        raise SourceFormatError(
            f"the source's Parquet objects have schemas that cannot be combined ({schemas}); "
            "read the objects separately or select columns they share"
        ) from exc
