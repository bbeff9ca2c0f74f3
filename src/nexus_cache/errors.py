"""One exception hierarchy for nexus-cache.

Every class is rooted in a stdlib type as well as :class:`NexusCacheError`, so
callers that already catch ``ValueError`` or ``OSError`` keep working, and
callers that want only our failures can catch ``NexusCacheError``.

Messages say what to change, with the offending value and the accepted values.
"""

from __future__ import annotations

__all__ = [
    "AdmissionClosedError",
    "AdmissionError",
    "AttemptCancelledError",
    "BackendUnavailableError",
    "ByteCountError",
    "CacheCapExceededError",
    "CacheClosedError",
    "CacheIntegrityError",
    "CacheSecurityError",
    "CacheUnavailableError",
    "CapacityError",
    "CommandError",
    "ConfigError",
    "EmptyProgramError",
    "EvidenceWriteError",
    "FillError",
    "GrantExhaustedError",
    "GrantTooLargeError",
    "FrameTypeError",
    "GraphConvergenceError",
    "GraphInputError",
    "LifecycleError",
    "LockUsageError",
    "ManagedCapacityExceededError",
    "NexusCacheError",
    "NoCacheError",
    "NoLocalFileError",
    "ProgramCacheKeyError",
    "QueryCancelledError",
    "ServerAuthError",
    "ServerError",
    "ServerTimeoutError",
    "ServerUnavailableError",
    "SourceDecodeError",
    "SourceFormatError",
    "SourceWaitTimeoutError",
    "StalePlanError",
    "UnsafeTeardownError",
]


class NexusCacheError(Exception):
    """Base of every error nexus-cache raises on purpose."""


class ConfigError(NexusCacheError, ValueError):
    """A setting (argument or environment variable) has a value we cannot use."""


class ProgramCacheKeyError(NexusCacheError, ValueError):
    """A program cache key cannot be derived safely from the compile inputs."""


class EmptyProgramError(NexusCacheError, ValueError):
    """A program cache was asked to store a binary of 0 bytes; nothing was stored.

    A compile that produced nothing (``ltoir`` without link-time optimization)
    is not a program: cached, it would be listed as an entry and loaded as one.
    """


class CacheSecurityError(NexusCacheError, PermissionError):
    """A cache root or entry is a symlink, or owned by another user."""


class CacheIntegrityError(NexusCacheError, OSError):
    """Stored bytes no longer match the digest or identity they were stored with."""


class CacheUnavailableError(NexusCacheError, ConnectionError):
    """A shared cache's server (Redis) did not answer an administrative call."""


class StalePlanError(NexusCacheError, RuntimeError):
    """A planned cache hit no longer holds at execution time (entry or remote changed)."""


class EvidenceWriteError(NexusCacheError, OSError):
    """The admission log or an evidence document cannot be written (disk full, the
    path became a directory or a FIFO); the message names the path."""


class FillError(NexusCacheError, OSError):
    """A cache fill failed (disk full, quota, validation); the read can go remote."""


class NoLocalFileError(NexusCacheError, AttributeError, ValueError):
    """A lakehouse read served from its store has no local file to name
    (``fsspec.open_local`` of a ``nexus::`` URL the cache does not hold).

    An ``AttributeError`` because it is raised by a file's ``name``
    (``getattr(f, "name", None)`` stays ``None``), a ``ValueError`` as
    fsspec's own refusals in ``open_local`` are.
    """


class BackendUnavailableError(NexusCacheError, ImportError):
    """An optional backend (CuPy, cuda.core, s3fs, ...) was asked for but is missing."""


class CapacityError(NexusCacheError, MemoryError):
    """A device-memory request does not fit; the message carries the numbers."""


class CacheCapExceededError(CapacityError):
    """A cache charge would exceed the device's ``cache_cap_bytes``."""


class ManagedCapacityExceededError(CapacityError):
    """A grant or cache charge would exceed the free managed capacity of a device."""


class LifecycleError(NexusCacheError, RuntimeError):
    """Misuse of the residency lifecycle (double release, pin after destroy, ...)."""


class AdmissionClosedError(NexusCacheError, RuntimeError):
    """Admission on a device is closed because a teardown could not be proven safe."""


class UnsafeTeardownError(NexusCacheError, RuntimeError):
    """Device memory could not be proven idle and free; its charge is kept, admission closed."""


class AdmissionError(CapacityError):
    """An attempt's grant did not fit within the bounded admission wait; the
    message names the request, the managed capacity, the grants, the cache
    bytes and how long it waited."""


class GrantTooLargeError(AdmissionError):
    """A grant larger than its device can ever free (its managed capacity less what
    stays resident): no wait would admit it, so it fails at once. A size to change,
    not a failure to retry (exit status 2 on the command line)."""


class GrantExhaustedError(CapacityError):
    """An attempt needed more device memory than its immutable grant; the query
    service retries it as a new attempt with a larger grant.

    ``needed_bytes`` is what the attempt had materialized when it went past its
    grant (the next attempt asks for at least twice that); 0 when unknown (an
    error rebuilt from a server's message).
    """

    def __init__(self, message: str, *, needed_bytes: int = 0) -> None:
        super().__init__(message)
        self.needed_bytes = needed_bytes


class ByteCountError(NexusCacheError, ValueError):
    """A byte count passed at run time (``nbytes``, ``measured_bytes``) is not an int >= 0."""


class FrameTypeError(NexusCacheError, TypeError):
    """An Arrow type (or a column's size) that a device frame cannot hold."""


class GraphInputError(NexusCacheError, ValueError):
    """Edges, vertices or pairs handed to a graph algorithm cannot be used as given."""


class GraphConvergenceError(NexusCacheError, RuntimeError):
    """An iterative graph algorithm did not converge and the caller asked for an error."""


class AttemptCancelledError(NexusCacheError, RuntimeError):
    """The query attempt was cancelled. A decode leader that stops for it hands
    leadership to a waiting follower instead of failing the followers."""


class QueryCancelledError(AttemptCancelledError):
    """The caller cancelled the query (its cancel event was set, or its server
    client went away). Whatever the query held (a place in the admission queue,
    its grant, source and graph pins) was released; nothing half-made was kept
    in a cache. Not retried."""


class SourceDecodeError(NexusCacheError, RuntimeError):
    """The decode leader of a source frame failed deterministically; every follower
    of that key gets this error, chained to the leader's (``__cause__``)."""


class SourceWaitTimeoutError(NexusCacheError, TimeoutError):
    """A follower's own deadline passed while it waited for a decode leader."""


class CacheClosedError(NexusCacheError, ValueError):
    """An operation on a cache object (or a server client) after its ``close()``;
    open a new one."""


class LockUsageError(NexusCacheError, RuntimeError):
    """Misuse of a file lock: acquiring it twice from one thread, or releasing it unheld."""


class SourceFormatError(NexusCacheError, ValueError):
    """A source object is not readable Parquet (another format, or a corrupt file)."""


class CommandError(NexusCacheError, RuntimeError):
    """A ``nexus-cache`` command failure the user can fix; printed as one line.

    ``exit_code`` is the command's exit status (default 2, a usage error).
    """

    def __init__(self, message: str, *, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class NoCacheError(CommandError):
    """No cache at the location a ``nexus-cache`` command was pointed at (exit status 2)."""


class ServerError(NexusCacheError, RuntimeError):
    """A query server failed a call for a reason the client cannot name more precisely."""


class ServerUnavailableError(ServerError, ConnectionError):
    """The query server cannot be reached (not running, wrong URL, shutting down)."""


class ServerTimeoutError(ServerError, TimeoutError):
    """A call to the query server ran past its ``timeout`` (gRPC's deadline): the
    server may be running and busy; the call, and its query, were given up."""


class ServerAuthError(ServerError, PermissionError):
    """The query server refused the call's credentials (no token, or the wrong one)."""
