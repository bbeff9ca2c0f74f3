"""The one registry of device backends and domain allocators: names and what each is.

Every package outside ``backends/`` asks this module (or a backend or
domain built from it) instead of spelling a backend name or testing for
CuPy: the service's config validation, the CLI's ``--backend`` choices and
help, the docs tables (a test compares them with :data:`BACKENDS`).

Imports only the standard library, so the CLI can build its parser from it
without loading NumPy or CuPy. Immutable data: thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass

from nexus_cache._env import Variable
from nexus_cache.errors import ConfigError

__all__ = [
    "ALLOCATORS",
    "ALLOCATOR_NAMES",
    "ALLOCATOR_VARIABLE",
    "AUTO",
    "BACKENDS",
    "BACKEND_NAMES",
    "BACKEND_VARIABLE",
    "CUDA",
    "ENV_DEVICE_ALLOCATOR",
    "ENV_DEVICE_BACKEND",
    "HOST",
    "HOST_COUNT_VARIABLE",
    "HOST_TOTAL_VARIABLE",
    "VARIABLES",
    "AllocatorKind",
    "BackendKind",
    "backend_help",
    "backend_kind",
]

#: the setting value that picks the first backend (or allocator) that works
AUTO = "auto"


@dataclass(frozen=True)
class AllocatorKind:
    """One way a backend builds its allocation domains (``NEXUS_DEVICE_ALLOCATOR``)."""

    name: str
    summary: str


@dataclass(frozen=True)
class BackendKind:
    """What one device backend is, as the rest of the package needs to know it.

    ``host_memory``: its arrays live in host memory (NumPy), so a host buffer
    reaches a domain by a plain copy and a host result may be read in place
    (no pinned staging, no copy stream, no device synchronization).
    ``cuda_kernels``: its queries run the package's CUDA kernels, which the
    warm-up compiles and loads. ``allocators``: the domain allocators it can
    be built with, in the order ``auto`` tries them (none: it has one).
    """

    name: str
    #: what messages call its devices ("CUDA device 0", "host device 0")
    label: str
    summary: str
    host_memory: bool
    cuda_kernels: bool
    allocators: tuple[AllocatorKind, ...] = ()


RMM = AllocatorKind("rmm", "an RMM pool under a limiting and a statistics adaptor")
CUPY_POOL = AllocatorKind("cupy", "a dedicated CuPy memory pool")

CUDA = BackendKind(
    "cuda",
    "CUDA",
    "CuPy arrays on the visible CUDA GPUs",
    host_memory=False,
    cuda_kernels=True,
    allocators=(RMM, CUPY_POOL),
)
HOST = BackendKind(
    "host",
    "host",
    "NumPy arrays on simulated devices (no GPU needed)",
    host_memory=True,
    cuda_kernels=False,
)

#: every backend, in the order ``auto`` tries them
BACKENDS: tuple[BackendKind, ...] = (CUDA, HOST)
#: every allocator any backend accepts, in the order ``auto`` tries them
ALLOCATORS: tuple[AllocatorKind, ...] = tuple(
    dict.fromkeys(a for kind in BACKENDS for a in kind.allocators)
)
#: what ``NEXUS_DEVICE_BACKEND`` and every ``backend`` argument accept
BACKEND_NAMES: tuple[str, ...] = (AUTO, *(kind.name for kind in BACKENDS))
#: what ``NEXUS_DEVICE_ALLOCATOR`` and ``CudaBackend(allocator=...)`` accept
ALLOCATOR_NAMES: tuple[str, ...] = (AUTO, *(a.name for a in ALLOCATORS))

BACKEND_VARIABLE = Variable(
    "NEXUS_DEVICE_BACKEND",
    "enum",
    "`auto` uses CUDA when CuPy imports and sees a GPU, else the host (NumPy) backend.",
    default=AUTO,
    choices=BACKEND_NAMES,
)
ALLOCATOR_VARIABLE = Variable(
    "NEXUS_DEVICE_ALLOCATOR",
    "enum",
    "Allocation domains of the `cuda` backend",
    default=AUTO,
    choices=ALLOCATOR_NAMES,
)
#: more simulated devices than any real host has GPUs is a typo, not a test
_MAX_HOST_DEVICES = 64
HOST_TOTAL_VARIABLE = Variable(
    "NEXUS_HOST_DEVICE_TOTAL_BYTES",
    "size",
    "Memory of each simulated device of the host backend.",
    default="16GiB",
)
HOST_COUNT_VARIABLE = Variable(
    "NEXUS_HOST_DEVICE_COUNT",
    "int",
    "Simulated devices of the host backend",
    default="1",
    minimum=1,
    maximum=_MAX_HOST_DEVICES,
)
#: the variables the backends read
VARIABLES = (BACKEND_VARIABLE, HOST_TOTAL_VARIABLE, HOST_COUNT_VARIABLE, ALLOCATOR_VARIABLE)
ENV_DEVICE_BACKEND = BACKEND_VARIABLE.name
ENV_DEVICE_ALLOCATOR = ALLOCATOR_VARIABLE.name


def backend_kind(name: str) -> BackendKind:
    """The registered backend called ``name`` (not ``auto``: a built backend
    knows which one it is). Raises :class:`ConfigError` for any other name."""
    for kind in BACKENDS:
        if kind.name == name:
            return kind
    accepted = ", ".join(kind.name for kind in BACKENDS)
    raise ConfigError(f"backend name {name!r} is not a device backend; accepted: {accepted}")


def backend_help() -> str:
    """One line naming every choice, for a ``--backend`` option's help."""
    first = ", else ".join(kind.name for kind in BACKENDS)
    kinds = "; ".join(f"{kind.name}: {kind.summary}" for kind in BACKENDS)
    return f"{AUTO}: the first that works ({first}); {kinds}"
