"""The pieces of ``benchmarks/lakehouse.py``, one concern per module.

* :mod:`.data`: the Parquet objects measured (one file, or a dataset of many), and
  dropping them from the OS page cache;
* :mod:`.s3`: moto's S3 server in a process of its own, and request counters;
* :mod:`.peers`: the remotes, our cache, and fsspec's ``simplecache::`` /
  ``filecache::`` built on the same remote;
* :mod:`.measure`: interleaved timing, medians and ratio rows;
* :mod:`.workloads`: the single-object figures (warm, cold, calibration);
* :mod:`.datasets`: the dataset figures (pyarrow.dataset, DuckDB glob, pandas);
* :mod:`.concurrency`: many spawned processes reading one uncached object;
* :mod:`.report`: the summary table and the run's context lines.
"""

__all__: list[str] = []
