"""The environment variables of Parquet decode (read through :mod:`nexus_cache._env`)."""

from __future__ import annotations

from nexus_cache._env import Variable

__all__ = [
    "DECODE_ENGINE",
    "DECODE_THREADS",
    "DECODE_WINDOW_BYTES",
    "ENGINES",
    "MAX_DECODE_THREADS",
    "VARIABLES",
]

#: the most decoder threads a setting may ask for
MAX_DECODE_THREADS = 256
#: what ``NEXUS_DECODE_ENGINE`` and ``engine=`` accept
ENGINES = ("auto", "host", "gpu")

DECODE_THREADS = Variable(
    "NEXUS_DECODE_THREADS",
    "int",
    "Threads that decode a file's column chunks",
    unset="the CPUs the process may use, at most 16",
    minimum=1,
    maximum=MAX_DECODE_THREADS,
)
DECODE_ENGINE = Variable(
    "NEXUS_DECODE_ENGINE",
    "enum",
    "Which decoder takes each Parquet column",
    default="host",  # auto waits for the warm-up to cover the GPU decode (see frames.md)
    choices=ENGINES,
)
DECODE_WINDOW_BYTES = Variable(
    "NEXUS_DECODE_WINDOW_BYTES",
    "size",
    "Decoded bytes the decoder threads may hold at once, per read",
    unset="64 MiB a decoder thread, at most 1 GiB",
)
#: the variables the frames package reads
VARIABLES = (DECODE_THREADS, DECODE_ENGINE, DECODE_WINDOW_BYTES)
