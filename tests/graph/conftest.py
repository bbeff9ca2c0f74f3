"""Every graph test runs on both host engines: the Numba kernels and plain NumPy."""

from __future__ import annotations

import importlib.util

import pytest

from nexus_cache.graph._host_engine import ENV_HOST_ENGINE

HAVE_NUMBA = importlib.util.find_spec("numba") is not None


@pytest.fixture(
    autouse=True,
    params=[
        pytest.param(
            "numba", marks=pytest.mark.skipif(not HAVE_NUMBA, reason="needs numba (host extra)")
        ),
        "numpy",
    ],
)
def host_engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The host engine this test runs on (``NEXUS_GRAPH_HOST_ENGINE``)."""
    monkeypatch.setenv(ENV_HOST_ENGINE, request.param)
    return str(request.param)
