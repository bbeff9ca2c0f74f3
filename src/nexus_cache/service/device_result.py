"""What :meth:`QueryService.execute_on_device` returns: a frame that stays in device memory.

A :class:`DeviceQueryResult` holds the scan's result as a
:class:`~nexus_cache.frames.DeviceFrame` of the attempt's working domain (CuPy
arrays on CUDA, NumPy on the host backend) together with its
:class:`~nexus_cache.service.result.Diagnostics`. Its memory stays booked: the
attempt's grant is held in the device ledger (so admission counts it) until the
result, and every frame derived from ``result.frame``, is released. A result
dropped without :meth:`~DeviceQueryResult.release` is released when it is
collected, with a :class:`ResourceWarning`.
"""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from types import TracebackType
from typing import Any

import pyarrow as pa

from nexus_cache.errors import LifecycleError
from nexus_cache.frames import DeviceFrame
from nexus_cache.service.result import Diagnostics

__all__ = ["DeviceQueryResult"]


class DeviceQueryResult:
    """A scan's result in device memory, and how it was produced.

    ``frame`` is a :class:`~nexus_cache.frames.DeviceFrame` whose buffers belong
    to the result alone (no cache entry shares them). While it lives, the
    attempt's grant stays in the device ledger; :meth:`release` (idempotent, also
    on leaving a ``with`` block) gives the frame up, and once the last frame
    derived from it (``frame.select``, ``frame.slice``) is released too, the
    grant and the device memory go back. A result that is dropped unreleased is
    released when it is collected, with a :class:`ResourceWarning`.

    Thread-safety: reading ``frame`` from several threads is safe; release it
    once, from one place, after every reader is done. A :meth:`release` racing a
    reader does not crash it: the reader gets its rows or :class:`LifecycleError`.

    Fork: a process forked from the one holding the result inherits the object,
    not the memory. In the child, :meth:`release` and the child's exit give
    nothing back (the parent still owns the grant and the memory) and warn
    nothing; on the host backend the child may read its copy of ``frame``.

    Parameters
    ----------
    frame : DeviceFrame
        The result, owned by the result (the service books its memory).
    diagnostics : Diagnostics
        How it ran; ``rows`` is ``frame.num_rows``.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import pyarrow as pa, pyarrow.parquet as pq
    >>> from nexus_cache.lakehouse import LakehouseCacheConfig
    >>> from nexus_cache.service import QueryService, Scan, ServiceConfig
    >>> tmp = tempfile.TemporaryDirectory()
    >>> root = pathlib.Path(tmp.name)
    >>> edges = pa.table({"src": [1, 2, 3, 3], "dst": [2, 3, 1, 4]})
    >>> pq.write_table(edges, root / "edges.parquet")
    >>> config = ServiceConfig(
    ...     backend="host",
    ...     lakehouse=LakehouseCacheConfig(root=root / "cache"),
    ...     evidence_dir=root / "evidence",
    ... )
    >>> scan = Scan(str(root / "edges.parquet"), filter=[("src", ">", 1)])
    >>> with QueryService(config) as service:
    ...     with service.execute_on_device(scan) as result:
    ...         src = result.frame.column("src").data  # NumPy here, CuPy on CUDA
    ...         table = result.to_arrow()
    ...     released = result.released
    >>> src.tolist(), table.num_rows, released
    ([2, 3, 3], 3, True)
    >>> tmp.cleanup()
    """

    __slots__ = ("__weakref__", "_diagnostics", "_finalizer", "_frame", "_lock")

    def __init__(self, frame: DeviceFrame, diagnostics: Diagnostics) -> None:
        self._frame: DeviceFrame | None = frame
        self._diagnostics = diagnostics
        self._lock = threading.Lock()
        # Safety net: a result dropped unreleased lets its memory go, and says so.
        self._finalizer = weakref.finalize(
            self, _forgotten, frame, diagnostics.query_id, os.getpid()
        )

    def __repr__(self) -> str:
        if self._frame is None:
            return f"DeviceQueryResult(query_id={self._diagnostics.query_id!r}, released)"
        return f"DeviceQueryResult(query_id={self._diagnostics.query_id!r}, {self._frame!r})"

    @property
    def frame(self) -> DeviceFrame:
        """The result's frame; :class:`LifecycleError` once released."""
        frame = self._frame
        if frame is None:
            raise LifecycleError(
                f"the device result of query {self._diagnostics.query_id} was released; "
                "read its frame (or to_arrow()) before release()"
            )
        return frame

    @property
    def diagnostics(self) -> Diagnostics:
        return self._diagnostics

    @property
    def released(self) -> bool:
        """True once :meth:`release` ran (or the finalizer did)."""
        return self._frame is None

    def to_arrow(self) -> pa.Table:
        """A host copy of the result as a ``pyarrow.Table`` (shares no buffer with it).

        Returns
        -------
        pyarrow.Table
            The rows and columns :meth:`QueryService.execute` returns for the query.

        Examples
        --------
        >>> from nexus_cache.backends import HostBackend
        >>> from nexus_cache.frames import DeviceFrame
        >>> from nexus_cache.service.result import Diagnostics
        >>> domain = HostBackend(device_total_bytes=1 << 20).create_domain(0)
        >>> frame = DeviceFrame.from_arrow(pa.table({"x": [1, 2]}), domain=domain)
        >>> result = DeviceQueryResult(frame, Diagnostics("q", {}, 0, (), {}, {}, {}, {}, 2, ""))
        >>> result.to_arrow().to_pydict()
        {'x': [1, 2]}
        >>> result.release()
        """
        from nexus_cache.service._source_port import host_copy

        frame = self.frame
        table = frame.to_arrow()
        # on the host backend to_arrow wraps the frame's own arrays: copy them out
        return host_copy(table) if frame.domain.host_memory else table

    def release(self) -> None:
        """Give the frame up; the grant and the memory go back once no frame derived
        from it is left. Idempotent.

        Examples
        --------
        >>> from nexus_cache.backends import HostBackend
        >>> from nexus_cache.frames import DeviceFrame
        >>> from nexus_cache.service.result import Diagnostics
        >>> domain = HostBackend(device_total_bytes=1 << 20).create_domain(0)
        >>> frame = DeviceFrame.from_arrow(pa.table({"x": [1, 2]}), domain=domain)
        >>> result = DeviceQueryResult(frame, Diagnostics("q", {}, 0, (), {}, {}, {}, {}, 2, ""))
        >>> result.release(); result.release(); result.released
        True
        """
        with self._lock:
            frame, self._frame = self._frame, None
            self._finalizer.detach()
        if frame is not None:
            frame.release()

    def __reduce__(self) -> Any:
        raise TypeError(
            f"the device result of query {self._diagnostics.query_id} holds device memory "
            "and cannot be pickled or copied; pickle result.to_arrow() and "
            "result.diagnostics instead"
        )

    def __enter__(self) -> DeviceQueryResult:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _forgotten(frame: DeviceFrame, query_id: str, pid: int) -> None:
    """The finalizer of a result dropped unreleased: warn, then release it. In a
    process forked from the one that got the result (its exit runs the finalizers
    it inherited), nothing: the result is the parent's."""
    if os.getpid() != pid:
        return
    warnings.warn(
        f"the device result of query {query_id} was dropped without release(); its "
        "memory was booked until now. Call result.release() or use it in a with block",
        ResourceWarning,
        stacklevel=1,
    )
    frame.release()
