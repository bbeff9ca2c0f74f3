"""The host backend's domain passes the allocation-domain contract."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nexus_cache.backends import DeviceBackend, HostBackend

from ._domain_contract import CONTRACT


@pytest.mark.parametrize("check", CONTRACT, ids=lambda c: c.__name__)
def test_host_domain_contract(check: Callable[[DeviceBackend], None]) -> None:
    check(HostBackend(device_total_bytes=1 << 20))
