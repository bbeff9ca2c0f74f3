"""Cold and warm results are compared with tables_match: exact except for float ulps."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from nexus_cache.service import tables_match


def _table(values, ids=(1, 2, 3)):
    return pa.table({"vertex": pa.array(ids, pa.int64()), "score": pa.array(values)})


def test_identical_tables_match():
    t = _table(np.array([0.25, 0.5, 0.25], np.float32))
    assert tables_match(t, t)


def test_float_ulps_match_but_real_differences_do_not():
    base = np.array([0.25, 0.5, 0.25], np.float32)
    assert tables_match(_table(base), _table(np.nextafter(base, np.float32(1))))
    assert not tables_match(_table(base), _table(base * np.float32(1.01)))


def test_integer_columns_and_nulls_must_be_identical():
    f = np.array([0.1, 0.2, 0.3])
    assert not tables_match(_table(f), _table(f, ids=(1, 2, 4)))
    with_null = pa.table({"vertex": [1, 2, 3], "score": pa.array([0.1, None, 0.3])})
    without = pa.table({"vertex": [1, 2, 3], "score": pa.array([0.1, 0.2, 0.3])})
    assert not tables_match(with_null, without)
    assert not tables_match(without, without.rename_columns(["vertex", "other"]))
    assert not tables_match(without, without.slice(0, 2))
