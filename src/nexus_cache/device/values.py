"""What the device caches store: any value that knows its size and can copy
itself into an allocation domain.

The caches never look inside a value. A decoded frame (``nexus_cache.frames``),
a parked graph or the simple :class:`ArrayBundle` below all qualify by
implementing :class:`DeviceValue`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from nexus_cache.errors import ConfigError

if TYPE_CHECKING:
    from nexus_cache.backends import AllocationDomain

__all__ = ["ArrayBundle", "DeviceValue"]


@runtime_checkable
class DeviceValue(Protocol):
    """A value a device cache can hold.

    * ``nbytes``: the bytes of its device buffers (the reservation made
      before copying it into the cache; the ledger is then reconciled to the
      measured allocation);
    * ``copy_into(domain)``: an independent copy whose every buffer is
      allocated in ``domain`` (``domain.empty`` / ``domain.copy_in``). It may
      raise ``MemoryError`` (a ``CapacityError`` or the allocator's
      out-of-memory error) when the domain is full;
    * ``device_arrays()``: the arrays that hold its buffers, so the cache can
      measure them and prove them unreachable at teardown.

    Copies must not share buffers with the original: the cache's copy and the
    attempt's value have independent lifetimes. A value may also offer
    ``share_into(domain)`` (a :class:`~nexus_cache.frames.DeviceFrame` does):
    the same memory booked by ``domain``, read-only, or None; the source cache
    uses it only where the publisher promises nothing writes the value again.
    """

    @property
    def nbytes(self) -> int: ...

    def copy_into(self, domain: AllocationDomain) -> DeviceValue: ...

    def device_arrays(self) -> tuple[Any, ...]: ...


class ArrayBundle(Mapping[str, Any]):
    """Named arrays of one array module: the simplest :class:`DeviceValue`.

    Immutable mapping (``bundle["col"]``); ``project(names)`` and
    ``slice(start, stop)`` derive new bundles (views, no copy). Thread-safe
    for reads.
    """

    __slots__ = ("_arrays",)

    def __init__(self, arrays: Mapping[str, Any]) -> None:
        for name in arrays:
            if not isinstance(name, str) or not name:
                raise ConfigError(f"ArrayBundle column names must be non-empty str, got {name!r}")
        self._arrays = dict(arrays)

    def __getitem__(self, name: str) -> Any:
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def __repr__(self) -> str:
        cols = ", ".join(f"{k}:{getattr(v, 'dtype', '?')}[{len(v)}]" for k, v in self.items())
        return f"ArrayBundle({cols})"

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self._arrays.values())

    def copy_into(self, domain: AllocationDomain) -> ArrayBundle:
        return ArrayBundle({name: domain.copy_in(a) for name, a in self._arrays.items()})

    def device_arrays(self) -> tuple[Any, ...]:
        return tuple(self._arrays.values())

    def project(self, names: list[str] | tuple[str, ...]) -> ArrayBundle:
        return ArrayBundle({name: self._arrays[name] for name in names})

    def slice(self, start: int, stop: int) -> ArrayBundle:
        return ArrayBundle({name: a[start:stop] for name, a in self._arrays.items()})
