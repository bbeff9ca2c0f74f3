"""The ``nexus-cache`` command line.

One module per command group (``program``, ``lakehouse``, ``device``, ...),
each exposing ``register(subparsers)``; :mod:`nexus_cache.cli.main` lists
them. Build new commands from :mod:`nexus_cache.cli._output` (tables or
``--json``, progress bars, one-line errors, the exit-code rule), and import
only public names of the library: ``tests/test_structure.py``
fails on an underscored module or name of another package.
"""

__all__: list[str] = []
