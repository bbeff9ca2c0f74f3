"""Shared builders for the service tests: a small lake and a host-backend service."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from nexus_cache.backends import HostBackend
from nexus_cache.lakehouse import LakehouseCacheConfig
from nexus_cache.service import QueryService, ServiceConfig
from nexus_cache.service.datagen import fact_table, rmat_edges, write_parquet

MIB = 1 << 20


@dataclass(frozen=True)
class Lake:
    root: Path
    edges: str
    facts: str
    bfs_source: int


def age_files(root: Path) -> None:
    """Every file under ``root`` a minute old: older than the lakehouse's
    local_min_age_s, so its identity is provable (and a commit file's is its stat)."""
    past = time.time() - 60
    for path in root.rglob("*"):
        if path.is_file():
            os.utime(path, (past, past))


def write_year_month_hive(
    root: Path, table_for: Callable[[int], pa.Table], row_group_size: int
) -> Path:
    """``root/year=Y/month=M/part-0.parquet`` for years 2024-2025 and months 1-3
    (two int partition levels, six objects): the n-th object (n = 1..6) holds
    ``table_for(n)``; every file aged (see :func:`age_files`). Returns ``root``."""
    n = 0
    for year in (2024, 2025):
        for month in (1, 2, 3):
            part = root / f"year={year}" / f"month={month}"
            part.mkdir(parents=True)
            n += 1
            pq.write_table(table_for(n), part / "part-0.parquet", row_group_size=row_group_size)
    age_files(root)
    return root


def sql_catalog(warehouse: Path) -> Any:
    """A pyiceberg SQL catalog on SQLite in ``warehouse`` (made here), with the
    namespace ``ns``; the test is skipped without pyiceberg and SQLAlchemy."""
    import pytest

    pytest.importorskip("pyiceberg")
    pytest.importorskip("sqlalchemy")
    from pyiceberg.catalog import load_catalog

    warehouse.mkdir()
    catalog = load_catalog(
        "t", type="sql", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=warehouse.as_uri()
    )
    catalog.create_namespace("ns")
    return catalog


def make_lake(root: Path, scale: int = 8, fact_rows: int = 4000) -> Lake:
    """An R-MAT edge table and a fact table, each a multi-row-group Parquet file."""
    lake = root / "lake"
    lake.mkdir(parents=True, exist_ok=True)
    edges = rmat_edges(scale)
    write_parquet(edges, lake / "edges.parquet", row_groups=4)
    write_parquet(fact_table(fact_rows), lake / "facts.parquet", row_groups=4)
    # complete files, older than the lakehouse's local_min_age_s: identity provable
    past = time.time() - 60
    for name in ("edges.parquet", "facts.parquet"):
        os.utime(lake / name, (past, past))
    return Lake(
        lake,
        str(lake / "edges.parquet"),
        str(lake / "facts.parquet"),
        int(edges["src"][0].as_py()),
    )


def make_config(root: Path, **overrides: Any) -> ServiceConfig:
    """Host backend, a fill_before_read lakehouse root and an evidence directory."""
    settings: dict[str, Any] = {
        "backend": "host",
        "cache_cap_bytes": 64 * MIB,
        "evidence_dir": root / "evidence",
        "lakehouse": LakehouseCacheConfig(
            root=root / "cache",
            policy="fill_before_read",
            max_bytes="1GiB",
            local_min_age_s=0.0,
        ),
    }
    settings.update(overrides)
    return ServiceConfig(**settings)


def use_host_cli(monkeypatch: Any) -> None:
    """Point the commands at a 1 GiB simulated host device, with no service
    configuration file or evidence directory from the environment."""
    monkeypatch.setenv("NEXUS_DEVICE_BACKEND", "host")
    monkeypatch.setenv("NEXUS_HOST_DEVICE_TOTAL_BYTES", str(1 << 30))
    for name in ("NEXUS_SERVICE_CONFIG", "NEXUS_SERVICE_EVIDENCE_DIR"):
        monkeypatch.delenv(name, raising=False)


def make_service(root: Path, *, total: int = 1 << 30, **kwargs: Any) -> QueryService:
    """A service on a simulated host device of ``total`` bytes."""
    on_planned = kwargs.pop("on_planned", None)
    return QueryService(
        make_config(root, **kwargs),
        backend=HostBackend(device_total_bytes=total),
        on_planned=on_planned,
    )
