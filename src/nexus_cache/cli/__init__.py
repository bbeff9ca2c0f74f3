"""The ``nexus-cache`` command line."""

__all__: list[str] = []
