"""Lakehouse tables: snapshots, filters and pruning, read the way table engines do.

A table's snapshot (:func:`resolve_table`) lists the immutable data files of
one version of a Parquet directory (Hive partitions included), a Delta table
or an Iceberg table. A filter in pyarrow's ``filters`` convention is checked
and made canonical against its schema (:func:`canonical_filter`), prunes
files and row groups (:func:`plan_scan`), and runs as a mask on NumPy or
CuPy arrays (:func:`filter_mask`). :func:`read_table` is the host reference
reader built on them. The package knows nothing of devices or the query
service; ``deltalake`` and ``pyiceberg`` load only when a table of theirs is
resolved, and every name loads its module on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nexus_cache._lazy import lazy_exports

if TYPE_CHECKING:  # the real types for the type checker; loaded lazily at run time
    from nexus_cache.tables._hive import hidden_path as hidden_path
    from nexus_cache.tables.filters import OPS as OPS
    from nexus_cache.tables.filters import Predicate as Predicate
    from nexus_cache.tables.filters import TableFilter as TableFilter
    from nexus_cache.tables.filters import canonical_filter as canonical_filter
    from nexus_cache.tables.filters import parse_filter_arg as parse_filter_arg
    from nexus_cache.tables.mask import HostColumn as HostColumn
    from nexus_cache.tables.mask import MaskColumn as MaskColumn
    from nexus_cache.tables.mask import filter_mask as filter_mask
    from nexus_cache.tables.mask import host_columns as host_columns
    from nexus_cache.tables.pruning import PlannedFile as PlannedFile
    from nexus_cache.tables.pruning import ScanPlan as ScanPlan
    from nexus_cache.tables.pruning import plan_scan as plan_scan
    from nexus_cache.tables.pruning import prune_files as prune_files
    from nexus_cache.tables.pruning import prune_row_groups as prune_row_groups
    from nexus_cache.tables.read import read_table as read_table
    from nexus_cache.tables.read import read_table_with_plan as read_table_with_plan
    from nexus_cache.tables.snapshot import CATALOG_SCHEME as CATALOG_SCHEME
    from nexus_cache.tables.snapshot import TABLE_KINDS as TABLE_KINDS
    from nexus_cache.tables.snapshot import DataFile as DataFile
    from nexus_cache.tables.snapshot import TableSnapshot as TableSnapshot
    from nexus_cache.tables.snapshot import catalog_source as catalog_source
    from nexus_cache.tables.snapshot import resolve_table as resolve_table

__all__ = [
    "CATALOG_SCHEME",
    "OPS",
    "TABLE_KINDS",
    "DataFile",
    "HostColumn",
    "MaskColumn",
    "PlannedFile",
    "Predicate",
    "ScanPlan",
    "TableFilter",
    "TableSnapshot",
    "canonical_filter",
    "catalog_source",
    "filter_mask",
    "hidden_path",
    "host_columns",
    "parse_filter_arg",
    "plan_scan",
    "prune_files",
    "prune_row_groups",
    "read_table",
    "read_table_with_plan",
    "resolve_table",
]

# public name -> module that defines it (the names above, imported on first access)
_EXPORTS: dict[str, str] = {
    "CATALOG_SCHEME": "nexus_cache.tables.snapshot",
    "OPS": "nexus_cache.tables.filters",
    "TABLE_KINDS": "nexus_cache.tables.snapshot",
    "DataFile": "nexus_cache.tables.snapshot",
    "HostColumn": "nexus_cache.tables.mask",
    "MaskColumn": "nexus_cache.tables.mask",
    "PlannedFile": "nexus_cache.tables.pruning",
    "Predicate": "nexus_cache.tables.filters",
    "ScanPlan": "nexus_cache.tables.pruning",
    "TableFilter": "nexus_cache.tables.filters",
    "TableSnapshot": "nexus_cache.tables.snapshot",
    "canonical_filter": "nexus_cache.tables.filters",
    "catalog_source": "nexus_cache.tables.snapshot",
    "filter_mask": "nexus_cache.tables.mask",
    "hidden_path": "nexus_cache.tables._hive",
    "host_columns": "nexus_cache.tables.mask",
    "parse_filter_arg": "nexus_cache.tables.filters",
    "plan_scan": "nexus_cache.tables.pruning",
    "prune_files": "nexus_cache.tables.pruning",
    "prune_row_groups": "nexus_cache.tables.pruning",
    "read_table": "nexus_cache.tables.read",
    "read_table_with_plan": "nexus_cache.tables.read",
    "resolve_table": "nexus_cache.tables.snapshot",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
