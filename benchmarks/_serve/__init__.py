"""The pieces of ``benchmarks/serve.py``: :mod:`.procs` (the server and client
processes) and :mod:`.soak` (the soak)."""
