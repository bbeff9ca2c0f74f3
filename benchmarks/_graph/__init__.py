"""The pieces of ``benchmarks/graph.py``: :mod:`.peers`, the host side by side
with NetworKit and igraph."""
