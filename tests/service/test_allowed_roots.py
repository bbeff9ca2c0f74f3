"""``ServiceConfig.allowed_roots``: the service checks every object a source
expands to, whichever front end asked (here: in process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nexus_cache.errors import ConfigError
from nexus_cache.service import ServiceConfig

from ._helpers import make_lake, make_service


def test_every_listed_object_must_lie_under_a_root(tmp_path: Path) -> None:
    lake = make_lake(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.parquet").write_bytes(Path(lake.facts).read_bytes())
    folder = lake.root / "dir"
    folder.mkdir()
    (folder / "innocent.parquet").symlink_to(outside / "secret.parquet")
    with make_service(tmp_path, allowed_roots=[str(lake.root)]) as service:
        assert service.config.allowed_roots == (str(lake.root),)
        assert service.execute({"type": "count", "source": lake.facts}).table.num_rows == 1
        for query in (
            {"type": "scan", "source": str(folder)},
            {"type": "count", "source": f"file://{folder}"},
            {
                "type": "graph",
                "edges": {"type": "scan", "source": str(folder)},
                "src": "order_id",
                "dst": "amount",
                "algorithm": "degree",
            },
        ):
            with pytest.raises(ConfigError, match=r"innocent\.parquet' \(listed in source"):
                service.execute(query)
            with pytest.raises(ConfigError, match=r"secret\.parquet'"):
                service.plan(query)
        with pytest.raises(ConfigError, match="outside allowed_roots"):
            service.execute({"type": "scan", "source": str(outside)})
    # without the setting, the same directory is read (what the server must not do)
    with make_service(tmp_path / "open") as service:
        assert service.execute({"type": "count", "source": str(folder)}).table.num_rows == 1


def test_allowed_roots_are_validated() -> None:
    for bad in ("/data", [""], [1], ["/a\x00"]):
        with pytest.raises(ConfigError, match="allowed_roots="):
            ServiceConfig(backend="host", allowed_roots=bad)
