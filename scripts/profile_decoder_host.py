"""The host side of one ``engine="gpu"`` read, measured on a machine without a GPU.

Runs the page decoder's orchestration (page headers, heap layout, the pinned
staging's fill plan and copies, the merge of a column's chunks, the decode
steps' page tables and launches) for one read of each file of
``benchmarks/cold_read.py`` (numbers-and-strings, dictionary-heavy), with the
device replaced by stand-ins that cost (almost) nothing: every kernel and
nvCOMP call is a no-op (all rows valid), a device array is a NumPy array,
a copy to the device is dropped. So what it times is the Python the real
GPU run executes too, per stage and per page:

    python scripts/profile_decoder_host.py --size-mib 256 [--profile]

Stages: ``plan`` (``plan_page_columns``: footer, page headers, support
check), ``pack`` (heap layout), ``fill`` (the staging's fill plan and
copies), ``sections`` (each page's sections and chunk plans), ``merge``,
``decode`` (``decode_all``'s host side). ``--profile`` adds cProfile's top
functions.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import mmap
import pstats
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_ROOT / "benchmarks"))

from _workdir import workdir  # noqa: E402

#: seconds spent in the stand-ins of device work (array operations), which
#: the real run queues on the device: taken out of the stages' host time
_DEVICE = [0.0]
_DEPTH = [0]


@contextlib.contextmanager
def _on_device() -> Iterator[None]:
    """Count the time inside as device work (once, however nested)."""
    _DEPTH[0] += 1
    started = time.perf_counter()
    try:
        yield
    finally:
        _DEPTH[0] -= 1
        if not _DEPTH[0]:
            _DEVICE[0] += time.perf_counter() - started


class _Array(np.ndarray):
    """A NumPy array standing for a device array: CuPy's ``get`` and ``data.ptr``;
    its element-wise operations and conversions timed as device work."""

    def get(self) -> np.ndarray:
        return np.asarray(self)

    def astype(self, *a: Any, **k: Any) -> Any:
        with _on_device():
            return super().astype(*a, **k)

    def __setitem__(self, key: Any, value: Any) -> None:
        with _on_device():
            super().__setitem__(key, value)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, np.ndarray):  # a gather
            with _on_device():
                return super().__getitem__(key)
        return super().__getitem__(key)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        with _on_device():
            args = [np.asarray(x) if isinstance(x, _Array) else x for x in inputs]
            out = kwargs.get("out")
            if out:
                kwargs["out"] = tuple(np.asarray(x) for x in out)
            got = getattr(ufunc, method)(*args, **kwargs)
            return got.view(_Array) if isinstance(got, np.ndarray) else got

    @property  # type: ignore[misc]
    def data(self) -> Any:
        return SimpleNamespace(ptr=self.ctypes.data)


def _device(fn: Callable[..., Any]) -> Callable[..., _Array]:
    def run(*a: Any, **k: Any) -> _Array:
        with _on_device():
            return np.asarray(fn(*a, **k)).view(_Array)

    return run


def _fake_cupy() -> Any:
    event = SimpleNamespace(record=lambda *a: None, synchronize=lambda: None)
    stream = SimpleNamespace(synchronize=lambda: None, ptr=0)
    return SimpleNamespace(
        zeros=_device(np.zeros),
        ones=_device(np.ones),
        asarray=_device(np.asarray),
        arange=_device(np.arange),
        cumsum=_device(np.cumsum),
        concatenate=_device(np.concatenate),
        cuda=SimpleNamespace(
            get_current_stream=lambda: stream,
            Event=lambda **k: event,
            runtime=SimpleNamespace(memcpyAsync=lambda *a: None, memcpyHostToDevice=1),
        ),
    )


class _Stream(contextlib.nullcontext):  # type: ignore[type-arg]
    ptr = 0

    def synchronize(self) -> None:
        pass


class _Domain:
    host_memory = False
    limit_bytes = None

    def __init__(self, cp: Any) -> None:
        self.xp = cp

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        yield

    def empty(self, n: int, dtype: Any) -> Any:
        return self.xp.zeros(n, dtype)


def _kernel(name: str, element_bytes: int | None = None) -> Callable[..., None]:
    def launch(grid: Any, block: Any, args: tuple[Any, ...]) -> None:
        if name == "levels_validity":  # every row valid
            args[2][...] = 1

    return launch


def _transfer(cp: Any, domain: Any) -> Any:
    """A ``_CudaTransfer`` over NumPy slots (its fill plan and copies real, the
    copies to the device dropped)."""
    from nexus_cache.frames.staging import DEFAULT_SLOT_BYTES, DEFAULT_SLOTS, _CudaTransfer

    buffers = [np.zeros(DEFAULT_SLOT_BYTES, np.uint8) for _ in range(DEFAULT_SLOTS)]
    staging = SimpleNamespace(
        cupy=cp,
        slot_bytes=DEFAULT_SLOT_BYTES,
        buffers=buffers,
        pointers=[int(b.ctypes.data) for b in buffers],
        events=[cp.cuda.Event() for _ in buffers],
        stream=_Stream(),
        release=lambda: None,
    )
    return _CudaTransfer(domain, staging, False)  # type: ignore[arg-type]


_STAGES = {
    "plan": ("nexus_cache.frames._page_engine", "plan_page_columns"),
    "pack": ("nexus_cache.frames.gpudecode.layout", "HeapLayout.add", "HeapLayout.finish"),
    "fill": ("nexus_cache.frames.staging", "_CudaTransfer.pieces_to_device"),
    "sections": (
        "nexus_cache.frames.gpudecode._heap",
        "HeapPages.of",
        "HeapPages.level_offsets",
        "HeapPages.sections",
        "_Chunk.all",
    ),
    "merge": ("nexus_cache.frames.gpudecode._heap", "_Heap.merge"),
    "decode": ("nexus_cache.frames.gpudecode._steps", "decode_all"),
}


@contextlib.contextmanager
def _timed_stages(seconds: dict[str, float]) -> Iterator[None]:
    """Add each stage's wall time to ``seconds`` while inside."""
    import importlib

    saved = []
    for stage, (module_name, *names) in _STAGES.items():
        module = importlib.import_module(module_name)
        for name in names:
            owner: Any = module
            *outer, attr = name.split(".")
            for o in outer:
                owner = getattr(owner, o)
            inner = getattr(owner, attr)
            saved.append((owner, attr, inner))

            def timed(*a: Any, _inner: Any = inner, _stage: str = stage, **k: Any) -> Any:
                started, device = time.perf_counter(), _DEVICE[0]
                try:
                    return _inner(*a, **k)
                finally:
                    seconds[_stage] += time.perf_counter() - started - (_DEVICE[0] - device)

            setattr(owner, attr, timed)
    # decode_page_columns imports plan_page_columns' module, decode_all is
    # imported by name into device.py
    from nexus_cache.frames.gpudecode import device

    saved.append((device, "decode_all", device.decode_all))
    device.decode_all = sys.modules["nexus_cache.frames.gpudecode._steps"].decode_all
    try:
        yield
    finally:
        for owner, attr, inner in reversed(saved):
            setattr(owner, attr, inner)


def _install() -> Any:
    cp = _fake_cupy()
    sys.modules["cupy"] = cp  # type: ignore[assignment]
    from nexus_cache.frames.gpudecode import _heap, nvcomp

    _heap.kernel_function = _kernel  # type: ignore[assignment]
    _heap.decompress_batch = lambda *a, **k: None  # type: ignore[assignment]
    _heap.device_algorithm = nvcomp.CODEC_ALGORITHMS.get  # type: ignore[assignment]
    return cp


def _read(path: Path, cp: Any, seconds: dict[str, float] | None) -> int:
    """One host-side read of ``path``; its page count."""
    import pyarrow.parquet as pq

    from nexus_cache.frames import _page_engine

    domain = _Domain(cp)
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        pf = pq.ParquetFile(path)
        groups = list(range(pf.num_row_groups))
        schema = pf.schema_arrow
        buffer = memoryview(m)
        try:
            with _timed_stages(seconds) if seconds is not None else contextlib.nullcontext():
                plan = _page_engine.plan_page_columns(
                    "gpu", domain, pf, buffer, groups, schema, str(path)
                )
                transfer = _transfer(cp, domain)
                _page_engine.decode_page_columns(plan, schema, domain, transfer=transfer)
            pages = sum(len(p) for chunks in plan.gpu.values() for _, _, p in chunks)
            del plan
        finally:
            buffer.release()
    return pages


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mib", type=int, default=256)
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--profile", action="store_true", help="add cProfile's top functions")
    args = p.parse_args()
    with workdir(args.workdir, "nexus-prof-host-") as work:
        return _profile(args, work)


def _profile(args: argparse.Namespace, work: Path) -> int:
    from cold_read import make_dictionary_heavy
    from source_cache import MIB, make_parquet

    files = [
        ("mixed", work / "mixed.parquet", make_parquet, args.size_mib),
        ("dict", work / "dict.parquet", make_dictionary_heavy, args.size_mib // 10),
    ]
    cp = _install()
    for label, path, make, mib in files:
        make(path, max(mib, 1) * MIB, 2_000_000)
        _read(path, cp, None)  # warm: imports, page cache
        best: dict[str, float] | None = None
        for _ in range(args.repeats):
            seconds: dict[str, float] = defaultdict(float)
            started, device = time.perf_counter(), _DEVICE[0]
            pages = _read(path, cp, seconds)
            seconds["device"] = _DEVICE[0] - device
            seconds["total"] = time.perf_counter() - started - seconds["device"]
            if best is None or seconds["total"] < best["total"]:
                best = dict(seconds)
        assert best is not None
        best["other"] = best["total"] - sum(best[k] for k in _STAGES)
        size = path.stat().st_size / 1e9
        print(
            f"{label}: {size:.2f} GB on disk, {pages} pages; host side of one read "
            f"{best['total']:.3f} s = {best['total'] / pages * 1e6:.1f} us a page (best of "
            f"{args.repeats}; device stand-ins {best['device']:.3f} s left out)"
        )
        for stage in (*_STAGES, "other"):
            print(f"  {stage:<8} {best[stage]:.4f} s  {best[stage] / pages * 1e6:7.2f} us a page")
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            _read(path, cp, None)
            prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
            print(text.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
